package web_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/internal/testpki"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/web"
)

// A property test of the two-person rule over every way a person can
// authenticate on the HTTPS surface: static tokens, a JWT subject, a client
// certificate (mapped by CN or SAN, or unmapped and joined only by its
// fingerprint), and token or JWT together with the certificate. Each world
// is a random population of people (operators and supervisors), its policy
// (tokens, mtls rules, two JWT issuers, identity.people joining every
// credential of a person that has more than one) and a fresh gateway; each
// iteration is one do_heater_zone_c call under
//
//	{type: approval, when: always, approver_role: supervisor, self_approval: false}
//
// asked with a random subset of the requester's credentials and then
// decided:
//
//   - by the requester again, with any subset of their credentials (also
//     ones that share nothing with the asking subset): 403, the request stays
//     pending, repeats and foreign grants never actuate;
//   - by another person without the supervisor role: 403, still pending;
//   - by another supervisor (any subset): 200 with a grant, or a denial;
//   - a grant presented by anybody but the requester never actuates, and
//     does not spend it;
//   - the requester's repeat (same arguments and key, with no requestState
//     or with the grant, with any subset of their own credentials) runs
//     exactly once.
//
// The seed is fixed (principalsDefaultSeed) and logged; set
// PHYSD_PRINCIPALS_SEED to another number, or to "random", to explore.

const (
	principalsSeedEnv     = "PHYSD_PRINCIPALS_SEED"
	principalsDefaultSeed = 20260728
	principalsWorlds      = 4
	principalsIterations  = 45 // per world
	ppJWTAudience         = "physd"
)

// The two JWT issuers of every world, with their HS256 secrets.
var ppIssuers = []struct{ iss, env, secret string }{
	{"https://idp-a.example", "PHYSD_TEST_PRINCIPALS_JWT_A", strings.Repeat("a-secret-", 5)},
	{"https://idp-b.example", "PHYSD_TEST_PRINCIPALS_JWT_B", strings.Repeat("b-secret-", 5)},
}

type ppToken struct{ id, secret string }

type ppCert struct {
	mapped bool   // an mtls rule maps it (else it only opens TLS beside a bearer)
	bySAN  bool   // the rule matches a DNS SAN, not the CN
	name   string // the name the rule matches (mapped only)
	fp     string // lower-case hex SHA-256 of the leaf DER
	listFP bool   // identity.people lists it as sha256:<fp> (else by name)
	cert   tls.Certificate
}

type ppPerson struct {
	name, role string
	tokens     []ppToken
	jwtIssuer  int // index into ppIssuers, -1: no JWT
	jwtSub     string
	jwt        string
	cert       *ppCert
	listed     bool // in identity.people
}

// units is how many separately presentable credentials the person owns.
func (p *ppPerson) units() int {
	n := len(p.tokens)
	if p.jwtIssuer >= 0 {
		n++
	}
	if p.cert != nil {
		n++
	}
	return n
}

// ppPres is one way a person authenticates: at most one bearer (a token
// or the JWT: one Authorization header) and maybe the certificate.
type ppPres struct {
	who    *ppPerson
	bearer int // -1 none; 0..len(tokens)-1 a token; len(tokens) the JWT
	cert   bool
	// certOf, when set, is another person whose certificate this
	// presentation carries beside who's bearer (a chimera: someone holding
	// another's credential).
	certOf *ppPerson
}

// certPerson is the person whose certificate p presents.
func (p ppPres) certPerson() *ppPerson {
	if p.certOf != nil {
		return p.certOf
	}
	return p.who
}

func (p ppPres) isJWT() bool   { return p.bearer == len(p.who.tokens) }
func (p ppPres) isToken() bool { return p.bearer >= 0 && p.bearer < len(p.who.tokens) }

// creds is what identify() must make of this presentation.
func (p ppPres) creds() []string {
	var c []string
	switch {
	case p.isToken():
		c = append(c, policy.TokenCredential(p.who.tokens[p.bearer].id))
	case p.isJWT():
		c = append(c, policy.JWTCredential(ppIssuers[p.who.jwtIssuer].iss, p.who.jwtSub))
	}
	if p.cert {
		if pc := p.certPerson().cert; pc.mapped {
			c = append(c, policy.CertCredential(pc.name))
		}
		c = append(c, policy.CertFingerprintCredential(p.certPerson().cert.fp))
	}
	return c
}

// kind is the presentation's shape: T token, J JWT, C mapped certificate,
// U unmapped certificate.
func (p ppPres) kind() string {
	k := ""
	switch {
	case p.isToken():
		k = "T"
	case p.isJWT():
		k = "J"
	}
	if p.cert {
		if p.certPerson().cert.mapped {
			k += "C"
		} else {
			k += "U"
		}
	}
	return k
}

