package meshnode_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/physd/physd/approval"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/gate"
	"github.com/physd/physd/guard"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/store"
	"github.com/physd/physd/web"
)

// The mesh variant of web's TestPrincipalsTwoPersonProperty: the
// do_ calls reach the owner routed through another gateway (the mesh
// handler, which authenticates the forwarded bearer with the owner's own
// policy), the decisions are taken on the owner's HTTP /approvals route.
// A routed call carries one bearer (a static token or a JWT), never a
// client certificate, so the population here is of bearers. Besides the
// two-person properties, a routing gateway that writes the requester's
// credentials into the routed caller (any holder of the mesh key can) is
// never taken for the requester.

const (
	meshPrincipalsSeedEnv     = "PHYSD_PRINCIPALS_SEED"
	meshPrincipalsDefaultSeed = 20260728
	meshPrincipalsWorlds      = 4
	meshPrincipalsIterations  = 60
)

var mpIssuers = []struct{ iss, env, secret string }{
	{"https://idp-a.example", "PHYSD_TEST_MESH_PRINCIPALS_JWT_A", strings.Repeat("a-secret-", 5)},
	{"https://idp-b.example", "PHYSD_TEST_MESH_PRINCIPALS_JWT_B", strings.Repeat("b-secret-", 5)},
}

type mpPerson struct {
	name, role string
	tokens     []struct{ id, secret string }
	jwtIssuer  int // -1 none
	jwtSub     string
	jwt        string
	listed     bool
}

// bearers are the person's credentials as (secret, credential name).
func (p *mpPerson) bearers() [][2]string {
	var out [][2]string
	for _, t := range p.tokens {
		out = append(out, [2]string{t.secret, policy.TokenCredential(t.id)})
	}
	if p.jwtIssuer >= 0 {
		out = append(out, [2]string{p.jwt, policy.JWTCredential(mpIssuers[p.jwtIssuer].iss, p.jwtSub)})
	}
	return out
}

type mpWorld struct {
	t      *testing.T
	rng    *rand.Rand
	idx    int
	people []*mpPerson
	handle func(from string, payload map[string]any) map[string]any
	srv    *httptest.Server
	plant  *sim.Plant
	audit  string
	policy string
}

func newMPWorld(t *testing.T, rng *rand.Rand, idx int) *mpWorld {
	t.Helper()
	w := &mpWorld{t: t, rng: rng, idx: idx}
	names := []string{"alice", "bob", "carol", "dave", "erin", "frank", "grace"}
	rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	n := 5 + rng.IntN(3)
	for i := range n {
		p := &mpPerson{name: names[i], jwtIssuer: -1}
		switch i {
		case 0, 1: // two supervisors with a token and a JWT each
			p.role = "supervisor"
			w.addTokens(p, 1+i)
			w.addJWT(p)
		case 2: // an operator with two tokens that share nothing
			p.role = "operator"
			w.addTokens(p, 2)
		case 3: // a supervisor with one credential, not listed
			p.role = "supervisor"
			if rng.IntN(2) == 0 {
				w.addTokens(p, 1)
			} else {
				w.addJWT(p)
			}
		default:
			p.role = []string{"operator", "supervisor"}[rng.IntN(2)]
			for len(p.bearers()) == 0 {
				w.addTokens(p, rng.IntN(3))
				if rng.IntN(2) == 0 {
					w.addJWT(p)
				}
			}
		}
		p.listed = len(p.bearers()) > 1 || i != 3 && rng.IntN(2) == 0
		w.people = append(w.people, p)
	}
	w.policy = w.policyText()
	w.open()
	return w
}

func (w *mpWorld) addTokens(p *mpPerson, n int) {
	for range n {
		i := len(p.tokens) + 1
		p.tokens = append(p.tokens, struct{ id, secret string }{fmt.Sprintf("%s_t%d", p.name, i),
			fmt.Sprintf("mesh-w%d-%s-token-%d-%016x", w.idx, p.name, i, w.rng.Uint64())})
	}
}

