package policy_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/policy"
)

func jwtPolicy(t *testing.T, provider string) *policy.Policy {
	t.Helper()
	m, err := manifest.Parse("m.yml", []byte(man))
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse("p.yml", []byte("physmcp_policy_version: \"0.1\"\nidentity:\n  providers:\n    - "+provider+"\n"), m)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func sign(t *testing.T, method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func claims(iss, aud, role string, exp time.Duration) jwt.MapClaims {
	return jwt.MapClaims{"iss": iss, "aud": aud, "sub": "alice", "role": role, "exp": time.Now().Add(exp).Unix()}
}

func TestJWTHS256(t *testing.T) {
	secret := strings.Repeat("k", 40)
	t.Setenv("PHYSD_TEST_JWT", secret)
	p := jwtPolicy(t, "{type: jwt, issuer: https://idp.example, audience: physd, hs256_secret_env: PHYSD_TEST_JWT}")
	good := sign(t, jwt.SigningMethodHS256, []byte(secret), claims("https://idp.example", "physd", "supervisor", time.Hour))
	if pr, err := p.Identity.Authenticate(good); err != nil || pr.Role != "supervisor" || pr.ID != "jwt:https://idp.example/alice" {
		t.Errorf("valid token: %+v %v", pr, err)
	}
	for name, tok := range map[string]string{
		"wrong issuer":    sign(t, jwt.SigningMethodHS256, []byte(secret), claims("https://evil", "physd", "admin", time.Hour)),
		"wrong audience":  sign(t, jwt.SigningMethodHS256, []byte(secret), claims("https://idp.example", "other", "admin", time.Hour)),
		"expired":         sign(t, jwt.SigningMethodHS256, []byte(secret), claims("https://idp.example", "physd", "admin", -time.Hour)),
		"wrong key":       sign(t, jwt.SigningMethodHS256, []byte(strings.Repeat("x", 40)), claims("https://idp.example", "physd", "admin", time.Hour)),
		"unknown role":    sign(t, jwt.SigningMethodHS256, []byte(secret), claims("https://idp.example", "physd", "root", time.Hour)),
		"alg none":        sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims("https://idp.example", "physd", "admin", time.Hour)),
		"no subject":      sign(t, jwt.SigningMethodHS256, []byte(secret), jwt.MapClaims{"iss": "https://idp.example", "aud": "physd", "role": "admin", "exp": time.Now().Add(time.Hour).Unix()}),
		"numeric subject": sign(t, jwt.SigningMethodHS256, []byte(secret), jwt.MapClaims{"iss": "https://idp.example", "aud": "physd", "sub": 4711, "role": "admin", "exp": time.Now().Add(time.Hour).Unix()}),
	} {
		if pr, err := p.Identity.Authenticate(tok); err == nil {
			t.Errorf("%s accepted as %+v", name, pr)
		}
	}
}

func TestJWTRS256(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	path := filepath.Join(t.TempDir(), "jwt.pub")
	os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600)
	p := jwtPolicy(t, "{type: jwt, issuer: idp, audience: physd, rs256_public_key_file: "+path+"}")
	if pr, err := p.Identity.Authenticate(sign(t, jwt.SigningMethodRS256, key, claims("idp", "physd", "operator", time.Hour))); err != nil || pr.Role != "operator" {
		t.Errorf("RS256: %+v %v", pr, err)
	}
	// An HS256 token signed with the public key's bytes (the classic
	// algorithm-confusion attack) is refused.
	forged := sign(t, jwt.SigningMethodHS256, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), claims("idp", "physd", "admin", time.Hour))
	if pr, err := p.Identity.Authenticate(forged); err == nil {
		t.Errorf("algorithm confusion accepted as %+v", pr)
	}
}

func rsaKeyFile(t *testing.T) string {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	path := filepath.Join(t.TempDir(), "jwt.pub")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestJWTReportsTheRealReason: with several providers, a token refused by
// the provider whose key signed it reports that provider's reason, not
// the last provider's "signing method HS256 is invalid" (issue 10).
func TestJWTReportsTheRealReason(t *testing.T) {
	secret := strings.Repeat("k", 40)
	t.Setenv("PHYSD_TEST_JWT", secret)
	pub := rsaKeyFile(t)
	p, err := parseIdentity(t, `  providers:
    - {type: jwt, issuer: https://idp.example, audience: physd, hs256_secret_env: PHYSD_TEST_JWT}
    - {type: jwt, issuer: https://sso.example, audience: physd, rs256_public_key_file: `+pub+`}
`)
	if err != nil {
		t.Fatal(err)
	}
	hs := func(c jwt.MapClaims) string { return sign(t, jwt.SigningMethodHS256, []byte(secret), c) }
	for _, c := range []struct {
		name, token, want string
	}{
		{"expired", hs(claims("https://idp.example", "physd", "operator", -time.Hour)), "token is expired"},
		{"wrong audience", hs(claims("https://idp.example", "plc", "operator", time.Hour)), "invalid audience"},
		{"wrong issuer, right key", hs(claims("https://evil.example", "physd", "operator", time.Hour)), "invalid issuer"},
		{"bad signature", sign(t, jwt.SigningMethodHS256, []byte(strings.Repeat("x", 40)), claims("https://idp.example", "physd", "operator", time.Hour)), "signature is invalid"},
		{"not a role", hs(claims("https://idp.example", "physd", "root", time.Hour)), `"root" is not a role`},
		{"unknown issuer", sign(t, jwt.SigningMethodHS256, []byte(strings.Repeat("y", 40)), claims("https://other.example", "physd", "admin", time.Hour)), `issuer "https://other.example" is not trusted`},
		{"not a JWT", "just-a-guess", "not known to this policy"},
	} {
		pr, err := p.Identity.Authenticate(c.token)
		if err == nil {
			t.Errorf("%s: accepted as %+v", c.name, pr)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not say %q", c.name, err, c.want)
		}
		if strings.Contains(err.Error(), "signing method") {
			t.Errorf("%s: reports another provider's algorithm mismatch: %v", c.name, err)
		}
	}
}
