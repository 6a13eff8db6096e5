package e2e

// Two people are the same person when they share any credential (a policy
// token, a JWT issuer and subject, a client certificate) or when
// identity.people lists their credentials under one person: POST
// /approvals/<id> by the requester's person is 403, whatever combination
// of credentials each side presents.

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/internal/testpki"
)

// approveVia posts an approval of id with hc and returns the status and the grant.
func approveVia(t *testing.T, hc *http.Client, base, id string) (int, string) {
	t.Helper()
	resp, err := hc.Post(base+"/approvals/"+id, "application/json", strings.NewReader(`{"decision":"approve"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	json.Unmarshal(b, &m)
	g, _ := m["grant"].(string)
	return resp.StatusCode, g
}

// TestApprovalSelfByCertificate: sup1 holds a supervisor token and a client
// certificate an mtls rule maps to supervisor (cn: sup-cert). Whichever of
// its credentials sup1 requests with, an approval with credentials that
// share one of them is its own: 403, and its repeat never actuates. Another
// supervisor (sup2, no shared credential) approves, and the repeat runs once.
func TestApprovalSelfByCertificate(t *testing.T) {
	t.Parallel()
	pki := newSitePKI(t)
	leaf, err := pki.ca.Issue(testpki.Spec{CN: "sup-cert", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := leaf.TLS()
	if err != nil {
		t.Fatal(err)
	}
	pol := apPolicy(t, t.TempDir(), "  providers:\n    - type: mtls\n      clients:\n        - {cn: sup-cert, role: supervisor}\n")
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol,
		"--tls-cert", pki.certFile, "--tls-key", pki.keyFile, "--tls-client-ca", pki.caFile}})
	base := "https://" + d.addr
	writes := func() uint64 {
		t.Helper()
		code, body := httpsGet(t, pki.client(nil, adminDemoToken), base+"/sim/plant/")
		var s simState
		if err := json.Unmarshal([]byte(body), &s); code != 200 || err != nil {
			t.Fatalf("sim state: %d %v %s", code, err, body)
		}
		return s.writes("zone_c.heater") + s.writes("zone_b.heater")
	}
	connect := func(hc *http.Client) *mcp.ClientSession {
		t.Helper()
		c := mcp.NewClient(&mcp.Implementation{Name: "physd-e2e-tls", Version: "1"},
			&mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{}}, ElicitationHandler: accept})
		cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: hc},
			&mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
		if err != nil {
			t.Fatalf("connect: %v\n%s", err, d.stderr.String())
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	var (
		tokenAndCert = func() *http.Client { return pki.client(&cert, apSup1Token) }
		tokenOnly    = func() *http.Client { return pki.client(nil, apSup1Token) }
		certOnly     = func() *http.Client { return pki.client(&cert, "") }
	)
	cases := []struct {
		name             string
		request, approve func() *http.Client
	}{
		{"a: request with token and certificate, approval with the token", tokenAndCert, tokenOnly},
		{"b: request with the token, approval with token and certificate", tokenOnly, tokenAndCert},
		{"c: request with the certificate, approval with certificate and token", certOnly, tokenAndCert},
	}
	for i, tc := range cases {
		key := "self-cert-" + string(rune('a'+i))
		cs := connect(tc.request())
		id := approvalID(t, structured(t, call(t, cs, "do_heater_zone_c", apArgs(key))))
		before := writes()
		c, _ := approveVia(t, tc.approve(), base, id)
		if c != 403 {
			t.Errorf("%s: sup1 approved its own request: %d, want 403", tc.name, c)
		}
		a := doCall(t, cs, "do_heater_zone_c", apArgs(key))
		if a.Status == "success" {
			t.Errorf("%s: the repeat ran: %s", tc.name, a.raw)
		} else if c != 403 {
			t.Logf("%s: the repeat after the self-approval: status=%q code=%q", tc.name, a.Status, a.Code)
		}
		if w := writes(); w != before {
			t.Errorf("%s: the heaters were written %d times after sup1's own approval, want 0", tc.name, w-before)
		}
	}

	// Control: sup2 (its own token, nothing shared) approves sup1's request.
	cs := connect(tokenAndCert())
	id := approvalID(t, structured(t, call(t, cs, "do_heater_zone_c", apArgs("self-cert-other"))))
	if c, g := approveVia(t, pki.client(nil, apSup2Token), base, id); c != 200 || g == "" {
		t.Fatalf("sup2 approving sup1's request: %d (grant %q)", c, g)
	}
	before := writes()
	if a := doCall(t, cs, "do_heater_zone_c", apArgs("self-cert-other")); a.Status != "success" {
		t.Errorf("the repeat approved by sup2: %s%s", a.raw, a.toolErr)
	}
	if w := writes() - before; w != 1 {
		t.Errorf("the repeat approved by sup2 wrote %d times, want 1", w)
	}
}

// TestApprovalSelfByPeople: identity.people lists alice's operator token
// and her supervisor token under one person. Her supervisor token cannot
// approve what her operator token requested (403, and the repeat never
// actuates); bob's supervisor token can, and the repeat runs once.
func TestApprovalSelfByPeople(t *testing.T) {
	t.Parallel()
	const (
		aliceOp  = "approval-e2e-alice-operator-token"
		aliceSup = "approval-e2e-alice-supervisor-token"
		bobSup   = "approval-e2e-bob-supervisor-token"
	)
	// Indented under identity:, after tokens: (apPolicy's tokens go first).
	people := "  people:\n    - name: alice\n      tokens: [alice_console, alice_supervisor]\n"
	dir := t.TempDir()
	pol := apPolicy(t, dir, people)
	editFile(t, pol, "    - {id: site_admin,", "    - {id: alice_console, sha256: "+sha(aliceOp)+", role: operator}\n"+
		"    - {id: alice_supervisor, sha256: "+sha(aliceSup)+", role: supervisor}\n"+
		"    - {id: bob_supervisor, sha256: "+sha(bobSup)+", role: supervisor}\n    - {id: site_admin,")
	if out, err := exec.Command(physdBin, "validate", "--policy", pol, greenhouse).CombinedOutput(); err != nil {
		t.Fatalf("physd validate refuses a policy with identity.people: %v\n%s", err, out)
	}
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	op := connectAs(t, d, "2026-07-28", aliceOp, accept)
	args := apArgs("people-1")
	id := approvalID(t, structured(t, call(t, op, "do_heater_zone_c", args)))
	if c := decide(t, d, id, aliceSup, `{"decision":"approve"}`); c != 403 {
		t.Errorf("alice's supervisor token approved what her operator token requested: %d, want 403", c)
	}
	if a := doCall(t, op, "do_heater_zone_c", args); a.Status == "success" {
		t.Errorf("the repeat after alice's own approval ran: %s", a.raw)
	}
	if w := d.sim(t).writes("zone_c.heater"); w != 0 {
		t.Fatalf("zone_c.heater written %d times after alice approved herself, want 0", w)
	}
	if c := decide(t, d, id, bobSup, `{"decision":"approve"}`); c != 200 {
		t.Fatalf("bob approving alice's request: %d, want 200", c)
	}
	if a := doCall(t, op, "do_heater_zone_c", args); a.Status != "success" {
		t.Errorf("the repeat approved by bob: %s%s", a.raw, a.toolErr)
	}
	if w := d.sim(t).writes("zone_c.heater"); w != 1 {
		t.Errorf("zone_c.heater written %d times after bob's approval, want 1", w)
	}
}
