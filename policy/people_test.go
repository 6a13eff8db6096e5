package policy_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/physd/physd/internal/testpki"
	"github.com/physd/physd/policy"
)

const peopleIdentity = `  tokens:
    - {id: alice_op, sha256: 1111111111111111111111111111111111111111111111111111111111111111, role: operator}
    - {id: alice_sup, sha256: 2222222222222222222222222222222222222222222222222222222222222222, role: supervisor}
    - {id: bob, sha256: 3333333333333333333333333333333333333333333333333333333333333333, role: supervisor}
  providers:
    - type: mtls
      clients: [{cn: alice-laptop, role: supervisor}, {cn: bob-laptop, role: supervisor}]
    - {type: jwt, issuer: "https://idp.example", audience: physd, hs256_secret_env: PHYSD_TEST_PEOPLE_SECRET}
`

// TestPeopleJoinCredentials: identity.people makes two credentials that
// share nothing one person; other people stay apart.
func TestPeopleJoinCredentials(t *testing.T) {
	t.Setenv("PHYSD_TEST_PEOPLE_SECRET", strings.Repeat("s", 32))
	fp := strings.Repeat("ab", 32)
	p, err := parseIdentity(t, peopleIdentity+`  people:
    - name: alice
      tokens: [alice_op, alice_sup]
      certs: [alice-laptop, "sha256:`+strings.ToUpper(fp)+`"]
      jwt: [{issuer: "https://idp.example", subject: alice}]
    - {name: bob, tokens: [bob], certs: [bob-laptop]}
`)
	if err != nil {
		t.Fatal(err)
	}
	id := &p.Identity
	same := [][2]string{
		{"token:alice_op", "token:alice_sup"},
		{"token:alice_op", "cert:alice-laptop"},
		{"token:alice_sup", "certfp:" + fp},
		{policy.JWTCredential("https://idp.example", "alice"), "token:alice_op"},
		{"token:bob", "cert:bob-laptop"},
		{"token:carol", "token:carol"}, // a shared credential, listed or not
	}
	for _, c := range same {
		if !id.SamePerson([]string{c[0]}, []string{c[1]}) {
			t.Errorf("%s and %s are one person", c[0], c[1])
		}
	}
	apart := [][2]string{
		{"token:alice_op", "token:bob"},
		{"cert:alice-laptop", "cert:bob-laptop"},
		{policy.JWTCredential("https://idp.example", "bob"), "token:alice_sup"},
		{"token:carol", "token:dave"},
	}
	for _, c := range apart {
		if id.SamePerson([]string{c[0]}, []string{c[1]}) {
			t.Errorf("%s and %s are two people", c[0], c[1])
		}
	}
	if got := id.PeopleOf([]string{"token:bob", "token:alice_op"}); len(got) != 2 {
		t.Errorf("PeopleOf: %v", got)
	}
}

func TestPeopleErrors(t *testing.T) {
	t.Setenv("PHYSD_TEST_PEOPLE_SECRET", strings.Repeat("s", 32))
	_, err := parseIdentity(t, peopleIdentity+`  people:
    - {name: alice, tokens: [alice_op, nobody], certs: [unknown-cn, "sha256:xyz"], jwt: [{issuer: "https://other.example", subject: a}, {issuer: "https://idp.example"}]}
    - {name: bob, tokens: [alice_op]}
    - {tokens: [bob]}
    - {name: bob, colour: blue}
    - {name: alice}
`)
	if err == nil {
		t.Fatal("bad people accepted")
	}
	msg := err.Error()
	for _, want := range []string{
		`identity.people[0].tokens[1]: no identity.tokens entry has id "nobody"`,
		`no mtls rule maps "unknown-cn"`, `"sha256:xyz" is not a SHA-256 fingerprint`,
		`no jwt provider or OAuth authorization server has issuer "https://other.example"`, "issuer and subject are required",
		`token:alice_op is already listed under "alice"`, "identity.people[2].name", `duplicate person "alice"`, "colour",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("errors lack %q:\n%s", want, msg)
		}
	}
	if n := strings.Count(msg, "p.yml:"); n < 9 || !strings.Contains(msg, "p.yml:12:40: identity.people[0].tokens[1]") {
		t.Errorf("want every error positioned, got %d:\n%s", n, msg)
	}
}

// TestCertificateCredentials: a certificate proves its mapped name and its
// fingerprint; CurrentRoleOf takes the least role any re-derivable
// credential still has.
func TestCertificateCredentials(t *testing.T) {
	t.Setenv("PHYSD_TEST_PEOPLE_SECRET", strings.Repeat("s", 32))
	ca, err := testpki.NewCA("site CA")
	if err != nil {
		t.Fatal(err)
	}
	p, err := parseIdentity(t, peopleIdentity)
	if err != nil {
		t.Fatal(err)
	}
	chain := leaf(t, ca, testpki.Spec{CN: "alice-laptop"})
	pr, err := p.Identity.AuthenticateCert(chain)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(chain[0].Raw)
	if len(pr.Credentials) != 2 || pr.Credentials[0] != "cert:alice-laptop" || pr.Credentials[1] != "certfp:"+hex.EncodeToString(sum[:]) {
		t.Errorf("credentials %v", pr.Credentials)
	}
	tok, err := p.Identity.Authenticate("unknown")
	if err == nil {
		t.Errorf("unknown token: %+v", tok)
	}
	for _, c := range []struct {
		creds []string
		role  string
		known bool
	}{
		{[]string{"token:alice_sup", "cert:alice-laptop"}, "supervisor", true},
		{[]string{"token:alice_sup", "token:alice_op"}, "operator", true},
		{[]string{"token:alice_sup", "token:removed"}, "", true},
		{[]string{policy.JWTCredential("https://idp.example", "alice")}, "", false},
		{[]string{policy.JWTCredential("https://gone.example", "alice")}, "", true},
		{[]string{"certfp:" + hex.EncodeToString(sum[:]), "cert:bob-laptop"}, "supervisor", true},
	} {
		if role, known := p.Identity.CurrentRoleOf(c.creds); role != c.role || known != c.known {
			t.Errorf("CurrentRoleOf(%v) = %q %v", c.creds, role, known)
		}
	}
	_ = policy.TokenCredential
}

// TestCredentialNamesAreUnambiguous: no issuer and subject spell another
// pair's credential; a certificate two rules map carries both names.
func TestCredentialNamesAreUnambiguous(t *testing.T) {
	if policy.JWTCredential("https://idp.example/a", "bob") == policy.JWTCredential("https://idp.example", "a/bob") {
		t.Error("issuer/subject collide")
	}
	ca, err := testpki.NewCA("site CA")
	if err != nil {
		t.Fatal(err)
	}
	p, err := parseIdentity(t, `  providers:
    - type: mtls
      clients: [{san: alice.example, role: supervisor}, {cn: alice-cert, role: operator}]
`)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := p.Identity.AuthenticateCert(leaf(t, ca, testpki.Spec{CN: "alice-cert", DNS: []string{"alice.example"}}))
	if err != nil || pr.Role != "supervisor" || len(pr.Credentials) != 3 || pr.Credentials[1] != "cert:alice-cert" {
		t.Errorf("%+v %v", pr, err)
	}
}