func (p ppPres) String() string {
	who := p.who.name + "(" + p.who.role + ")"
	if p.certOf != nil {
		who += "+certificate of " + p.certOf.name + "(" + p.certOf.role + ")"
	}
	return who + "[" + strings.Join(p.creds(), " + ") + "]"
}

func (p ppPres) key() string {
	return fmt.Sprintf("%s/%d/%v/%s", p.who.name, p.bearer, p.cert, p.certPerson().name)
}

// presentations lists every valid way the person can authenticate.
func (p *ppPerson) presentations() []ppPres {
	var out []ppPres
	bearers := []int{-1}
	for i := range p.tokens {
		bearers = append(bearers, i)
	}
	if p.jwtIssuer >= 0 {
		bearers = append(bearers, len(p.tokens))
	}
	for _, b := range bearers {
		for _, c := range []bool{false, true} {
			if c && p.cert == nil || b < 0 && !c || b < 0 && !p.cert.mapped {
				continue
			}
			out = append(out, ppPres{who: p, bearer: b, cert: c})
		}
	}
	return out
}

func ppDisjoint(a, b []string) bool {
	for _, c := range a {
		if slices.Contains(b, c) {
			return false
		}
	}
	return true
}

func ppSameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	sort.Strings(a)
	sort.Strings(b)
	return slices.Equal(a, b)
}

// ppWorld is one population, its policy and its gateway.
type ppWorld struct {
	t        *testing.T
	rng      *rand.Rand
	idx      int
	people   []*ppPerson
	ca       *testpki.CA
	s        *surface
	policy   string
	trs      map[string]*http.Transport
	sessions map[string]*mcp.ClientSession
}

var ppNames = []string{"alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"}

// newPPWorld draws a population. Forced: a rich supervisor (two tokens, a
// JWT, a certificate mapped by CN), a rich operator (token, JWT,
// certificate mapped by SAN), a supervisor whose certificate is unmapped
// (joined by its fingerprint only), a supervisor with one credential whom
// identity.people does not list, so that every shape of presentation
// and every way of joining credentials occurs in every world; the rest is
// random.
func newPPWorld(t *testing.T, rng *rand.Rand, idx int) *ppWorld {
	t.Helper()
	w := &ppWorld{t: t, rng: rng, idx: idx, trs: map[string]*http.Transport{}, sessions: map[string]*mcp.ClientSession{}}
	ca, err := testpki.NewCA("principals CA")
	if err != nil {
		t.Fatal(err)
	}
	w.ca = ca
	n := 5 + rng.IntN(4)
	names := slices.Clone(ppNames)
	rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	for i := 0; i < n; i++ {
		p := &ppPerson{name: names[i], jwtIssuer: -1}
		switch i {
		case 0: // rich supervisor
			p.role = "supervisor"
			w.addTokens(p, 2)
			w.addJWT(p)
			w.addCert(p, true, false)
		case 1: // rich operator
			p.role = "operator"
			w.addTokens(p, 1)
			w.addJWT(p)
			w.addCert(p, true, true)
		case 2: // a supervisor whose certificate no rule maps
			p.role = "supervisor"
			w.addTokens(p, 1+rng.IntN(2))
			if rng.IntN(2) == 0 {
				w.addJWT(p)
			}
			w.addCert(p, false, false)
		case 3: // a supervisor with one credential, not in identity.people
			p.role = "supervisor"
			switch rng.IntN(3) {
			case 0:
				w.addTokens(p, 1)
			case 1:
				w.addJWT(p)
			default:
				w.addCert(p, true, rng.IntN(2) == 0)
			}
		default:
			p.role = []string{"operator", "supervisor"}[rng.IntN(2)]
			switch rng.IntN(9) {
			case 0: // one token
				w.addTokens(p, 1)
			case 1: // one JWT subject
				w.addJWT(p)
			case 2: // one certificate, by CN or SAN
				w.addCert(p, true, rng.IntN(2) == 0)
			case 3: // two tokens that share nothing: one person only by identity.people
				w.addTokens(p, 2)
			case 4:
				w.addTokens(p, 1)
				w.addJWT(p)
			case 5:
				w.addJWT(p)
				w.addCert(p, true, rng.IntN(2) == 0)
			case 6:
				w.addTokens(p, 1+rng.IntN(2))
				w.addCert(p, false, false)
			default: // anything
				for p.units() == 0 {
					w.addTokens(p, rng.IntN(3))
					if rng.IntN(2) == 0 {
						w.addJWT(p)
					}
					if k := rng.IntN(4); k < 2 {
						w.addCert(p, true, k == 1)
					} else if k == 2 && p.units() > 0 {
						w.addCert(p, false, false)
					}
				}
			}
		}
		// Every person with more than one credential must be listed, or
		// the policy would not know them as one; a single credential is
		// listed or not.
		p.listed = p.units() > 1 || i != 3 && rng.IntN(2) == 0
		if p.cert != nil {
			p.cert.listFP = !p.cert.mapped || rng.IntN(2) == 0
		}
		w.people = append(w.people, p)
	}
	rng.Shuffle(len(w.people), func(i, j int) { w.people[i], w.people[j] = w.people[j], w.people[i] })

	srvCert, err := ca.Server()
	if err != nil {
		t.Fatal(err)
	}
	sc, err := srvCert.TLS()
	if err != nil {
		t.Fatal(err)
	}
	w.policy = w.policyText()
	w.s = newSurface(t, w.policy, web.Options{}, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{sc},
		ClientCAs: ca.Pool(), ClientAuth: tls.VerifyClientCertIfGiven})
	t.Cleanup(func() {
		for _, cs := range w.sessions {
			cs.Close()
		}
		for _, tr := range w.trs {
			tr.CloseIdleConnections()
		}
	})
	return w
}

