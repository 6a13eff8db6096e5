package policy_test

import (
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/physd/physd/internal/testpki"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/policy"
)

func parseIdentity(t *testing.T, identity string) (*policy.Policy, error) {
	t.Helper()
	m, err := manifest.Parse("m.yml", []byte(man))
	if err != nil {
		t.Fatal(err)
	}
	return policy.Parse("p.yml", []byte("physmcp_policy_version: \"0.1\"\nidentity:\n"+identity), m)
}

func leaf(t *testing.T, ca *testpki.CA, s testpki.Spec) []*x509.Certificate {
	t.Helper()
	s.Client = true
	l, err := ca.Issue(s)
	if err != nil {
		t.Fatal(err)
	}
	return []*x509.Certificate{l.Cert, ca.Cert}
}

func TestMTLSRoleMapping(t *testing.T) {
	ca, err := testpki.NewCA("site CA")
	if err != nil {
		t.Fatal(err)
	}
	other, err := testpki.NewCA("other CA")
	if err != nil {
		t.Fatal(err)
	}
	caPath := filepath.Join(t.TempDir(), "ca.pem")
	if err := ca.WriteFile(caPath); err != nil {
		t.Fatal(err)
	}
	p, err := parseIdentity(t, `  providers:
    - type: mtls
      ca_cert_path: `+caPath+`
      clients:
        - {cn: ops-console, role: operator}
        - {san: scada.plant.example, role: viewer}
        - {san: "spiffe://plant/supervisor", role: supervisor}
        - {san: 10.1.2.3, role: admin}
        - {san: alice@plant.example, role: operator}
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		spec   testpki.Spec
		id     string
		role   string
		issuer *testpki.CA
	}{
		{"subject CN", testpki.Spec{CN: "ops-console"}, "cert:ops-console", "operator", ca},
		{"DNS SAN, any case", testpki.Spec{CN: "x", DNS: []string{"SCADA.plant.example"}}, "cert:scada.plant.example", "viewer", ca},
		{"URI SAN", testpki.Spec{CN: "x", URIs: []string{"spiffe://plant/supervisor"}}, "cert:spiffe://plant/supervisor", "supervisor", ca},
		{"IP SAN", testpki.Spec{CN: "x", IPs: []net.IP{net.ParseIP("10.1.2.3")}}, "cert:10.1.2.3", "admin", ca},
		{"email SAN", testpki.Spec{CN: "x", Emails: []string{"alice@plant.example"}}, "cert:alice@plant.example", "operator", ca},
		{"unmapped name", testpki.Spec{CN: "intruder", DNS: []string{"evil.example"}}, "", "", ca},
		{"a CN is not a SAN", testpki.Spec{CN: "scada.plant.example"}, "", "", ca},
		// ca_cert_path narrows the provider: the same name from another CA
		// (one the listener might also trust) gets no role.
		{"mapped name from another CA", testpki.Spec{CN: "ops-console"}, "", "", other},
	} {
		pr, err := p.Identity.AuthenticateCert(leaf(t, c.issuer, c.spec))
		if c.role == "" {
			if !errors.Is(err, policy.ErrUnmappedCert) {
				t.Errorf("%s: got %+v, %v; want ErrUnmappedCert", c.name, pr, err)
			} else if !strings.Contains(err.Error(), c.spec.CN) {
				t.Errorf("%s: the error should name the certificate: %v", c.name, err)
			}
			continue
		}
		if err != nil || pr.ID != c.id || pr.Role != c.role {
			t.Errorf("%s: got %+v, %v; want %s as %s", c.name, pr, err, c.id, c.role)
		}
	}
	if !p.Identity.Configured() {
		t.Error("an mtls provider alone must count as configured identities")
	}
	b, _ := p.MarshalJSON()
	if !strings.Contains(string(b), `"type":"mtls"`) || !strings.Contains(string(b), `"cn":"ops-console"`) {
		t.Errorf("physmcp://policy must list the certificate mappings: %s", b)
	}
}

func TestMTLSProviderErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "notpem")
	os.WriteFile(bad, []byte("hello"), 0o600)
	_, err := parseIdentity(t, `  providers:
    - {type: mtls}
    - type: mtls
      ca_cert_path: `+bad+`
      clients:
        - {cn: a, san: b, role: operator}
        - {role: operator}
        - {cn: c, role: root}
        - {cn: d, role: operator, colour: blue}
        - {san: E.example, role: viewer}
        - {san: e.example, role: admin}
    - {type: kerberos}
`)
	if err == nil {
		t.Fatal("bad mtls providers accepted")
	}
	msg := err.Error()
	for _, want := range []string{
		"p.yml:4:", "identity.providers[0].clients: required",
		"identity.providers[1].ca_cert_path", "no PEM certificate",
		"providers[1].clients[0]: one of cn or san", "providers[1].clients[1]: one of cn or san",
		`unknown role "root"`, "colour", "duplicate entry", `unknown provider type "kerberos"`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("errors lack %q:\n%s", want, msg)
		}
	}
}

func TestViewerRole(t *testing.T) {
	if !(policy.RoleLevel("none") < policy.RoleLevel("viewer") && policy.RoleLevel("viewer") < policy.RoleLevel("operator")) {
		t.Fatalf("viewer must rank between none and operator: %v", policy.Roles)
	}
	p, err := parseIdentity(t, "  tokens: [{id: wall, sha256: "+policy.TokenHash("wall-display-token")+", role: viewer}]\n")
	if err != nil {
		t.Fatal(err)
	}
	if pr, err := p.Identity.Authenticate("wall-display-token"); err != nil || pr.Role != "viewer" {
		t.Errorf("viewer token: %+v %v", pr, err)
	}
	m, _ := manifest.Parse("m.yml", []byte(man))
	_, err = policy.Parse("p.yml", []byte("physmcp_policy_version: \"0.1\"\nemergency: {override_permission: viewer}\n"), m)
	if err == nil || !strings.Contains(err.Error(), "an override must need a role") {
		t.Errorf("a viewer must not be able to lift time windows: %v", err)
	}
}