func (w *mpWorld) addJWT(p *mpPerson) {
	p.jwtIssuer, p.jwtSub = w.rng.IntN(len(mpIssuers)), "sub-"+p.name
	iss := mpIssuers[p.jwtIssuer]
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"iss": iss.iss, "aud": "physd", "sub": p.jwtSub, "role": p.role,
		"exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(iss.secret))
	if err != nil {
		w.t.Fatal(err)
	}
	p.jwt = tok
}

func (w *mpWorld) policyText() string {
	var b strings.Builder
	b.WriteString("physmcp_policy_version: \"0.1\"\n\ndefaults:\n  require_permission: none\n  audit_all: true\n\nidentity:\n  tokens:\n")
	for _, p := range w.people {
		for _, tk := range p.tokens {
			fmt.Fprintf(&b, "    - {id: %s, sha256: %s, role: %s}\n", tk.id, policy.TokenHash(tk.secret), p.role)
		}
	}
	b.WriteString("  providers:\n")
	for _, iss := range mpIssuers {
		fmt.Fprintf(&b, "    - {type: jwt, issuer: %q, audience: physd, hs256_secret_env: %s}\n", iss.iss, iss.env)
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
		if p.jwtIssuer >= 0 {
			fmt.Fprintf(&b, "      jwt: [{issuer: %q, subject: %q}]\n", mpIssuers[p.jwtIssuer].iss, p.jwtSub)
		}
	}
	b.WriteString("\ncapabilities:\n  do_heater_zone_c:\n    rules:\n" +
		"      - {type: permission, require: [operator]}\n" +
		"      - {type: range_guard, min: 0, max: 80, on_violation: deny}\n" +
		"      - {type: approval, when: always, approver_role: supervisor, self_approval: false}\n")
	g, err := os.ReadFile("../examples/greenhouse/physmcp.policy.yml")
	if err != nil {
		w.t.Fatal(err)
	}
	i := strings.Index(string(g), "\ngate:")
	if i < 0 {
		w.t.Fatal("the greenhouse policy has no gate section")
	}
	b.Write(g[i:])
	return b.String()
}

type mpNonces struct{ st *store.Store }

func (n mpNonces) Consume(nonce string, exp time.Time) (bool, error) {
	return n.st.ConsumeNonce(nonce, exp)
}

// open starts the owner: the greenhouse node with the world's policy, its
// HTTP surface (for /approvals) and its mesh handler.
func (w *mpWorld) open() {
	t := w.t
	m, err := manifest.Load("../examples/greenhouse/physmcp.manifest.yml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(filepath.Join(dir, "audit"))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse("policy.yml", []byte(w.policy), m)
	if err != nil {
		t.Fatalf("%v\n%s", err, w.policy)
	}
	gcfg, err := gate.DecodeConfig(pol.Gate)
	if err != nil {
		t.Fatal(err)
	}
	g, err := gate.New(gcfg, "test")
	if err != nil {
		t.Fatal(err)
	}
	gd := guard.New(guard.Config{Policy: pol, Gate: g, State: st, DeviceID: m.Device.ID})
	appr, err := approval.New(approval.Config{Nonces: mpNonces{st}, Same: gd.SamePerson, Installation: "test"})
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al, Guard: gd, Approvals: appr})
	if err != nil {
		t.Fatal(err)
	}
	mx := metrics.New()
	ms := mcpserver.New(n, mcpserver.Options{Guard: gd, Audit: al, Metrics: mx})
	ws := web.New(ms, web.Options{Guard: gd, Audit: al, Metrics: mx})
	w.srv = httptest.NewServer(ws.Handler())
	t.Cleanup(func() {
		w.srv.Close()
		n.Close(context.Background())
		al.Close()
		st.Close()
	})
	h := meshnode.Handler(n, ws.AuthenticateCredential)
	w.handle = func(from string, payload map[string]any) map[string]any {
		b, _ := json.Marshal(payload)
		out, err := h(context.Background(), from, meshnode.KindDo, b)
		if err != nil {
			return map[string]any{"handler_error": err.Error()}
		}
		var m map[string]any
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("routed do_ answer %q: %v", out, err)
		}
		return m
	}
	w.plant = n.Buses()["plant"].(*sim.Plant)
	w.audit = filepath.Join(dir, "audit", "audit.jsonl")
}

