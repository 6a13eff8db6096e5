package policy

import (
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/physd/physd/strictyaml"
)

// identity: bearer tokens, JWT and mTLS providers, and people.

type rawIdentity struct {
	Tokens    []yaml.Node `yaml:"tokens"`
	Providers []yaml.Node `yaml:"providers"`
	People    []yaml.Node `yaml:"people"`
	OAuth     *yaml.Node  `yaml:"oauth"`
}

type rawPerson struct {
	Name   string      `yaml:"name"`
	Tokens []string    `yaml:"tokens"`
	Certs  []string    `yaml:"certs"`
	JWT    []rawJWTSub `yaml:"jwt"`
}

type rawJWTSub struct {
	Issuer  string `yaml:"issuer"`
	Subject string `yaml:"subject"`
}

type rawToken struct {
	ID     string `yaml:"id"`
	SHA256 string `yaml:"sha256"`
	Role   string `yaml:"role"`
}

type rawProvider struct {
	Type               string `yaml:"type"`
	Issuer             string `yaml:"issuer"`
	Audience           string `yaml:"audience"`
	RoleClaim          string `yaml:"role_claim"`
	HS256SecretEnv     string `yaml:"hs256_secret_env"`
	HS256SecretFile    string `yaml:"hs256_secret_file"`
	RS256PublicKeyFile string `yaml:"rs256_public_key_file"`
	CACertPath         string `yaml:"ca_cert_path"`
}

var hexRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

func (p *parser) identity(id *rawIdentity, pol *Policy) {
	if id == nil {
		return
	}
	p.tokens(id.Tokens, pol)
	for i, n := range id.Providers {
		field := fmt.Sprintf("identity.providers[%d]", i)
		if providerType(&n) == "mtls" {
			p.mtlsProvider(&n, field, pol)
			continue
		}
		p.jwtProvider(&n, field, pol)
	}
	p.oauth(id.OAuth, pol)
	p.people(id.People, pol)
}

// tokens reads identity.tokens: the SHA-256 of each bearer token, its
// holder and role.
func (p *parser) tokens(nodes []yaml.Node, pol *Policy) {
	seen := map[string]bool{}
	for i, n := range nodes {
		field := fmt.Sprintf("identity.tokens[%d]", i)
		var t rawToken
		if !p.Decode(&n, field, &t) {
			continue
		}
		if t.ID == "" {
			p.Addf(&n, field+".id", "name the holder, e.g. id: operator_console", "required")
		}
		if !hexRE.MatchString(t.SHA256) {
			p.Addf(&n, field+".sha256", `store the token's SHA-256 in lower-case hex: printf %s "$TOKEN" | sha256sum`, "must be 64 hex characters (never the token itself)")
			continue
		}
		if seen[t.SHA256] {
			p.Addf(&n, field+".sha256", "give each holder its own token", "duplicate token")
		}
		seen[t.SHA256] = true
		if !p.role(&n, field+".role", t.Role) {
			continue
		}
		var sum [32]byte
		b, _ := hex.DecodeString(t.SHA256)
		copy(sum[:], b)
		pol.Identity.Tokens = append(pol.Identity.Tokens, Token{ID: t.ID, SHA256: sum, Role: t.Role})
	}
}