func (w *ppWorld) addTokens(p *ppPerson, n int) {
	for range n {
		i := len(p.tokens) + 1
		p.tokens = append(p.tokens, ppToken{id: fmt.Sprintf("%s_t%d", p.name, i),
			secret: fmt.Sprintf("w%d-%s-token-%d-%016x", w.idx, p.name, i, w.rng.Uint64())})
	}
}

func (w *ppWorld) addJWT(p *ppPerson) {
	p.jwtIssuer = w.rng.IntN(len(ppIssuers))
	p.jwtSub = "sub-" + p.name
	iss := ppIssuers[p.jwtIssuer]
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"iss": iss.iss, "aud": ppJWTAudience, "sub": p.jwtSub,
		"role": p.role, "iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(iss.secret))
	if err != nil {
		w.t.Fatal(err)
	}
	p.jwt = tok
}

func (w *ppWorld) addCert(p *ppPerson, mapped, bySAN bool) {
	spec := testpki.Spec{CN: p.name + "-laptop", Client: true}
	c := &ppCert{mapped: mapped, bySAN: bySAN}
	switch {
	case mapped && bySAN:
		spec.CN = p.name + "-device"
		c.name = p.name + ".people.example"
		spec.DNS = []string{c.name}
	case mapped:
		c.name = spec.CN
	default:
		spec.CN = p.name + "-unmapped"
	}
	leaf, err := w.ca.Issue(spec)
	if err != nil {
		w.t.Fatal(err)
	}
	if c.cert, err = leaf.TLS(); err != nil {
		w.t.Fatal(err)
	}
	sum := sha256.Sum256(leaf.Cert.Raw)
	c.fp = hex.EncodeToString(sum[:])
	p.cert = c
}

// policyText is the world's policy: the greenhouse gate, a two-person
// rule on do_heater_zone_c, and the population's identities.
func (w *ppWorld) policyText() string {
	var b strings.Builder
	b.WriteString("physmcp_policy_version: \"0.1\"\n\ndefaults:\n  require_permission: none\n  audit_all: true\n\nidentity:\n  tokens:\n")
	for _, p := range w.people {
		for _, tk := range p.tokens {
			fmt.Fprintf(&b, "    - {id: %s, sha256: %s, role: %s}\n", tk.id, policy.TokenHash(tk.secret), p.role)
		}
	}
	b.WriteString("  providers:\n    - type: mtls\n      clients:\n")
	for _, p := range w.people {
		if c := p.cert; c != nil && c.mapped {
			k := "cn"
			if c.bySAN {
				k = "san"
			}
			fmt.Fprintf(&b, "        - {%s: %q, role: %s}\n", k, c.name, p.role)
		}
	}
	for _, iss := range ppIssuers {
		fmt.Fprintf(&b, "    - {type: jwt, issuer: %q, audience: %s, hs256_secret_env: %s}\n", iss.iss, ppJWTAudience, iss.env)
	}
	b.WriteString("  people:\n")
	for _, p := range w.people {
		if !p.listed {
			continue
		}
		fmt.Fprintf(&b, "    - name: %s\n", p.name)
		if len(p.tokens) > 0 {
			var ids []string
			for _, tk := range p.tokens {
				ids = append(ids, tk.id)
			}
			fmt.Fprintf(&b, "      tokens: [%s]\n", strings.Join(ids, ", "))
		}
		if c := p.cert; c != nil {
			if c.listFP {
				fp := c.fp
				if w.rng.IntN(2) == 0 {
					fp = strings.ToUpper(fp)
				}
				fmt.Fprintf(&b, "      certs: [\"sha256:%s\"]\n", fp)
			} else {
				fmt.Fprintf(&b, "      certs: [%q]\n", c.name)
			}
		}
		if p.jwtIssuer >= 0 {
			fmt.Fprintf(&b, "      jwt: [{issuer: %q, subject: %q}]\n", ppIssuers[p.jwtIssuer].iss, p.jwtSub)
		}
	}
	b.WriteString("\ncapabilities:\n  do_heater_zone_c:\n    rules:\n" +
		"      - {type: permission, require: [operator]}\n" +
		"      - {type: range_guard, min: 0, max: 80, on_violation: deny}\n" +
		"      - {type: approval, when: always, approver_role: supervisor, self_approval: false}\n")
	g := greenhousePolicy(w.t)
	i := strings.Index(g, "\ngate:")
	if i < 0 {
		w.t.Fatal("the greenhouse policy has no gate section")
	}
	b.WriteString(g[i:])
	return b.String()
}