func (w *mpWorld) writes() uint64 { return w.plant.Stats().Points["zone_c.heater"].Writes }

// mpCred is one bearer of one person.
type mpCred struct {
	who          *mpPerson
	secret, name string
}

func (c mpCred) String() string { return c.who.name + "(" + c.who.role + ")[" + c.name + "]" }

func (w *mpWorld) cred(p *mpPerson) mpCred {
	b := p.bearers()
	x := b[w.rng.IntN(len(b))]
	return mpCred{p, x[0], x[1]}
}

func (w *mpWorld) pick(ps []*mpPerson) *mpPerson { return ps[w.rng.IntN(len(ps))] }

func (w *mpWorld) others(p *mpPerson, role string) []*mpPerson {
	var out []*mpPerson
	for _, q := range w.people {
		if q != p && (role == "" || q.role == role) {
			out = append(out, q)
		}
	}
	return out
}

func (w *mpWorld) decide(c mpCred, id, decision string) (int, map[string]any) {
	req, _ := http.NewRequest(http.MethodPost, w.srv.URL+"/approvals/"+id, strings.NewReader(`{"decision":"`+decision+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := map[string]any{}
	if json.Unmarshal(b, &m) != nil {
		m["raw"] = string(b)
	}
	return resp.StatusCode, m
}

func (w *mpWorld) state(id string) string {
	c := w.cred(w.pick(w.people))
	req, _ := http.NewRequest(http.MethodGet, w.srv.URL+"/approvals/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+c.secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return "gone"
	}
	var m map[string]any
	b, _ := io.ReadAll(resp.Body)
	json.Unmarshal(b, &m)
	s, _ := m["state"].(string)
	return s
}

func TestPrincipalsTwoPersonMeshProperty(t *testing.T) {
	seed := uint64(meshPrincipalsDefaultSeed)
	if v := os.Getenv(meshPrincipalsSeedEnv); v != "" {
		if v == "random" {
			seed = uint64(time.Now().UnixNano())
		} else {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				t.Fatalf("%s=%q: want a number or \"random\"", meshPrincipalsSeedEnv, v)
			}
			seed = n
		}
	}
	t.Logf("seed %d (reproduce: %s=%d go test -race -count=1 -run TestPrincipalsTwoPersonMeshProperty ./meshnode)", seed, meshPrincipalsSeedEnv, seed)
	for _, iss := range mpIssuers {
		t.Setenv(iss.env, iss.secret)
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	worlds, iters := meshPrincipalsWorlds, meshPrincipalsIterations
	if testing.Short() {
		worlds, iters = 1, 15
	}
	coverage := map[string]int{}
	start := time.Now()
	for wi := range worlds {
		w := newMPWorld(t, rng, wi)
		var b strings.Builder
		for _, p := range w.people {
			fmt.Fprintf(&b, " %s(%s: tokens=%d jwt=%v listed=%v)", p.name, p.role, len(p.tokens), p.jwtIssuer >= 0, p.listed)
		}
		t.Logf("world %d:%s", wi, b.String())
		var exps []mpResult
		for i := range iters {
			exps = append(exps, mpIteration(t, w, seed, i, coverage))
		}
		// The audit: every do_ line of a routed call carries the
		// credential the owner authenticated, and the gateway it came via.
		f, err := os.ReadFile(w.audit)
		if err != nil {
			t.Fatal(err)
		}
		type line struct {
			Event       string         `json:"event"`
			Key         string         `json:"idempotency_key"`
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
		for _, e := range exps {
			var pending, dos []line
			for _, l := range byKey[e.key] {
				if strings.HasPrefix(l.Event, "do") && (len(l.Credentials) == 0 || l.Data["via"] == nil) {
					t.Errorf("seed %d world %d key %s: %s line lacks credentials or via: %+v", seed, wi, e.key, l.Event, l)
				}
				switch l.Event {
				case "do_approval_pending":
					pending = append(pending, l)
				case "do":
					dos = append(dos, l)
				}
			}
			if len(pending) == 0 || !slices.Equal(pending[0].Credentials, []string{e.asked}) {
				t.Errorf("seed %d world %d key %s: the first do_approval_pending line is not the asking call's %s: %+v\n%s", seed, wi, e.key, e.asked, pending, e.trace)
			}
			if e.runner != "" && (len(dos) != 1 || dos[0].Status != "success" || !slices.Equal(dos[0].Credentials, []string{e.runner}) || dos[0].Data["via"] != "gw_front") {
				t.Errorf("seed %d world %d key %s: want one do line by %s via gw_front, got %+v\n%s", seed, wi, e.key, e.runner, dos, e.trace)
			}
		}
	}
	var ks []string
	for k := range coverage {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var cb strings.Builder
	for _, k := range ks {
		fmt.Fprintf(&cb, "%s=%d ", k, coverage[k])
	}
	t.Logf("%d worlds × %d iterations in %v; coverage: %s", worlds, iters, time.Since(start).Round(time.Millisecond), cb.String())
	for _, need := range []string{"self-refused/other-credential", "self-refused/same-credential", "non-approver-refused", "approved", "ran/grant",
		"ran/plain", "ran/other-credential", "forged-caller", "thief/grant", "asked/jwt", "asked/token", "approver/unlisted"} {
		if coverage[need] == 0 {
			t.Errorf("seed %d never exercised %s", seed, need)
		}
	}
}

type mpResult struct {
	key, asked, runner string
	trace              *strings.Builder
}

func mpIteration(t *testing.T, w *mpWorld, seed uint64, i int, coverage map[string]int) mpResult {
	rng := w.rng
	res := mpResult{key: fmt.Sprintf("mesh-w%d-i%d", w.idx, i), trace: &strings.Builder{}}
	step := func(format string, args ...any) { fmt.Fprintf(res.trace, "  "+format+"\n", args...) }
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d world %d iteration %d: %s\ntrace:\n%s", seed, w.idx, i, fmt.Sprintf(format, args...), res.trace)
	}
	value := 1 + rng.IntN(80)
	before := w.writes()
	unchanged := func(what string) {
		t.Helper()
		if got := w.writes(); got != before {
			fail("%s actuated: %d writes, want %d", what, got, before)
		}
	}
	// routed sends the call through gw_front with c's bearer; claimed is
	// what the routing gateway writes as the caller (never to be taken).
	routed := func(c mpCred, grant string, claimed map[string]any, what string) map[string]any {
		t.Helper()
		p := map[string]any{"tool": "do_heater_zone_c", "value": value, "idempotency_key": res.key, "credential": c.secret,
			"caller": map[string]any{"id": "whoever", "role": "none"}}
		if claimed != nil {
			p["caller"] = claimed
		}
		if grant != "" {
			p["grant"] = grant
		}
		m := w.handle("gw_front", p)
		b, _ := json.Marshal(m)
		step("%s: routed do_heater_zone_c(%d, %s) as %s grant=%v -> %.300s", what, value, res.key, c, grant != "", b)
		return m
	}
	pendingID := func(m map[string]any, what string) string {
		t.Helper()
		d, _ := m["details"].(string)
		_, id, ok := strings.Cut(d, "approval_id=")
		if !ok || m["code"] != "approval_pending" {
			fail("%s: want approval_pending, got %v", what, m)
		}
		id, _, _ = strings.Cut(id, ";")
		return id
	}
	r := w.pick(w.people)
	c1 := w.cred(r)
	res.asked = c1.name
	if strings.HasPrefix(c1.name, "jwt:") {
		coverage["asked/jwt"]++
	} else {
		coverage["asked/token"]++
	}
	id := pendingID(routed(c1, "", nil, "ask"), "the routed call")
	unchanged("the routed call")

	for range rng.IntN(3) {
		ops := w.others(r, "operator")
		if rng.IntN(3) != 0 || len(ops) == 0 {
			cs := w.cred(r)
			code, m := w.decide(cs, id, "approve")
			step("self: POST /approvals/%s as %s -> %d %v", id, cs, code, m)
			if code != http.StatusForbidden || !strings.Contains(fmt.Sprint(m["error"]), "cannot approve their own request") {
				fail("%s decided their own routed request (asked as %s): %d %v", cs, c1, code, m)
			}
			if cs.name == c1.name {
				coverage["self-refused/same-credential"]++
			} else {
				coverage["self-refused/other-credential"]++
			}
		} else {
			co := w.cred(w.pick(ops))
			code, m := w.decide(co, id, "approve")
			step("non-approver: POST /approvals/%s as %s -> %d %v", id, co, code, m)
			if code != http.StatusForbidden {
				fail("%s (no approver role) decided the request: %d %v", co, code, m)
			}
			coverage["non-approver-refused"]++
		}
		if st := w.state(id); st != "pending" {
			fail("after a refused decision the request is %q", st)
		}
		unchanged("a refused decision")
	}

	s := w.pick(w.others(r, "supervisor"))
	cs := w.cred(s)
	code, m := w.decide(cs, id, "approve")
	step("approve: POST /approvals/%s as %s -> %d", id, cs, code)
	grant, _ := m["grant"].(string)
	if code != 200 || !strings.HasPrefix(grant, "grant.") {
		fail("%s could not approve: %d %v", cs, code, m)
	}
	coverage["approved"]++
	if !s.listed {
		coverage["approver/unlisted"]++
	}

	// Another person's bearer, with the routing gateway claiming the
	// requester (and the requester's credentials) as the caller, and the
	// grant: never the requester.
	for range rng.IntN(3) {
		th := w.pick(w.others(r, ""))
		ct := w.cred(th)
		var claimed map[string]any
		if rng.IntN(2) == 0 {
			claimed = map[string]any{"id": c1.name, "role": r.role, "credentials": []string{c1.name}, "transport": "http"}
			coverage["forged-caller"]++
		}
		if m := routed(ct, grant, claimed, "another person's bearer with the grant"); m["status"] == "success" {
			fail("%s ran %s's approved call through the mesh: %v", ct, c1, m)
		}
		coverage["thief/grant"]++
		unchanged("another person's routed use of the grant")
	}

	c2 := w.cred(r)
	withGrant := rng.IntN(2) == 0
	g := ""
	if withGrant {
		g = grant
		coverage["ran/grant"]++
	} else {
		coverage["ran/plain"]++
	}
	if c2.name != c1.name {
		coverage["ran/other-credential"]++
	}
	if m := routed(c2, g, nil, "the requester's repeat"); m["status"] != "success" {
		fail("the approved routed call did not run for %s (asked as %s, approved by %s): %v", c2, c1, cs, m)
	}
	if got := w.writes(); got != before+1 {
		fail("the approved call wrote %d times, want 1", got-before)
	}
	res.runner = c2.name
	before++
	if rng.IntN(2) == 0 {
		routed(w.cred(r), grant, nil, "the grant again")
		unchanged("the grant again")
	}
	if st := w.state(id); st != "gone" {
		fail("the redeemed request is still in the book as %q", st)
	}
	return res
}
