package policy

import (
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/strictyaml"
)

// Load reads and validates a policy against the manifest it guards.
func Load(path string, m *manifest.Manifest) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data, m)
}

type rawPolicy struct {
	Version      *string       `yaml:"physmcp_policy_version"`
	Defaults     *rawDefaults  `yaml:"defaults"`
	Capabilities *yaml.Node    `yaml:"capabilities"`
	TimeWindows  *yaml.Node    `yaml:"time_windows"`
	Identity     *rawIdentity  `yaml:"identity"`
	Emergency    *rawEmergency `yaml:"emergency"`
	Gate         *yaml.Node    `yaml:"gate"`
}

type rawDefaults struct {
	RequirePermission *string  `yaml:"require_permission"`
	RateLimit         *string  `yaml:"rate_limit"`
	AuditAll          *bool    `yaml:"audit_all"`
	MaxChangePercent  *float64 `yaml:"max_change_percent"`
}

type rawWindow struct {
	Days     []string `yaml:"days"`
	Start    string   `yaml:"start"`
	End      string   `yaml:"end"`
	Timezone string   `yaml:"timezone"`
}

type rawIdentity struct {
	Tokens    []yaml.Node `yaml:"tokens"`
	Providers []yaml.Node `yaml:"providers"`
	People    []yaml.Node `yaml:"people"`
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

type rawEmergency struct {
	OverridePermission      *string `yaml:"override_permission"`
	OverrideTokenTTLSeconds *int    `yaml:"override_token_ttl_seconds"`
	AuditAllOverrides       *bool   `yaml:"audit_all_overrides"`
}

type rawCapability struct {
	Rules []yaml.Node `yaml:"rules"`
}

// rawRule holds every key any rule type may use; check() enforces which
// keys belong to which type.
type rawRule struct {
	Type        string   `yaml:"type"`
	AllowDuring []string `yaml:"allow_during"`
	DenyDuring  []string `yaml:"deny_during"`
	Require     []string `yaml:"require"`
	Max         any      `yaml:"max"` // rate string, or range_guard number
	Min         *float64 `yaml:"min"`
	OnViolation string   `yaml:"on_violation"`
	MinPeers    *int     `yaml:"min_peers"`
	OnFailure   string   `yaml:"on_failure"`
	MS          *int     `yaml:"ms"`
	When        string   `yaml:"when"`
	Window      string   `yaml:"window"`
	Above       *float64 `yaml:"above"`
	// approval: who may approve (two-person rule)
	ApproverRole string `yaml:"approver_role"`
	SelfApproval *bool  `yaml:"self_approval"`
}

var ruleKeys = map[string][]string{
	"time_window": {"allow_during", "deny_during"},
	"permission":  {"require"},
	"rate":        {"max"},
	"quorum":      {"min_peers", "on_failure"},
	"range_guard": {"min", "max", "on_violation"},
	"cooldown":    {"ms"},
	"approval":    {"when", "window", "above", "approver_role", "self_approval"},
	"max_change":  {"max"},
}

type parser struct {
	strictyaml.Problems            // every problem, at its node (Addf) or from Decode
	doc                 *yaml.Node // the document, to position errors in sections decoded into structs
	// declared names every time window written in the file, valid or not:
	// a rule naming a window whose own definition is wrong must not add an
	// "unknown time window" error on top of the window's real one.
	declared map[string]bool
	seen     map[string]bool // "tool/rule" of rules a tool may have once
}

// at returns the value node at a path of keys from the document root, or
// the deepest mapping on the way (so an error is never without a line).
func (p *parser) at(keys ...string) *yaml.Node {
	n := p.doc
	for _, k := range keys {
		v := strictyaml.ValueOf(n, k)
		if v == nil {
			return n
		}
		n = v
	}
	return n
}

// addRate reports a manifest.ParseRate error at n, keeping its own fix.
func (p *parser) addRate(n *yaml.Node, field string, err error) {
	msg, fix := err.Error(), `write count/unit, e.g. "6/hour"`
	if pe, ok := err.(interface{ Problem() (string, string) }); ok {
		msg, fix = pe.Problem()
	}
	p.Addf(n, field, fix, "%s", msg)
}

// Parse validates a policy against its manifest. Every problem is reported
// at once with file:line:col; a policy is returned only when there are none.
func Parse(file string, data []byte, m *manifest.Manifest) (*Policy, error) {
	root, errs := strictyaml.ParseDocument(file, data)
	if len(errs) > 0 {
		return nil, errs
	}
	p := &parser{Problems: strictyaml.Problems{File: file}, doc: root, declared: map[string]bool{}, seen: map[string]bool{}}
	var raw rawPolicy
	// Keep going after an unknown top-level key: every problem is reported
	// at once.
	p.Decode(root, "", &raw)
	pol := &Policy{Path: file, Tools: map[string]*ToolPolicy{}, Windows: map[string]*Window{}, Gate: raw.Gate}
	p.version(raw.Version)
	p.defaults(raw.Defaults, pol)
	p.windows(raw.TimeWindows, pol)
	p.emergency(raw.Emergency, pol)
	p.identity(raw.Identity, pol)
	p.capabilities(raw.Capabilities, pol, m)
	if p.Len() > 0 {
		return nil, p.Errs.SortByLine()
	}
	return pol, nil
}

// version checks physmcp_policy_version as strictly as the manifest checks
// physmcp_version: an unquoted 0.1 is a YAML number, not the version text.
func (p *parser) version(v *string) {
	n := strictyaml.ValueOf(p.doc, "physmcp_policy_version")
	switch {
	case n == nil:
		p.Addf(p.doc, "physmcp_policy_version", `add physmcp_policy_version: "0.1" at the top`, "required")
	case n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!float" || n.ShortTag() == "!!int"):
		p.Addf(n, "physmcp_policy_version", `quote the version: physmcp_policy_version: "0.1"`, "the version must be a string, got the number %s", n.Value)
	case v != nil && *v != Version:
		p.Addf(n, "physmcp_policy_version", `set physmcp_policy_version: "0.1" (physd implements PhysMCP v0.1 policies only)`, "unsupported version %q", *v)
	}
}

func (p *parser) role(n *yaml.Node, field, r string) bool {
	if RoleLevel(r) < 0 {
		p.Addf(n, field, manifest.OneOf(r, Roles), "unknown role %q", r)
		return false
	}
	return true
}

func (p *parser) defaults(d *rawDefaults, pol *Policy) {
	pol.Defaults = Defaults{RequirePermission: "none", AuditAll: true}
	if d == nil {
		return
	}
	if d.RequirePermission != nil && p.role(p.at("defaults", "require_permission"), "defaults.require_permission", *d.RequirePermission) {
		pol.Defaults.RequirePermission = *d.RequirePermission
	}
	if d.RateLimit != nil {
		r, err := manifest.ParseRate(*d.RateLimit, "rate_limit")
		if err != nil {
			p.addRate(p.at("defaults", "rate_limit"), "defaults.rate_limit", err)
		}
		pol.Defaults.RateLimit = r
	}
	if d.AuditAll != nil {
		pol.Defaults.AuditAll = *d.AuditAll
	}
	if pc := d.MaxChangePercent; pc != nil {
		if !(*pc > 0 && *pc < 100) {
			p.Addf(p.at("defaults", "max_change_percent"), "defaults.max_change_percent",
				"use a percentage of each capability's range above 0 and below 100, e.g. 25", "%g is out of range", *pc)
		} else {
			pol.Defaults.MaxChangePercent = *pc
		}
	}
}

func (p *parser) windows(n *yaml.Node, pol *Policy) {
	for _, kv := range strictyaml.Pairs(n) {
		name, field := kv[0].Value, "time_windows."+kv[0].Value
		p.declared[name] = true
		var rw rawWindow
		if !p.Decode(kv[1], field, &rw) {
			continue
		}
		// Each problem points at the key at fault, or at the window when
		// the key is missing.
		at := func(key string) *yaml.Node {
			if v := strictyaml.ValueOf(kv[1], key); v != nil {
				return v
			}
			return kv[1]
		}
		w := &Window{Name: name}
		ok := true
		if len(rw.Days) == 0 {
			p.Addf(at("days"), field+".days", "list the days the window starts on, e.g. [mon, tue, wed, thu, fri]", "required")
			ok = false
		}
		for _, d := range rw.Days {
			wd, found := dayNames[strings.ToLower(d)]
			if !found {
				p.Addf(strictyaml.ElemOf(at("days"), d), field+".days", "use mon, tue, wed, thu, fri, sat, sun", "unknown day %q", d)
				ok = false
				continue
			}
			w.Days[wd] = true
		}
		var err error
		if w.StartMin, err = parseClock(rw.Start); err != nil {
			p.Addf(at("start"), field+".start", `write "HH:MM", e.g. "07:00"`, "%v", err)
			ok = false
		}
		if w.EndMin, err = parseClock(rw.End); err != nil {
			p.Addf(at("end"), field+".end", `write "HH:MM", e.g. "19:00"; an end before the start crosses midnight`, "%v", err)
			ok = false
		}
		if ok && w.StartMin == w.EndMin {
			p.Addf(kv[1], field, "give different start and end times (an end before the start crosses midnight)", "the window is empty")
			ok = false
		}
		if rw.Timezone == "" {
			p.Addf(at("timezone"), field+".timezone", "name an IANA zone, e.g. Europe/Berlin or UTC", "required")
			ok = false
		} else if w.Loc, err = time.LoadLocation(rw.Timezone); err != nil {
			p.Addf(at("timezone"), field+".timezone", zoneFix(rw.Timezone), "unknown time zone %q", rw.Timezone)
			ok = false
		}
		if ok {
			pol.Windows[name] = w
		}
	}
}

func (p *parser) emergency(e *rawEmergency, pol *Policy) {
	pol.Emergency = Emergency{OverrideRole: "admin", MaxTTL: 5 * time.Minute, AuditAll: true}
	if e == nil {
		return
	}
	if e.OverridePermission != nil && p.role(p.at("emergency", "override_permission"), "emergency.override_permission", *e.OverridePermission) {
		if RoleLevel(*e.OverridePermission) < RoleLevel("operator") {
			p.Addf(p.at("emergency", "override_permission"), "emergency.override_permission", "use supervisor or admin", "an override must need a role")
		}
		pol.Emergency.OverrideRole = *e.OverridePermission
	}
	if e.OverrideTokenTTLSeconds != nil {
		s := *e.OverrideTokenTTLSeconds
		if s < 1 || s > 24*3600 {
			p.Addf(p.at("emergency", "override_token_ttl_seconds"), "emergency.override_token_ttl_seconds", "use 1 to 86400 seconds", "%d is out of range", s)
		}
		pol.Emergency.MaxTTL = time.Duration(s) * time.Second
	}
	if e.AuditAllOverrides != nil && !*e.AuditAllOverrides {
		p.Addf(p.at("emergency", "audit_all_overrides"), "emergency.audit_all_overrides", "remove the key or set it to true", "physd always audits overrides")
	}
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
		p.Addf(n, field+".type", "use jwt or mtls", "unknown provider type %q", r.Type)
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
			if !slices.ContainsFunc(pol.Identity.JWT, func(j JWTProvider) bool { return j.Issuer == s.Issuer }) {
				p.Addf(strictyaml.ValueOf(at, "issuer"), f+".issuer", "name the issuer of an identity.providers entry of type jwt", "no jwt provider has issuer %q", s.Issuer)
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

func (p *parser) capabilities(n *yaml.Node, pol *Policy, m *manifest.Manifest) {
	// Every do_ tool gets a policy, from the manifest and defaults at least.
	for _, c := range m.Capabilities {
		if c.Kind != manifest.KindDo {
			continue
		}
		tp := &ToolPolicy{Tool: c.ToolName(), Cap: c, MinRole: c.RequiresPermission}
		if RoleLevel(pol.Defaults.RequirePermission) > RoleLevel(tp.MinRole) {
			tp.MinRole = pol.Defaults.RequirePermission
		}
		if c.RateLimit != nil {
			tp.Rates = append(tp.Rates, Rate{c.RateLimit.Count, c.RateLimit.Per, c.RateLimit.Source, "manifest"})
		}
		if r := pol.Defaults.RateLimit; r != nil {
			tp.Rates = append(tp.Rates, Rate{r.Count, r.Per, r.Source, "defaults"})
		}
		tp.Cooldown = time.Duration(c.CooldownMS) * time.Millisecond
		if c.RequiresQuorum {
			tp.Quorum = c.QuorumSize
		}
		if pc := pol.Defaults.MaxChangePercent; pc > 0 && c.Range != nil && numeric(c) {
			tp.MaxChange = &MaxChange{Max: pc / 100 * (c.Range.Max - c.Range.Min), Source: "defaults"}
		}
		pol.Tools[tp.Tool] = tp
	}
	if n != nil && n.Kind != yaml.MappingNode {
		p.Addf(n, "capabilities", "map each do_ tool name to {rules: [...]}", "expected a mapping")
		return
	}
	for _, kv := range strictyaml.Pairs(n) {
		tool, field := kv[0].Value, "capabilities."+kv[0].Value
		tp := pol.Tools[tool]
		if tp == nil {
			fix := "key rules by the full tool name of a do_ capability, e.g. do_" + firstDo(m)
			if c := m.Capability(manifest.CapabilityName(tool)); c != nil && c.Kind == manifest.KindRead {
				fix = "policy guards actuations only; " + tool + " is an observation"
			} else if c := m.Capability(tool); c != nil {
				fix = "use the tool name " + c.ToolName()
			}
			p.Addf(kv[0], field, fix, "unknown tool %q: the manifest has no such do_ capability", tool)
			continue
		}
		var rc rawCapability
		if !p.Decode(kv[1], field, &rc) {
			continue
		}
		for i := range rc.Rules {
			p.rule(&rc.Rules[i], fmt.Sprintf("%s.rules[%d]", field, i), tp, pol)
		}
	}
}

func firstDo(m *manifest.Manifest) string {
	for _, c := range m.Capabilities {
		if c.Kind == manifest.KindDo {
			return c.Name
		}
	}
	return "name"
}

// keysOf lists the keys a mapping node sets.
func keysOf(n *yaml.Node) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	for _, kv := range strictyaml.Pairs(n) {
		out[kv[0].Value] = kv[0]
	}
	return out
}

// rule reads one rule of a tool: its type and keys, then what the type
// says, into tp.
func (p *parser) rule(n *yaml.Node, field string, tp *ToolPolicy, pol *Policy) {
	var r rawRule
	if !p.Decode(n, field, &r) || !p.ruleKeys(n, field, r.Type) {
		return
	}
	switch r.Type {
	case "time_window":
		p.timeWindowRule(n, field, r, tp, pol)
	case "permission":
		p.permissionRule(n, field, r, tp)
	case "rate":
		p.rateRule(n, field, r, tp)
	case "quorum":
		p.quorumRule(n, field, r, tp)
	case "range_guard":
		p.rangeGuard(n, field, r, tp)
	case "max_change":
		p.maxChange(n, field, r, tp)
	case "cooldown":
		p.cooldownRule(n, field, r, tp)
	case "approval":
		p.approvalRule(n, field, r, tp, pol)
	}
}

// ruleKeys checks the rule's type and that every key it sets belongs to
// that type; it reports false for an unknown type.
func (p *parser) ruleKeys(n *yaml.Node, field, typ string) bool {
	allowed, known := ruleKeys[typ]
	if !known {
		types := make([]string, 0, len(ruleKeys))
		for t := range ruleKeys {
			types = append(types, t)
		}
		sort.Strings(types)
		p.Addf(n, field+".type", "use one of "+strings.Join(types, ", "), "unknown rule type %q", typ)
		return false
	}
	for k, kn := range keysOf(n) {
		if k != "type" && !slices.Contains(allowed, k) {
			p.Addf(kn, field+"."+k, "keys of a "+typ+" rule: "+strings.Join(allowed, ", "), "%q does not belong to a %s rule", k, typ)
		}
	}
	return true
}

// window returns the time window a rule names under key, or nil; an
// unknown name is reported, a declared but invalid one has its own error.
func (p *parser) window(n *yaml.Node, field, key, name string, pol *Policy) *Window {
	w := pol.Windows[name]
	if w == nil && !p.declared[name] {
		p.Addf(strictyaml.ElemOf(strictyaml.ValueOf(n, key), name), field+"."+key, "declare it under time_windows:", "unknown time window %q", name)
	}
	return w
}

func (p *parser) timeWindowRule(n *yaml.Node, field string, r rawRule, tp *ToolPolicy, pol *Policy) {
	if len(r.AllowDuring)+len(r.DenyDuring) == 0 {
		p.Addf(n, field, "list window names in allow_during and/or deny_during", "the rule names no window")
	}
	for _, name := range r.AllowDuring {
		if w := p.window(n, field, "allow_during", name, pol); w != nil {
			tp.AllowDuring = append(tp.AllowDuring, w)
		}
	}
	for _, name := range r.DenyDuring {
		if w := p.window(n, field, "deny_during", name, pol); w != nil {
			tp.DenyDuring = append(tp.DenyDuring, w)
		}
	}
}

func (p *parser) permissionRule(n *yaml.Node, field string, r rawRule, tp *ToolPolicy) {
	if len(r.Require) == 0 {
		p.Addf(n, field+".require", "list the roles allowed, e.g. [operator, supervisor]", "required")
	}
	least := ""
	for _, role := range r.Require {
		if p.role(n, field+".require", role) && (least == "" || RoleLevel(role) < RoleLevel(least)) {
			least = role
		}
	}
	// Roles are ordered: naming operator admits supervisors and admins.
	if least != "" && RoleLevel(least) > RoleLevel(tp.MinRole) {
		tp.MinRole = least
	}
}

func (p *parser) rateRule(n *yaml.Node, field string, r rawRule, tp *ToolPolicy) {
	s, ok := r.Max.(string)
	if !ok {
		p.Addf(n, field+".max", `write a rate such as "6/hour"`, "required")
		return
	}
	rl, err := manifest.ParseRate(s, "rate")
	if err != nil {
		p.addRate(strictyaml.ValueOf(n, "max"), field+".max", err)
		return
	}
	tp.Rates = append(tp.Rates, Rate{rl.Count, rl.Per, rl.Source, "policy"})
}

func (p *parser) quorumRule(n *yaml.Node, field string, r rawRule, tp *ToolPolicy) {
	if r.MinPeers == nil || *r.MinPeers < 1 {
		p.Addf(n, field+".min_peers", "set min_peers: 2 or more (self included)", "required and ≥ 1")
		return
	}
	if r.OnFailure != "" && r.OnFailure != "deny" {
		p.Addf(n, field+".on_failure", "use deny (the only safe choice)", "unsupported on_failure %q", r.OnFailure)
	}
	tp.Quorum = max(tp.Quorum, *r.MinPeers)
}

func (p *parser) cooldownRule(n *yaml.Node, field string, r rawRule, tp *ToolPolicy) {
	if r.MS == nil || *r.MS < 1 {
		p.Addf(n, field+".ms", "set ms: the minimum time between actuations, e.g. 30000", "required and > 0")
		return
	}
	tp.Cooldown = max(tp.Cooldown, time.Duration(*r.MS)*time.Millisecond)
}

// approvalRule reads when a human must approve, and who may.
func (p *parser) approvalRule(n *yaml.Node, field string, r rawRule, tp *ToolPolicy, pol *Policy) {
	a := &Approval{When: r.When}
	switch r.When {
	case "always":
	case "outside_window":
		if r.Window == "" {
			p.Addf(n, field+".window", "name the window inside which no approval is needed", "required for when: outside_window")
			return
		}
		if a.Window = p.window(n, field, "window", r.Window, pol); a.Window == nil {
			return
		}
	case "above":
		if r.Above == nil || math.IsNaN(*r.Above) || math.IsInf(*r.Above, 0) {
			p.Addf(n, field+".above", "set the value above which a human must approve", "required for when: above")
			return
		}
		a.Above = *r.Above
		if tp.Cap.Range != nil && a.Above >= tp.Cap.Range.Max {
			p.Addf(n, field+".above", fmt.Sprintf("use a value below the physical maximum %g", tp.Cap.Range.Max), "unreachable rule: no value is above %g", a.Above)
		}
	default:
		p.Addf(n, field+".when", "use always, outside_window or above", "unknown when %q", r.When)
		return
	}
	if !p.approver(n, field, r, a) {
		return
	}
	if tp.Approval != nil {
		p.Addf(n, field, "keep one approval rule per tool", "a second approval rule")
	}
	tp.Approval = a
}

// approver reads who may approve: approver_role names the least role of
// the approver; self_approval (default false with an approver_role, true
// without) says whether the caller may be that approver.
func (p *parser) approver(n *yaml.Node, field string, r rawRule, a *Approval) bool {
	a.SelfApproval = r.ApproverRole == ""
	if r.SelfApproval != nil {
		a.SelfApproval = *r.SelfApproval
	}
	if r.ApproverRole == "" {
		if !a.SelfApproval {
			p.Addf(strictyaml.ValueOf(n, "self_approval"), field+".self_approval", "name who approves instead: approver_role: supervisor", "self_approval: false needs an approver_role")
			return false
		}
		return true
	}
	at := strictyaml.ValueOf(n, "approver_role")
	if !p.role(at, field+".approver_role", r.ApproverRole) {
		return false
	}
	if RoleLevel(r.ApproverRole) < RoleLevel("operator") {
		p.Addf(at, field+".approver_role", "use operator, supervisor or admin", "an approver must hold a role that can act (got %s)", r.ApproverRole)
		return false
	}
	a.ApproverRole = r.ApproverRole
	return true
}

func (p *parser) rangeGuard(n *yaml.Node, field string, r rawRule, tp *ToolPolicy) {
	c := tp.Cap
	if c.DataType != manifest.TypeFloat && c.DataType != manifest.TypeInt {
		p.Addf(n, field, "range guards apply to float and int capabilities", "%s is data_type %s", tp.Tool, c.DataType)
		return
	}
	mx, ok := toFloat(r.Max)
	if r.Min == nil || !ok {
		p.Addf(n, field, "set both min and max", "min and max are required numbers")
		return
	}
	g := &RangeGuard{Min: *r.Min, Max: mx, OnViolation: r.OnViolation}
	switch g.OnViolation {
	case "clamp", "deny", "warn":
	case "":
		p.Addf(n, field+".on_violation", "use clamp, deny or warn", "required")
		return
	default:
		p.Addf(n, field+".on_violation", "use clamp, deny or warn", "unknown on_violation %q", g.OnViolation)
		return
	}
	if g.Min > g.Max {
		p.Addf(n, field, "set min ≤ max", "min (%g) is greater than max (%g)", g.Min, g.Max)
		return
	}
	if pr := c.Range; pr != nil {
		if g.Max < pr.Min || g.Min > pr.Max {
			p.Addf(n, field, fmt.Sprintf("overlap the physical range [%g, %g]", pr.Min, pr.Max), "unreachable rule: [%g, %g] lies outside the capability's range", g.Min, g.Max)
			return
		}
		// A bound beyond the manifest range can never apply (the range is a
		// hard limit) and usually means another unit or another device.
		bad := false
		if g.Min < pr.Min {
			p.Addf(strictyaml.ValueOf(n, "min"), field+".min", fmt.Sprintf("use a min from %g to %g (the manifest range of %s), or correct the manifest range", pr.Min, pr.Max, c.Name), "min %g is below the capability's range [%g, %g]", g.Min, pr.Min, pr.Max)
			bad = true
		}
		if g.Max > pr.Max {
			p.Addf(strictyaml.ValueOf(n, "max"), field+".max", fmt.Sprintf("use a max from %g to %g (the manifest range of %s), or correct the manifest range", pr.Min, pr.Max, c.Name), "max %g is above the capability's range [%g, %g]", g.Max, pr.Min, pr.Max)
			bad = true
		}
		if bad {
			return
		}
	}
	if tp.Range != nil {
		p.Addf(n, field, "keep one range_guard per tool", "a second range_guard")
	}
	tp.Range = g
}

func numeric(c *manifest.Capability) bool {
	return c.DataType == manifest.TypeFloat || c.DataType == manifest.TypeInt
}

// maxChange reads {type: max_change, max: N}: the largest step from the
// device's current value that one actuation may make.
func (p *parser) maxChange(n *yaml.Node, field string, r rawRule, tp *ToolPolicy) {
	c := tp.Cap
	if !numeric(c) {
		p.Addf(n, field, "max_change applies to float and int capabilities; remove the rule", "%s is data_type %s", tp.Tool, c.DataType)
		return
	}
	at := strictyaml.ValueOf(n, "max")
	if at == nil {
		p.Addf(n, field+".max", "set max: the largest step from the current value one actuation may make, e.g. max: 10", "required")
		return
	}
	mx, ok := toFloat(r.Max)
	if !ok || mx <= 0 {
		got := at.Value
		if at.ShortTag() == "!!str" {
			got = fmt.Sprintf("the text %q (write the number without quotes)", at.Value)
		}
		p.Addf(at, field+".max", "a number above 0 in the capability's unit, e.g. max: 10", "must be a positive number, got %s", got)
		return
	}
	if pr := c.Range; pr != nil && mx >= pr.Max-pr.Min {
		p.Addf(at, field+".max", fmt.Sprintf("use a step below %g (the width of the range [%g, %g]), or remove the rule", pr.Max-pr.Min, pr.Min, pr.Max),
			"unreachable rule: no step inside the range is larger than %g", mx)
		return
	}
	if p.seen[tp.Tool+"/max_change"] {
		p.Addf(n, field, "keep one max_change rule per tool", "a second max_change")
		return
	}
	p.seen[tp.Tool+"/max_change"] = true
	// With defaults.max_change_percent too, the stricter step wins.
	if tp.MaxChange == nil || mx < tp.MaxChange.Max {
		tp.MaxChange = &MaxChange{Max: mx, Source: "policy"}
	}
}

func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case float64:
		return x, !math.IsNaN(x) && !math.IsInf(x, 0)
	}
	return 0, false
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