// httpClient is an HTTPS client that presents p.
func (w *ppWorld) httpClient(p ppPres) *http.Client {
	tk := "nocert"
	if p.cert {
		tk = p.certPerson().name
	}
	tr, ok := w.trs[tk]
	if !ok {
		cfg := &tls.Config{RootCAs: w.ca.Pool()}
		if p.cert {
			cfg.Certificates = []tls.Certificate{p.certPerson().cert.cert}
		}
		tr = &http.Transport{TLSClientConfig: cfg}
		w.trs[tk] = tr
	}
	h := map[string]string{}
	switch {
	case p.isToken():
		h["Authorization"] = "Bearer " + p.who.tokens[p.bearer].secret
	case p.isJWT():
		h["Authorization"] = "Bearer " + p.who.jwt
	}
	return &http.Client{Transport: bearerRT{h, tr}, Timeout: 30 * time.Second}
}

// session is the MCP client session of p (2026-07-28; it declares
// elicitation, so a server that wrongly asked the caller would be seen).
func (w *ppWorld) session(p ppPres) *mcp.ClientSession {
	if cs, ok := w.sessions[p.key()]; ok {
		return cs
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "principals", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{}}, MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: w.s.srv.URL + "/mcp", HTTPClient: w.httpClient(p)},
		&mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		w.t.Fatalf("connect as %s: %v", p, err)
	}
	w.sessions[p.key()] = cs
	return cs
}

// ppOutcome is a do_ answer.
type ppOutcome struct {
	isError, needsInput bool
	m                   map[string]any
	text                string
}

func (o ppOutcome) success() bool { return !o.isError && !o.needsInput && o.m["status"] == "success" }

func (o ppOutcome) String() string {
	t := o.text
	if len(t) > 400 {
		t = t[:400] + "…"
	}
	return fmt.Sprintf("isError=%v needsInput=%v %s", o.isError, o.needsInput, t)
}

func (w *ppWorld) call(p ppPres, value int, key, state string) ppOutcome {
	res, err := w.session(p).CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_zone_c",
		Arguments: map[string]any{"value": value, "idempotency_key": key}, RequestState: state})
	if err != nil {
		w.t.Fatalf("do_heater_zone_c as %s: %v", p, err)
	}
	o := ppOutcome{isError: res.IsError, needsInput: res.NeedsInput()}
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			o.text += tc.Text
		}
	}
	if res.StructuredContent != nil {
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, &o.m)
	}
	return o
}