// jwtProvider reads an identity.providers entry of type jwt: issuer,
// audience, the role claim and exactly one key source.
func (p *parser) jwtProvider(n *yaml.Node, field string, pol *Policy) {
	var r rawProvider
	if !p.Decode(n, field, &r) {
		return
	}
	if r.Type != "jwt" {
		fix := "use jwt or mtls"
		if strings.Contains(strings.ToLower(r.Type), "oauth") || strings.Contains(strings.ToLower(r.Type), "oidc") {
			fix = "use jwt or mtls; OAuth 2.1 authorization servers are configured under identity.oauth (docs/policy.md#oauth)"
		}
		p.Addf(n, field+".type", fix, "unknown provider type %q", r.Type)
		return
	}
	j := JWTProvider{Issuer: r.Issuer, Audience: r.Audience, RoleClaim: r.RoleClaim}
	if j.RoleClaim == "" {
		j.RoleClaim = "role"
	}
	if r.Issuer == "" || r.Audience == "" {
		p.Addf(n, field, "set issuer and audience: tokens from anyone else are refused", "issuer and audience are required")
	}
	keys := 0
	if r.HS256SecretEnv != "" {
		keys++
		j.HS256Key = []byte(os.Getenv(r.HS256SecretEnv))
		if len(j.HS256Key) < 32 {
			p.Addf(n, field+".hs256_secret_env", "export at least 32 random bytes in "+r.HS256SecretEnv, "the HS256 secret is missing or shorter than 32 bytes")
		}
	}
	if r.HS256SecretFile != "" {
		keys++
		b, err := os.ReadFile(r.HS256SecretFile)
		j.HS256Key = []byte(strings.TrimSpace(string(b)))
		if err != nil || len(j.HS256Key) < 32 {
			p.Addf(n, field+".hs256_secret_file", "a file with at least 32 random bytes", "cannot use %s: %v", r.HS256SecretFile, errOr(err, "shorter than 32 bytes"))
		}
	}
	if r.RS256PublicKeyFile != "" {
		keys++
		k, err := readRSAPublicKey(r.RS256PublicKeyFile)
		if err != nil {
			p.Addf(n, field+".rs256_public_key_file", "a PEM RSA public key (PKIX or PKCS#1)", "%v", err)
		}
		j.RS256Key = k
	}
	if keys != 1 {
		p.Addf(n, field, "set exactly one of hs256_secret_env, hs256_secret_file, rs256_public_key_file", "%d key sources given", keys)
	}
	pol.Identity.JWT = append(pol.Identity.JWT, j)
}

// people reads identity.people: the credentials that are one person's, so
// that the two-person rule never lets that person approve their own call
// with another of them. Every credential must be one this policy knows,
// and belongs to at most one person.
func (p *parser) people(nodes []yaml.Node, pol *Policy) {
	owner := map[string]string{}
	names := map[string]bool{}
	for i, n := range nodes {
		field := fmt.Sprintf("identity.people[%d]", i)
		var r rawPerson
		if !p.Decode(&n, field, &r) {
			continue
		}
		// item is the node of the j-th entry of key (for its position).
		item := func(key string, j int) *yaml.Node {
			if v := strictyaml.ValueOf(&n, key); v != nil && j < len(v.Content) {
				return v.Content[j]
			}
			return &n
		}
		if r.Name == "" {
			p.Addf(&n, field+".name", "name the person, e.g. name: alice", "required")
			continue
		}
		if names[r.Name] {
			p.Addf(strictyaml.ValueOf(&n, "name"), field+".name", "list each person once, with all their credentials", "duplicate person %q", r.Name)
		}
		names[r.Name] = true
		person := Person{Name: r.Name}
		claim := func(cred, f string, at *yaml.Node) {
			if o, taken := owner[cred]; taken && o != r.Name {
				p.Addf(at, f, "a credential is one person's: remove it from one of them", "%s is already listed under %q", cred, o)
				return
			}
			owner[cred] = r.Name
			person.Credentials = append(person.Credentials, cred)
		}
		for j, t := range r.Tokens {
			f := fmt.Sprintf("%s.tokens[%d]", field, j)
			at := item("tokens", j)
			if !slices.ContainsFunc(pol.Identity.Tokens, func(k Token) bool { return k.ID == t }) {
				p.Addf(at, f, "name the id of an identity.tokens entry", "no identity.tokens entry has id %q", t)
				continue
			}
			claim(TokenCredential(t), f, at)
		}
		for j, c := range r.Certs {
			f := fmt.Sprintf("%s.certs[%d]", field, j)
			at := item("certs", j)
			switch fp, isFP := strings.CutPrefix(c, "sha256:"); {
			case isFP && hexRE.MatchString(strings.ToLower(fp)):
				claim(CertFingerprintCredential(strings.ToLower(fp)), f, at)
			case isFP:
				p.Addf(at, f, "write the leaf certificate's SHA-256 as sha256:<64 hex>: openssl x509 -noout -fingerprint -sha256 -in cert.pem", "%q is not a SHA-256 fingerprint", c)
			case c == "":
				p.Addf(at, f, "name a certificate: the cn or san of an mtls rule, or sha256:<fingerprint>", "empty")
			default:
				if !pol.Identity.certNamed(c) {
					p.Addf(at, f, "name the cn or san of a clients entry of an mtls provider, or give the certificate as sha256:<fingerprint>", "no mtls rule maps %q", c)
					continue
				}
				claim(CertCredential(c), f, at)
			}
		}
		for j, s := range r.JWT {
			f := fmt.Sprintf("%s.jwt[%d]", field, j)
			at := item("jwt", j)
			if s.Issuer == "" || s.Subject == "" {
				p.Addf(at, f, "give both: {issuer: https://idp.example, subject: alice}", "issuer and subject are required")
				continue
			}
			if !slices.ContainsFunc(pol.Identity.JWT, func(j JWTProvider) bool { return j.Issuer == s.Issuer }) && !pol.Identity.OAuth.issuer(s.Issuer) {
				p.Addf(strictyaml.ValueOf(at, "issuer"), f+".issuer", "name the issuer of an identity.providers entry of type jwt or of an identity.oauth authorization server", "no jwt provider or OAuth authorization server has issuer %q", s.Issuer)
				continue
			}
			claim(JWTCredential(s.Issuer, s.Subject), f, at)
		}
		pol.Identity.People = append(pol.Identity.People, person)
	}
}