func (w *ppWorld) approvals(p ppPres, method, id, body string) (int, map[string]any) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, w.s.srv.URL+"/approvals/"+id, rd)
	if err != nil {
		w.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := w.httpClient(p).Do(req)
	if err != nil {
		w.t.Fatalf("%s /approvals/%s as %s: %v", method, id, p, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		m["raw"] = string(b)
	}
	return resp.StatusCode, m
}

func (w *ppWorld) list(p ppPres) []any {
	req, _ := http.NewRequest(http.MethodGet, w.s.srv.URL+"/approvals", nil)
	req.Header.Set("Accept", "application/json")
	resp, err := w.httpClient(p).Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	var m struct {
		Approvals []any `json:"approvals"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(b, &m) != nil {
		w.t.Fatalf("GET /approvals as %s: %d %s", p, resp.StatusCode, b)
	}
	return m.Approvals
}

func (w *ppWorld) writes() uint64 { return w.s.plant.Stats().Points["zone_c.heater"].Writes }

func (w *ppWorld) pick(ps []*ppPerson) *ppPerson { return ps[w.rng.IntN(len(ps))] }

func (w *ppWorld) pres(p *ppPerson) ppPres {
	all := p.presentations()
	return all[w.rng.IntN(len(all))]
}

// chimera is a presentation that mixes r's credential with another
// person's: r's bearer with another's certificate, or another's bearer
// with r's certificate.
func (w *ppWorld) chimera(r *ppPerson) ppPres {
	var out []ppPres
	for _, o := range w.others(r, "") {
		for _, pr := range r.presentations() {
			if pr.bearer >= 0 && o.cert != nil {
				out = append(out, ppPres{who: r, bearer: pr.bearer, cert: true, certOf: o})
			}
		}
		if r.cert != nil {
			for _, po := range o.presentations() {
				if po.bearer >= 0 {
					out = append(out, ppPres{who: o, bearer: po.bearer, cert: true, certOf: r})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b ppPres) int { return strings.Compare(a.key(), b.key()) })
	out = slices.CompactFunc(out, func(a, b ppPres) bool { return a.key() == b.key() })
	return out[w.rng.IntN(len(out))]
}

func (w *ppWorld) others(p *ppPerson, role string) []*ppPerson {
	var out []*ppPerson
	for _, q := range w.people {
		if q != p && (role == "" || q.role == role) {
			out = append(out, q)
		}
	}
	return out
}

// ppIter is what one iteration expects the audit to show.
type ppIter struct {
	key      string
	trace    *strings.Builder
	asked    []string   // credentials of the asking call
	used     [][]string // credentials of every do_ call made with the key
	approver []string   // the approving supervisor's credentials ("" denied)
	runner   []string   // credentials of the call that ran
	selfs    [][]string // credentials of refused self-approvals
}

func TestPrincipalsTwoPersonProperty(t *testing.T) {
	seed := uint64(principalsDefaultSeed)
	if v := os.Getenv(principalsSeedEnv); v != "" {
		if v == "random" {
			seed = uint64(time.Now().UnixNano())
		} else {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("%s=%q: want a number or \"random\"", principalsSeedEnv, v)
			}
			seed = n
		}
	}
	t.Logf("seed %d (reproduce: %s=%d go test -race -count=1 -run TestPrincipalsTwoPersonProperty ./web)", seed, principalsSeedEnv, seed)
	for _, iss := range ppIssuers {
		t.Setenv(iss.env, iss.secret)
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	worlds, iters := principalsWorlds, principalsIterations
	if testing.Short() {
		worlds, iters = 1, 15
	}
	coverage := map[string]int{}
	start := time.Now()
	for wi := range worlds {
		w := newPPWorld(t, rng, wi)
		var b strings.Builder
		for _, p := range w.people {
			fmt.Fprintf(&b, " %s(%s: tokens=%d jwt=%v cert=%s listed=%v)", p.name, p.role, len(p.tokens), p.jwtIssuer >= 0, certShape(p.cert), p.listed)
		}
		t.Logf("world %d:%s", wi, b.String())
		var recs []*ppIter
		var stale []string // grants of earlier iterations
		for i := range iters {
			rec := ppPropertyIteration(t, w, seed, i, &stale, coverage)
			recs = append(recs, rec)
		}
		ppCheckAudit(t, w, seed, recs, coverage)
	}
	t.Logf("%d worlds × %d iterations in %v; coverage: %v", worlds, iters, time.Since(start).Round(time.Millisecond), coverageText(coverage))
	for _, need := range []string{"self-refused/disjoint", "self-refused/overlapping", "self-refused/deny", "chimera/self", "chimera/disagree",
		"requester/unlisted", "approver/unlisted",
		"non-approver-refused", "approved", "denied", "ran/plain", "ran/grant", "ran/other-credentials", "thief/grant", "thief/plain",
		"thief/approver", "kind/T", "kind/J", "kind/C", "kind/TC", "kind/JC", "kind/TU", "approver/J", "approver/C", "approver/TU"} {
		if coverage[need] == 0 {
			t.Errorf("seed %d never exercised %s: raise the iterations or change the generator", seed, need)
		}
	}
}

func certShape(c *ppCert) string {
	switch {
	case c == nil:
		return "none"
	case !c.mapped:
		return "unmapped(fp)"
	case c.bySAN && c.listFP:
		return "san(fp)"
	case c.bySAN:
		return "san"
	case c.listFP:
		return "cn(fp)"
	}
	return "cn"
}

func coverageText(c map[string]int) string {
	var ks []string
	for k := range c {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, k := range ks {
		fmt.Fprintf(&b, "%s=%d ", k, c[k])
	}
	return b.String()
}

// ppPropertyIteration is one requested call and its decision.
func ppPropertyIteration(t *testing.T, w *ppWorld, seed uint64, i int, stale *[]string, coverage map[string]int) *ppIter {
	rng := w.rng
	rec := &ppIter{key: fmt.Sprintf("pp-w%d-i%d", w.idx, i), trace: &strings.Builder{}}
	step := func(format string, args ...any) { fmt.Fprintf(rec.trace, "  "+format+"\n", args...) }
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d world %d iteration %d: %s\npolicy identity:\n%s\ntrace:\n%s", seed, w.idx, i, fmt.Sprintf(format, args...),
			identitySection(w.policy), rec.trace.String())
	}
	value := 1 + rng.IntN(80)
	before := w.writes()
	unchanged := func(what string) {
		t.Helper()
		if got := w.writes(); got != before {
			fail("%s actuated: the heater was written %d times (want %d)", what, got, before)
		}
	}
	call := func(p ppPres, state, what string) ppOutcome {
		t.Helper()
		o := w.call(p, value, rec.key, state)
		rec.used = append(rec.used, p.creds())
		st := ""
		if state != "" {
			st = " requestState=" + state[:min(len(state), 16)] + "…"
		}
		step("%s: do_heater_zone_c(%d, %s)%s as %s -> %s", what, value, rec.key, st, p, o)
		return o
	}
	pendingID := func(o ppOutcome, what string) string {
		t.Helper()
		d, _ := o.m["details"].(string)
		_, id, ok := strings.Cut(d, "approval_id=")
		if o.isError || o.needsInput || !ok || o.m["code"] != "approval_pending" || o.m["status"] != "failed" {
			fail("%s: want approval_pending, got %s", what, o)
		}
		id, _, _ = strings.Cut(id, ";")
		return id
	}
	decide := func(p ppPres, id, decision, what string) (int, map[string]any) {
		t.Helper()
		code, m := w.approvals(p, http.MethodPost, id, `{"decision":"`+decision+`","reason":"property test"}`)
		b, _ := json.Marshal(m)
		step("%s: POST /approvals/%s %s as %s -> %d %.300s", what, id, decision, p, code, b)
		return code, m
	}
	state := func(id string) string {
		t.Helper()
		code, m := w.approvals(w.pres(w.pick(w.people)), http.MethodGet, id, "")
		if code == http.StatusNotFound {
			return "gone"
		}
		if code != 200 {
			fail("GET /approvals/%s: %d %v", id, code, m)
		}
		s, _ := m["state"].(string)
		return s
	}
	supervisors := func(not *ppPerson) []*ppPerson { return w.others(not, "supervisor") }

	r := w.pick(w.people)
	pr1 := w.pres(r)
	rec.asked = pr1.creds()
	coverage["kind/"+pr1.kind()]++
	if !r.listed {
		coverage["requester/unlisted"]++
	}
	o := call(pr1, "", "ask")
	id := pendingID(o, "the first call")
	unchanged("the first call")

	// Refused decisions: the requester with any subset of their own
	// credentials, or another person without the approver role.
	for range rng.IntN(4) {
		kind := []string{"self", "self", "self", "non-approver", "non-approver", "chimera"}[rng.IntN(6)]
		ops := w.others(r, "operator")
		if kind == "non-approver" && len(ops) == 0 {
			kind = "self"
		}
		decision := []string{"approve", "deny"}[rng.IntN(4)/3] // mostly approve
		var code int
		var m map[string]any
		switch kind {
		case "self":
			ps := w.pres(r)
			code, m = decide(ps, id, decision, "self")
			if code != http.StatusForbidden || !strings.Contains(toString(m["error"]), "cannot approve their own request") {
				fail("%s decided their own request (%s, asked as %s): %d %v", ps, decision, pr1, code, m)
			}
			rec.selfs = append(rec.selfs, ps.creds())
			if ppDisjoint(ps.creds(), pr1.creds()) {
				// One person only through identity.people.
				coverage["self-refused/disjoint"]++
			} else {
				coverage["self-refused/overlapping"]++
			}
			if decision == "deny" {
				coverage["self-refused/deny"]++
			}
			coverage["self/"+pr1.kind()+">"+ps.kind()]++
		case "chimera":
			// Someone presenting a credential of the requester (beside one
			// of their own) is the requester: refused, by the boundary when
			// the two credentials' roles disagree, else as self-approval.
			pc := w.chimera(r)
			code, m = decide(pc, id, decision, "chimera")
			switch {
			case code == http.StatusForbidden && strings.Contains(toString(m["error"]), "cannot approve their own request"):
				coverage["chimera/self"]++
				rec.selfs = append(rec.selfs, pc.creds())
			case code == http.StatusForbidden && strings.Contains(toString(m["raw"]), "disagree"):
				coverage["chimera/disagree"]++
			default:
				fail("%s (carrying a credential of the requester %s) decided the request: %d %v", pc, pr1, code, m)
			}
		default:
			po := w.pres(w.pick(ops))
			code, m = decide(po, id, decision, "non-approver")
			if code != http.StatusForbidden || !strings.Contains(toString(m["error"]), "needs the supervisor role") {
				fail("%s (no approver role) decided %s's request: %d %v", po, r.name, code, m)
			}
			coverage["non-approver-refused"]++
		}
		if g, has := m["grant"]; has {
			fail("a refused decision carries a grant: %v", g)
		}
		if st := state(id); st != "pending" {
			fail("after a refused decision the request is %q, want pending", st)
		}
		// The requester's repeat, and a call with the grant the refused
		// decision did not give (or an earlier iteration's), never run.
		if rng.IntN(2) == 0 {
			if again := pendingID(call(w.pres(r), "", "repeat while pending"), "a repeat while pending"); again != id {
				fail("a repeat while pending registered another request %s (want %s)", again, id)
			}
		}
		if rng.IntN(2) == 0 {
			g := toString(m["grant"])
			if g == "" && len(*stale) > 0 {
				g = (*stale)[rng.IntN(len(*stale))]
			}
			if g == "" {
				g = "grant.e30.AAAA" // a made-up one
			}
			if o := call(w.pres(r), g, "a grant that is not this call's"); o.success() {
				fail("a call with a grant that was never given for it succeeded: %s", o)
			}
		}
		unchanged("a refused decision")
	}

	// The decision of another supervisor.
	s := w.pick(supervisors(r))
	ps := w.pres(s)
	if rng.IntN(8) == 0 {
		code, m := decide(ps, id, "deny", "deny")
		if code != 200 || m["state"] != "denied" || m["grant"] != nil {
			fail("another supervisor's denial: %d %v", code, m)
		}
		coverage["denied"]++
		o := call(w.pres(r), "", "repeat after the denial")
		if o.isError || o.m["code"] != "approval_deny" {
			fail("the repeat after a denial: want approval_deny, got %s", o)
		}
		unchanged("a denied request")
		if n := len(w.list(ps)); n != 0 {
			fail("the book keeps %d entries after the iteration", n)
		}
		return rec
	}
	code, m := decide(ps, id, "approve", "approve")
	grant := toString(m["grant"])
	if code != 200 || m["state"] != "approved" || !strings.HasPrefix(grant, "grant.") {
		fail("another supervisor (%s) could not approve %s's request: %d %v", ps, pr1, code, m)
	}
	rec.approver = ps.creds()
	coverage["approved"]++
	coverage["approver/"+ps.kind()]++
	if !s.listed {
		coverage["approver/unlisted"]++
	}
	unchanged("an approval")

	// Anybody but the requester: the grant never runs for them, and does
	// not spend it; without the grant, their call is their own request.
	for range rng.IntN(3) {
		th := w.pick(w.others(r, ""))
		pt := w.pres(th)
		if rng.IntN(3) != 0 {
			o := call(pt, grant, "another person's grant")
			if o.success() {
				fail("%s ran %s's call with the grant %s gave: %s", pt, pr1, ps, o)
			}
			if !o.isError || !strings.Contains(o.text, "approves another call") {
				fail("another person's grant: want the tool error that it approves another call, got %s", o)
			}
			coverage["thief/grant"]++
			if th == s {
				coverage["thief/approver"]++
			}
		} else {
			o := call(pt, "", "another person, same key, no grant")
			other := pendingID(o, "another person's call with the key")
			if other == id {
				fail("another person's call took the requester's approval %s", id)
			}
			// Tidy: deny theirs and let them take the denial.
			d := w.pres(w.pick(supervisors(th)))
			if code, m := decide(d, other, "deny", "deny the other's"); code != 200 {
				fail("denying the other person's request: %d %v", code, m)
			}
			if o := call(w.pres(th), "", "the other person takes the denial"); o.isError || o.m["code"] != "approval_deny" {
				fail("the other person's repeat: want approval_deny, got %s", o)
			}
			coverage["thief/plain"]++
		}
		unchanged("another person's use of the approval")
	}

	// The requester's repeat runs it, exactly once.
	pr2 := w.pres(r)
	withGrant := rng.IntN(2) == 0
	st := ""
	if withGrant {
		st = grant
		coverage["ran/grant"]++
	} else {
		coverage["ran/plain"]++
	}
	if ppDisjoint(pr2.creds(), pr1.creds()) {
		coverage["ran/other-credentials"]++
	}
	o = call(pr2, st, "the requester's repeat")
	if !o.success() {
		fail("the approved call did not run for its requester (%s; asked as %s, approved by %s): %s", pr2, pr1, ps, o)
	}
	if got := w.writes(); got != before+1 {
		fail("the approved call wrote the heater %d times, want exactly 1", got-before)
	}
	if d := toString(o.m["details"]); !strings.Contains(d, "approved_by=") || !strings.Contains(d, "approver_role=supervisor") {
		fail("the approved call's details do not name the approver: %q", d)
	}
	rec.runner = pr2.creds()
	*stale = append(*stale, grant)
	before++

	// Afterwards: the grant again, by the requester or anybody, writes
	// nothing more; the request is gone from the book.
	for range rng.IntN(3) {
		var p ppPres
		if rng.IntN(2) == 0 {
			p = w.pres(r)
		} else {
			p = w.pres(w.pick(w.others(r, "")))
		}
		st := ""
		if rng.IntN(3) != 0 {
			st = grant
		}
		call(p, st, "after it ran")
		unchanged("a repeat after the approved call ran")
	}
	if st := state(id); st != "gone" {
		fail("the redeemed request is still in the book as %q", st)
	}
	if n := len(w.list(ps)); n != 0 {
		fail("the book keeps %d entries after the iteration", n)
	}
	return rec
}

func identitySection(p string) string {
	i, j := strings.Index(p, "identity:"), strings.Index(p, "\ncapabilities:")
	if i < 0 || j < i {
		return p
	}
	return p[i:j]
}

// ppCheckAudit: every do_ line names the credentials of the call it
// records; the asking call, the approver and the call that ran are the
// ones the iteration used.
func ppCheckAudit(t *testing.T, w *ppWorld, seed uint64, recs []*ppIter, coverage map[string]int) {
	t.Helper()
	f, err := os.ReadFile(w.s.audit)
	if err != nil {
		t.Fatal(err)
	}
	type line struct {
		Event       string         `json:"event"`
		Key         string         `json:"idempotency_key"`
		Tool        string         `json:"tool"`
		Status      string         `json:"status"`
		Credentials []string       `json:"credentials"`
		Data        map[string]any `json:"data"`
	}
	byKey := map[string][]line{}
	sc := bufio.NewScanner(bytes.NewReader(f))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		byKey[l.Key] = append(byKey[l.Key], l)
	}
	errs := 0
	for _, rec := range recs {
		fail := func(format string, args ...any) {
			t.Helper()
			if errs++; errs > 5 {
				t.Fatalf("seed %d world %d: more audit errors; stopping", seed, w.idx)
			}
			t.Errorf("seed %d world %d key %s: audit: %s\ntrace:\n%s", seed, w.idx, rec.key, fmt.Sprintf(format, args...), rec.trace.String())
		}
		lines := byKey[rec.key]
		var dos, pending, redeemed, approvedL, refusedRoute []line
		for _, l := range lines {
			switch {
			case l.Event == "do":
				dos = append(dos, l)
			case l.Event == "do_approval_pending":
				pending = append(pending, l)
			case l.Event == "approval_redeemed":
				redeemed = append(redeemed, l)
			case l.Event == "approval_approved":
				approvedL = append(approvedL, l)
			case l.Event == "approval_refused" && l.Data["approval_id"] != nil:
				refusedRoute = append(refusedRoute, l)
			}
			if strings.HasPrefix(l.Event, "do") {
				if len(l.Credentials) == 0 {
					fail("%s line without credentials", l.Event)
				} else if !slices.ContainsFunc(rec.used, func(c []string) bool { return ppSameSet(c, l.Credentials) }) {
					fail("%s line credentials %v are none of the calls' %v", l.Event, l.Credentials, rec.used)
				}
			}
		}
		if len(pending) == 0 || !ppSameSet(pending[0].Credentials, rec.asked) {
			fail("the first do_approval_pending line does not carry the asking call's credentials %v: %+v", rec.asked, pending)
		}
		if rec.runner == nil {
			if len(dos) != 0 {
				fail("a request that never ran has do lines: %+v", dos)
			}
			continue
		}
		if len(dos) != 1 || dos[0].Status != "success" || !ppSameSet(dos[0].Credentials, rec.runner) {
			fail("want one successful do line with credentials %v, got %+v", rec.runner, dos)
		}
		if len(redeemed) != 1 || !ppSameSet(redeemed[0].Credentials, rec.runner) ||
			!ppSameSet(anyStrings(redeemed[0].Data["approver_credentials"]), rec.approver) {
			fail("want one approval_redeemed line by %v approved by %v, got %+v", rec.runner, rec.approver, redeemed)
		}
		if len(approvedL) != 1 || !ppSameSet(approvedL[0].Credentials, rec.approver) {
			fail("want one approval_approved line with the approver's credentials %v, got %+v", rec.approver, approvedL)
		}
		for _, self := range rec.selfs {
			if !slices.ContainsFunc(refusedRoute, func(l line) bool { return ppSameSet(l.Credentials, self) }) {
				fail("no approval_refused line carries the refused self-approval's credentials %v", self)
			}
		}
		coverage["audit/checked"]++
	}
}

func anyStrings(v any) []string {
	var out []string
	if l, ok := v.([]any); ok {
		for _, x := range l {
			s, _ := x.(string)
			out = append(out, s)
		}
	}
	return out
}