func errOr(err error, s string) any {
	if err != nil {
		return err
	}
	return s
}

func readRSAPublicKey(path string) (*rsa.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("%s holds no PEM block", path)
	}
	if k, err := x509.ParsePKIXPublicKey(blk.Bytes); err == nil {
		if rk, ok := k.(*rsa.PublicKey); ok {
			return rk, nil
		}
		return nil, fmt.Errorf("%s is not an RSA key", path)
	}
	return x509.ParsePKCS1PublicKey(blk.Bytes)
}

// TokenHash is how identity.tokens stores a token.
func TokenHash(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:])
}

// ---- identity.providers entries of type mtls ------------------------------

type rawMTLSProvider struct {
	Type       string      `yaml:"type"`
	CACertPath string      `yaml:"ca_cert_path"`
	Clients    []yaml.Node `yaml:"clients"`
}

type rawCertRule struct {
	CN   string `yaml:"cn"`
	SAN  string `yaml:"san"`
	Role string `yaml:"role"`
}

// providerType reads an identity.providers entry's type: before decoding,
// because jwt and mtls entries have different keys.
func providerType(n *yaml.Node) string {
	for _, kv := range strictyaml.Pairs(n) {
		if kv[0].Value == "type" {
			return kv[1].Value
		}
	}
	return ""
}

// mtlsProvider reads {type: mtls, ca_cert_path?, clients: [{cn|san, role}]}:
// which verified client certificates get which role.
func (p *parser) mtlsProvider(n *yaml.Node, field string, pol *Policy) {
	var r rawMTLSProvider
	if !p.Decode(n, field, &r) {
		return
	}
	m := MTLSProvider{CAPath: r.CACertPath}
	if r.CACertPath != "" {
		b, err := os.ReadFile(r.CACertPath)
		m.CA = x509.NewCertPool()
		if err != nil || !m.CA.AppendCertsFromPEM(b) {
			p.Addf(n, field+".ca_cert_path", "a PEM file with the CA certificate(s) whose client certificates this provider maps, or remove the key to accept every CA that --tls-client-ca trusts",
				"cannot use %s: %v", r.CACertPath, errOr(err, "no PEM certificate in it"))
		}
	}
	if len(r.Clients) == 0 {
		p.Addf(n, field+".clients", "list the certificates that get a role, e.g. clients: [{cn: ops-console, role: operator}, {san: scada.plant.example, role: viewer}]", "required")
	}
	seen := map[string]bool{}
	for i, cn := range r.Clients {
		cf := fmt.Sprintf("%s.clients[%d]", field, i)
		var c rawCertRule
		if !p.Decode(&cn, cf, &c) {
			continue
		}
		if (c.CN == "") == (c.SAN == "") {
			p.Addf(&cn, cf, "set exactly one of cn (the subject common name) or san (a DNS, URI, email or IP subject alternative name)", "one of cn or san is required")
			continue
		}
		key := "cn:" + c.CN
		if c.SAN != "" {
			key = "san:" + strings.ToLower(c.SAN)
		}
		if seen[key] {
			p.Addf(&cn, cf, "map each certificate name once", "duplicate entry")
		}
		seen[key] = true
		if p.role(&cn, cf+".role", c.Role) {
			m.Clients = append(m.Clients, CertRule{CN: c.CN, SAN: c.SAN, Role: c.Role})
		}
	}
	pol.Identity.MTLS = append(pol.Identity.MTLS, m)
}
