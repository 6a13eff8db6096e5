package e2e

// Hostile tests of the two-person rule against the built binary: grants
// raced, replayed, moved to another call, person or gateway; approvers
// racing, demoted or joined with the requester by a reload; identities
// built from every combination of token, JWT and client certificate; a
// request routed through the mesh; the audit trail of both parties. Every
// test asserts the safe outcome: the simulator's heater (or fan) is
// written at most as often as a legitimate approval allows.

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/internal/testpki"
)

// atkDecide posts a decision on id with the given Authorization values and
// returns the status and the decoded body.
func atkDecide(t *testing.T, d *daemon, id, body string, auth ...string) (int, map[string]any) {
	t.Helper()
	c, _, b := hsReq(t, d, "POST", "/approvals/"+id, "", "", body, auth...)
	var m map[string]any
	json.Unmarshal([]byte(b), &m)
	if m == nil {
		m = map[string]any{"raw": b}
	}
	return c, m
}

// atkPending makes cs's call of tool pending and returns its approval id.
func atkPending(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) string {
	t.Helper()
	return approvalID(t, structured(t, call(t, cs, tool, args)))
}

// atkZoneC is the number of writes of zone_c.heater.
func atkZoneC(t *testing.T, d *daemon) uint64 { return d.sim(t).writes("zone_c.heater") }

// atkGrantWith sends tool with args and the grant as requestState.
func atkGrantWith(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any, grant string) hAnswer {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args, RequestState: grant})
	return decodeDo(t, res, err)
}

// ---- grants moved to another gateway ----------------------------------

// TestAttackGrantAtTwinGateway: two gateways run the same manifest (so the
// same device id) and policy and share PHYSD_APPROVAL_KEY (a redundant
// pair, or a fleet provisioned from one image). sup1 approves op1's call
// on gateway 1; op1 sends the grant to gateway 2 with the same arguments
// and key. Gateway 2 must not actuate: the contract binds a grant to the
// gateway. Control: the grant still runs once on gateway 1.
func TestAttackGrantAtTwinGateway(t *testing.T) {
	t.Setenv("PHYSD_APPROVAL_KEY", strings.Repeat("7c", 32))
	dir := t.TempDir()
	man, pol := apManifest(t, dir), apPolicy(t, dir, "")
	d1 := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}})
	d2 := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}})
	op1 := connectAs(t, d1, "2026-07-28", apOp1Token, accept)
	grant := requestApproved(t, d1, op1, "twin-1")

	op2 := connectAs(t, d2, "2026-07-28", apOp1Token, accept)
	a := withGrant(t, op2, "twin-1", grant)
	if w := atkZoneC(t, d2); w != 0 || a.Status == "success" {
		t.Errorf("gateway 1's grant, sent to gateway 2 (same manifest, same PHYSD_APPROVAL_KEY): status=%q code=%q, gateway 2's zone_c.heater written %d times; want no write: %s%s",
			a.Status, a.Code, w, a.raw, a.toolErr)
	}
	// The plain repeat at gateway 2 (the recorded answer at most): no further write.
	w2 := atkZoneC(t, d2)
	doCall(t, op2, "do_heater_zone_c", apArgs("twin-1"))
	if w := atkZoneC(t, d2); w != w2 {
		t.Errorf("the plain repeat at gateway 2 wrote again: %d", w-w2)
	}
	// Control: gateway 1 runs its own grant once.
	if a := withGrant(t, op1, "twin-1", grant); a.Status != "success" {
		t.Errorf("the grant at the gateway that gave it: %s%s", a.raw, a.toolErr)
	}
	if w := atkZoneC(t, d1); w != 1 {
		t.Errorf("gateway 1's zone_c.heater written %d times, want 1", w)
	}
	t.Logf("total writes for one approval: gateway 1 %d, gateway 2 %d", atkZoneC(t, d1), atkZoneC(t, d2))
}

// ---- one grant used many times at once ---------------------------------

// TestAttackConcurrentGrantUses: one grant, 24 concurrent uses over three
// sessions of the requester (plain repeats and the grant as requestState
// mixed), plus the grant with other keys at the same time: exactly one
// actuation, one approval_redeemed audit line.
func TestAttackConcurrentGrantUses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	man, pol := apManifest(t, dir), apPolicy(t, dir, "")
	d := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}})
	op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
	grant := requestApproved(t, d, op, "conc-1")
	sessions := []*mcp.ClientSession{op, connectAs(t, d, "2026-07-28", apOp1Token, accept), connectAs(t, d, "2025-11-25", apOp1Token, nil)}
	var wg sync.WaitGroup
	answers := make([]hAnswer, 32)
	start := make(chan struct{})
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			cs := sessions[i%len(sessions)]
			key := "conc-1"
			if i >= 24 {
				key = fmt.Sprintf("conc-1-other-%d", i) // the grant with another key
			}
			p := &mcp.CallToolParams{Name: "do_heater_zone_c", Arguments: apArgs(key)}
			if i%2 == 0 || i >= 24 {
				p.RequestState = grant
			}
			res, err := cs.CallTool(context.Background(), p)
			answers[i] = decodeDo(t, res, err)
		}()
	}
	close(start)
	wg.Wait()
	ok := 0
	for i, a := range answers {
		if a.Status == "success" {
			ok++
			if i >= 24 {
				t.Errorf("the grant with another key (%d) ran: %s", i, a.raw)
			}
		}
	}
	if w := atkZoneC(t, d); w != 1 {
		t.Errorf("one grant used 24 times at once wrote zone_c.heater %d times, want 1", w)
	}
	if n := len(auditEvents(t, d.state, "approval_redeemed")); n != 1 {
		t.Errorf("%d approval_redeemed audit lines, want 1", n)
	}
	t.Logf("%d of 32 answers were success (the replays of the recorded answer included)", ok)
}

// ---- a grant moved to another call or person ---------------------------

// TestAttackGrantMisuse: op1's grant sent with another key, value, tool,
// and by other people (sup2, the approver sup1 itself, admin), then the
// approver's plain repeat of op1's call: nothing runs. The requester's own
// use then runs once.
func TestAttackGrantMisuse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	man, pol := apManifest(t, dir), apPolicy(t, dir, "")
	d := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}})
	op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
	grant := requestApproved(t, d, op, "misuse-1")
	args := apArgs("misuse-1")
	for _, c := range []struct {
		what string
		tool string
		args map[string]any
	}{
		{"another key", "do_heater_zone_c", apArgs("misuse-2")},
		{"another value", "do_heater_zone_c", map[string]any{"value": 71, "idempotency_key": "misuse-1"}},
		{"the same value as a string", "do_heater_zone_c", map[string]any{"value": "70", "idempotency_key": "misuse-1"}},
		{"70.0", "do_heater_zone_c", map[string]any{"value": 70.04, "idempotency_key": "misuse-1"}},
		{"another tool", "do_heater_zone_a", args},
		{"another tool, the family", "do_heater", map[string]any{"zone": "zone_a", "value": 70, "idempotency_key": "misuse-1"}},
	} {
		a := atkGrantWith(t, op, c.tool, c.args, grant)
		if a.Status == "success" {
			t.Errorf("op1's grant with %s ran: %s", c.what, a.raw)
		}
	}
	for _, who := range []struct{ name, token string }{{"sup2", apSup2Token}, {"sup1 (the approver)", apSup1Token}, {"admin", adminDemoToken}, {"operator_console", operatorToken}} {
		cs := connectAs(t, d, "2026-07-28", who.token, accept)
		if a := atkGrantWith(t, cs, "do_heater_zone_c", args, grant); a.Status == "success" {
			t.Errorf("%s ran op1's grant: %s", who.name, a.raw)
		}
		if a := doCall(t, cs, "do_heater_zone_c", args); a.Status == "success" {
			t.Errorf("%s's plain repeat of op1's approved call ran: %s", who.name, a.raw)
		}
	}
	if w := d.totalWrites(t); w != 0 {
		t.Fatalf("misused grants wrote %d times", w)
	}
	// The grant through the family tool with the same key for zone_c: the
	// same capability, so the binding (tool do_heater_zone_c) must hold or refuse,
	// never run twice.
	if a := doCall(t, op, "do_heater_zone_c", args); a.Status != "success" {
		t.Errorf("op1's own repeat after the attacks: %s%s", a.raw, a.toolErr)
	}
	atkGrantWith(t, op, "do_heater", map[string]any{"zone": "zone_c", "value": 70, "idempotency_key": "misuse-1"}, grant)
	if w := atkZoneC(t, d); w != 1 {
		t.Errorf("zone_c.heater written %d times, want 1", w)
	}
}

// TestAttackGrantForgedExpiry: with PHYSD_APPROVAL_KEY known, a real
// grant re-signed with an expiry in the past, or issued in the future,
// never runs; the re-signed original runs once (so the forgery is valid
// apart from the times).
func TestAttackGrantForgedExpiry(t *testing.T) {
	keyHex := strings.Repeat("3e", 32)
	t.Setenv("PHYSD_APPROVAL_KEY", keyHex)
	key, _ := hex.DecodeString(keyHex)
	dir := t.TempDir()
	man, pol := apManifest(t, dir), apPolicy(t, dir, "")
	d := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}})
	op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
	grant := requestApproved(t, d, op, "forge-1")
	p64, _, _ := strings.Cut(strings.TrimPrefix(grant, "grant."), ".")
	raw, err := base64.RawURLEncoding.DecodeString(p64)
	if err != nil {
		t.Fatal(err)
	}
	var g map[string]any
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	resign := func(edit func(map[string]any)) string {
		c := map[string]any{}
		for k, v := range g {
			c[k] = v
		}
		edit(c)
		if c["nonce"] == g["nonce"] {
			c["nonce"] = fmt.Sprintf("forged-%d", time.Now().UnixNano()) // a spent forgery must not spend the control's nonce
		}
		b, _ := json.Marshal(c)
		p := base64.RawURLEncoding.EncodeToString(b)
		m := hmac.New(sha256.New, key)
		m.Write([]byte("physd-grant/v2."))
		m.Write([]byte(p))
		return "grant." + p + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
	}
	now := time.Now().Unix()
	for _, c := range []struct {
		what string
		edit func(map[string]any)
	}{
		{"expired a second ago", func(c map[string]any) { c["exp"] = now - 1; c["iat"] = now - 601 }},
		{"issued an hour in the future", func(c map[string]any) { c["iat"] = now + 3600; c["exp"] = now + 4200 }},
		{"approver = the requester", func(c map[string]any) { c["approver"] = c["caller"] }},
		{"approver a token the policy does not have", func(c map[string]any) {
			c["approver"] = map[string]any{"id": "token:ghost", "role": "admin", "credentials": []string{"token:ghost"}}
		}},
	} {
		if a := withGrant(t, op, "forge-1", resign(c.edit)); a.Status == "success" {
			t.Errorf("a grant %s ran: %s", c.what, a.raw)
		}
	}
	wantNoWrites(t, d, "after the forged grants")
	if a := withGrant(t, op, "forge-1", resign(func(map[string]any) {})); a.Status != "success" {
		t.Errorf("the re-signed grant, only its nonce changed: %s%s", a.raw, a.toolErr)
	}
	if w := atkZoneC(t, d); w != 1 {
		t.Errorf("zone_c.heater written %d times, want 1", w)
	}
}

// ---- deciders racing ---------------------------------------------------

// TestAttackDecidersRace: on each of 6 requests, sup1 and sup2 approve
// and admin denies at once, while op1 repeats its call: exactly one
// decision wins (200, the others 409), and the heater runs at most once
// per request, never after a winning deny.
func TestAttackDecidersRace(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	man, pol := apManifest(t, dir), apPolicy(t, dir, "")
	d := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}})
	op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
	approvedRuns := uint64(0)
	for r := range 6 {
		key := fmt.Sprintf("race-%d", r)
		id := atkPending(t, op, "do_heater_zone_c", apArgs(key))
		before := atkZoneC(t, d)
		type out struct {
			code  int
			m     map[string]any
			who   string
			grant string
		}
		var wg sync.WaitGroup
		outs := make([]out, 3)
		deciders := []struct{ who, token, body string }{
			{"sup1", apSup1Token, `{"decision":"approve"}`},
			{"sup2", apSup2Token, `{"decision":"approve"}`},
			{"admin", adminDemoToken, `{"decision":"deny","reason":"race"}`},
		}
		start := make(chan struct{})
		for i, dc := range deciders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				c, m := atkDecide(t, d, id, dc.body, "Bearer "+dc.token)
				g, _ := m["grant"].(string)
				outs[i] = out{c, m, dc.who, g}
			}()
		}
		repeats := make([]hAnswer, 4)
		for i := range repeats {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				repeats[i] = doCall(t, op, "do_heater_zone_c", apArgs(key))
			}()
		}
		close(start)
		wg.Wait()
		won, winner := 0, ""
		for _, o := range outs {
			switch o.code {
			case 200:
				won++
				winner = o.who
			case 409, 404: // 404: a racing repeat already took the decision
			default:
				t.Errorf("%s: %s's decision answered %d %v, want 200, 409 or 404", key, o.who, o.code, o.m)
			}
		}
		if won != 1 {
			t.Errorf("%s: %d decisions won: %+v", key, won, outs)
		}
		// The repeat after the race takes the decision.
		final := doCall(t, op, "do_heater_zone_c", apArgs(key))
		w := atkZoneC(t, d) - before
		switch {
		case winner == "admin" && w != 0:
			t.Errorf("%s: admin's deny won, yet zone_c.heater was written %d times (final %s)", key, w, final.raw)
		case winner != "admin" && w != 1:
			t.Errorf("%s: %s's approval won, zone_c.heater written %d times, want 1 (final %s%s)", key, winner, w, final.raw, final.toolErr)
		}
		if winner != "admin" {
			approvedRuns++
		}
		// Every losing grant is empty.
		for _, o := range outs {
			if o.code != 200 && o.grant != "" {
				t.Errorf("%s: a losing decision (%s) got a grant", key, o.who)
			}
		}
	}
	if w := atkZoneC(t, d); w != approvedRuns {
		t.Errorf("zone_c.heater written %d times in all, want %d", w, approvedRuns)
	}
}

// TestAttackApproveThenDeny: sup1 approves; sup2 then denies the same
// request (409, the grant stands, no audit of a deny); op1's repeat runs
// once. A deny first: a later approval is 409 and nothing runs.
func TestAttackApproveThenDeny(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	man, pol := apManifest(t, dir), apPolicy(t, dir, "")
	d := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}})
	op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
	id := atkPending(t, op, "do_heater_zone_c", apArgs("atd-1"))
	if c, m := atkDecide(t, d, id, `{"decision":"deny","reason":"no"}`, "Bearer "+apSup2Token); c != 200 {
		t.Fatalf("sup2's deny: %d %v", c, m)
	}
	if c, m := atkDecide(t, d, id, `{"decision":"approve"}`, "Bearer "+apSup1Token); c != 409 || m["grant"] != nil {
		t.Errorf("an approval after a deny: %d %v, want 409 without a grant", c, m)
	}
	if a := doCall(t, op, "do_heater_zone_c", apArgs("atd-1")); a.Status == "success" || a.Code != "approval_denied" && !strings.Contains(a.raw, "den") {
		t.Logf("the repeat after the deny: %s%s", a.raw, a.toolErr)
	}
	wantNoWrites(t, d, "after a deny then an approval")
	// The denied call asked again with the same key: pending anew, never run.
	if a := doCall(t, op, "do_heater_zone_c", apArgs("atd-1")); a.Status == "success" {
		t.Errorf("the denied call asked again ran: %s", a.raw)
	}
	wantNoWrites(t, d, "after the denied call was asked again")
}

// ---- the approver's role and person under a reload ---------------------

// TestAttackApproverDemotedByReload: sup1 approves two of op1's calls, then
// a policy reload makes sup1 an operator (case demoted) or removes its
// token (case removed). Neither the plain repeat nor the grant as
// requestState runs. Control: sup2's approval is unaffected by sup1's
// demotion.
func TestAttackApproverDemotedByReload(t *testing.T) {
	t.Parallel()
	sup1Line := "    - {id: sup1, sha256: " + sha(apSup1Token) + ", role: supervisor}\n"
	for _, tc := range []struct{ name, to string }{
		{"demoted", "    - {id: sup1, sha256: " + sha(apSup1Token) + ", role: operator}\n"},
		{"removed", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			man, pol := apManifest(t, dir), apPolicy(t, dir, "")
			d := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}})
			op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
			gA := requestApproved(t, d, op, "demote-a")
			gB := requestApproved(t, d, op, "demote-b")
			idC := atkPending(t, op, "do_heater_zone_c", apArgs("demote-c"))
			c, m := atkDecide(t, d, idC, `{"decision":"approve"}`, "Bearer "+apSup2Token)
			if c != 200 {
				t.Fatalf("sup2: %d %v", c, m)
			}
			editFile(t, pol, sup1Line, tc.to)
			hupAndWait(t, d, "policy reloaded")
			if a := doCall(t, op, "do_heater_zone_c", apArgs("demote-a")); a.Status == "success" {
				t.Errorf("the repeat approved by sup1, %s since: %s", tc.name, a.raw)
			}
			if a := withGrant(t, op, "demote-b", gB); a.Status == "success" {
				t.Errorf("sup1's grant as requestState, sup1 %s since: %s", tc.name, a.raw)
			}
			if a := withGrant(t, op, "demote-a", gA); a.Status == "success" {
				t.Errorf("sup1's first grant as requestState, sup1 %s since: %s", tc.name, a.raw)
			}
			wantNoWrites(t, d, "after sup1's grants were used, sup1 "+tc.name)
			if a := doCall(t, op, "do_heater_zone_c", apArgs("demote-c")); a.Status != "success" {
				t.Errorf("sup2's approval after sup1 was %s: %s%s", tc.name, a.raw, a.toolErr)
			}
			if w := atkZoneC(t, d); w != 1 {
				t.Errorf("zone_c.heater written %d times, want 1 (sup2's approval)", w)
			}
		})
	}
}

// TestAttackPeopleJoinAfterApproval: sup1 approves op1's calls; a reload
// then lists op1 and sup1 under one person (identity.people). The approval
// is now a self-approval: the repeat and the grant as requestState are
// refused and write nothing; the refusal is audited with the caller's
// credentials. A request made after the reload cannot be approved by sup1
// (403) but can by sup2.
func TestAttackPeopleJoinAfterApproval(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	man, pol := apManifest(t, dir), apPolicy(t, dir, "")
	d := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}})
	op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
	requestApproved(t, d, op, "join-a")
	gB := requestApproved(t, d, op, "join-b")
	editFile(t, pol, "\nemergency:", "  people:\n    - name: olga\n      tokens: [op1, sup1]\n\nemergency:")
	hupAndWait(t, d, "policy reloaded")
	if a := doCall(t, op, "do_heater_zone_c", apArgs("join-a")); a.Status == "success" {
		t.Errorf("the repeat approved by sup1, joined with op1 since: %s", a.raw)
	} else {
		t.Logf("the repeat: %s%s", a.raw, a.toolErr)
	}
	if a := withGrant(t, op, "join-b", gB); a.Status == "success" {
		t.Errorf("sup1's grant as requestState, joined with op1 since: %s", a.raw)
	}
	if a := doCall(t, op, "do_heater_zone_c", apArgs("join-b")); a.Status == "success" {
		t.Errorf("the repeat of join-b after its grant was refused: %s", a.raw)
	}
	wantNoWrites(t, d, "after the join")
	refused := auditEvents(t, d.state, "approval_refused")
	if len(refused) == 0 {
		t.Errorf("no approval_refused audit line for the grants that became self-approvals")
	}
	for _, r := range refused {
		if !strings.Contains(fmt.Sprint(r["credentials"]), "token:op1") {
			t.Errorf("approval_refused lacks the caller's credential: %v", r)
		}
	}
	id := atkPending(t, op, "do_heater_zone_c", apArgs("join-c"))
	if c, m := atkDecide(t, d, id, `{"decision":"approve"}`, "Bearer "+apSup1Token); c != 403 {
		t.Errorf("sup1, joined with op1, approving op1's new request: %d %v, want 403", c, m)
	}
	if c, m := atkDecide(t, d, id, `{"decision":"approve"}`, "Bearer "+apSup2Token); c != 200 {
		t.Errorf("sup2 approving op1's new request: %d %v", c, m)
	}
	if a := doCall(t, op, "do_heater_zone_c", apArgs("join-c")); a.Status != "success" {
		t.Errorf("sup2's approval: %s%s", a.raw, a.toolErr)
	}
	if w := atkZoneC(t, d); w != 1 {
		t.Errorf("zone_c.heater written %d times, want 1", w)
	}
}

// TestAttackPolicyReloadDefaults: a reload that changes defaults.rate_limit
// (which applies to do_heater_zone_c) voids sup1's approval; one that
// changes do_irrigation_valve's own rule does not.
func TestAttackPolicyReloadDefaults(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		old, new string
		void     bool
	}{
		{"defaults.rate_limit", "  rate_limit: 120/hour", "  rate_limit: 100/hour", true},
		{"defaults.max_change_percent added", "  audit_all: true", "  audit_all: true\n  max_change_percent: 90", true},
		{"defaults.require_permission none to viewer (below the tool's operator: no effect)", "  require_permission: none", "  require_permission: viewer", false},
		{"another tool's rate", `{type: rate, max: "20/hour"}`, `{type: rate, max: "19/hour"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			man, pol := apManifest(t, dir), apPolicy(t, dir, "")
			d := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}})
			op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
			grantA := requestApproved(t, d, op, "defaults-a")
			grantB := requestApproved(t, d, op, "defaults-b")
			editFile(t, pol, tc.old, tc.new)
			hupAndWait(t, d, "policy reloaded")
			a := doCall(t, op, "do_heater_zone_c", apArgs("defaults-a"))
			b := withGrant(t, op, "defaults-b", grantB)
			if tc.void {
				wantVoid(t, "the repeat", a)
				wantVoid(t, "the grant as requestState", b)
				withGrant(t, op, "defaults-a", grantA)
				wantNoWrites(t, d, "after "+tc.name+" changed")
				return
			}
			if a.Status != "success" || b.Status != "success" {
				t.Errorf("after an unrelated change: %s%s / %s%s", a.raw, a.toolErr, b.raw, b.toolErr)
			}
			if w := atkZoneC(t, d); w != 2 {
				t.Errorf("zone_c.heater written %d times, want 2", w)
			}
		})
	}
}

// ---- the Authorization header ------------------------------------------

// TestAttackAuthorizationTricks: op1's request can never be approved with
// op1's own token however the header is spelled, nor with two headers that
// mix op1 and sup1; the spellings of sup1's token that the boundary does
// accept approve as sup1 (a second person), and no refused spelling decides.
func TestAttackAuthorizationTricks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	man, pol := apManifest(t, dir), apPolicy(t, dir, "")
	d := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}})
	op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
	id := atkPending(t, op, "do_heater_zone_c", apArgs("auth-1"))
	for _, auth := range [][]string{
		{"Bearer " + apOp1Token}, {"bearer " + apOp1Token}, {"BEARER " + apOp1Token}, {"Bearer " + apOp1Token + " "},
		{"Bearer " + apSup1Token, "Bearer " + apOp1Token}, {"Bearer " + apOp1Token, "Bearer " + apSup1Token},
		{"Bearer " + apSup1Token + "," + apOp1Token}, {"Bearer " + apOp1Token + "\t"},
		{"Bearer  " + apSup1Token}, {"Bearer\t" + apSup1Token}, {"Bearer " + apSup1Token + " x"},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("sup1:"+apSup1Token))}, {"Token " + apSup1Token}, {apSup1Token},
		{"Bearer " + strings.ToUpper(apSup1Token)}, {"Bearer " + sha(apSup1Token)},
	} {
		c, m := atkDecide(t, d, id, `{"decision":"approve"}`, auth...)
		if c == 200 {
			t.Errorf("Authorization %q approved op1's request: %v", auth, m)
		}
	}
	if a := doCall(t, op, "do_heater_zone_c", apArgs("auth-1")); a.Status == "success" {
		t.Errorf("the repeat after the tricks ran: %s", a.raw)
	}
	wantNoWrites(t, d, "after the header tricks")
	// A lower-case scheme with sup1's token is sup1: a second person.
	if c, m := atkDecide(t, d, id, `{"decision":"approve"}`, "bearer "+apSup1Token); c != 200 {
		t.Errorf("lower-case bearer with sup1's token: %d %v", c, m)
	}
	if a := doCall(t, op, "do_heater_zone_c", apArgs("auth-1")); a.Status != "success" {
		t.Errorf("the repeat approved by sup1: %s%s", a.raw, a.toolErr)
	}
	if w := atkZoneC(t, d); w != 1 {
		t.Errorf("zone_c.heater written %d times, want 1", w)
	}
	// The MCP session of op1 that sends an extra caller header: the boundary
	// owns Physd-Verified-Caller.
	c, _, b := hsReq(t, d, "POST", "/approvals/nope", "", "", `{"decision":"approve"}`, "Bearer "+apOp1Token)
	if c != 404 {
		t.Logf("unknown id as op1: %d %s", c, b)
	}
}

// ---- certificates and tokens -------------------------------------------

// atkTLS is a TLS daemon with the site PKI and a policy whose identity is
// extra.
type atkTLS struct {
	d    *daemon
	pki  *sitePKI
	base string
}

func startAtkTLS(t *testing.T, identity string, edit func(pol string)) *atkTLS {
	t.Helper()
	pki := newSitePKI(t)
	pol := apPolicy(t, t.TempDir(), identity)
	if edit != nil {
		edit(pol)
	}
	if out, err := exec.Command(physdBin, "validate", "--policy", pol, greenhouse).CombinedOutput(); err != nil {
		t.Fatalf("the policy does not validate: %v\n%s", err, out)
	}
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol,
		"--tls-cert", pki.certFile, "--tls-key", pki.keyFile, "--tls-client-ca", pki.caFile}})
	return &atkTLS{d: d, pki: pki, base: "https://" + d.addr}
}

func (x *atkTLS) issue(t *testing.T, s testpki.Spec) *tls.Certificate {
	t.Helper()
	s.Client = true
	l, err := x.pki.ca.Issue(s)
	if err != nil {
		t.Fatal(err)
	}
	c, err := l.TLS()
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

func (x *atkTLS) writes(t *testing.T) uint64 {
	t.Helper()
	code, body := httpsGet(t, x.pki.client(nil, adminDemoToken), x.base+"/sim/plant/")
	var s simState
	if err := json.Unmarshal([]byte(body), &s); code != 200 || err != nil {
		t.Fatalf("sim state: %d %v %s", code, err, body)
	}
	return s.writes("zone_c.heater") + s.writes("zone_b.heater")
}

func (x *atkTLS) connect(t *testing.T, hc *http.Client) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "physd-attack-tls", Version: "1"},
		&mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{}}, ElicitationHandler: accept})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: x.base + "/mcp", HTTPClient: hc},
		&mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, x.d.stderr.String())
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func (x *atkTLS) approve(t *testing.T, hc *http.Client, id string) (int, string) {
	t.Helper()
	resp, err := hc.Post(x.base+"/approvals/"+id, "application/json", strings.NewReader(`{"decision":"approve"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAttackUnmappedCertPlusToken: op1 requests with its token and a client
// certificate no mtls rule maps; sup1 approves with its own token and the
// same certificate: one person (the certificate's fingerprint), 403, no
// write. sup1's token alone is another person: 200 and one write.
func TestAttackUnmappedCertPlusToken(t *testing.T) {
	t.Parallel()
	x := startAtkTLS(t, "  providers:\n    - type: mtls\n      clients:\n        - {cn: someone-else, role: viewer}\n", nil)
	shared := x.issue(t, testpki.Spec{CN: "shared-laptop"})
	cs := x.connect(t, x.pki.client(shared, apOp1Token))
	id := atkPending(t, cs, "do_heater_zone_c", apArgs("unmapped-1"))
	if c, b := x.approve(t, x.pki.client(shared, apSup1Token), id); c != 403 {
		t.Errorf("sup1 with op1's (unmapped) certificate approved op1's request: %d %s, want 403", c, b)
	}
	if a := doCall(t, cs, "do_heater_zone_c", apArgs("unmapped-1")); a.Status == "success" {
		t.Errorf("the repeat ran: %s", a.raw)
	}
	if w := x.writes(t); w != 0 {
		t.Fatalf("%d writes after a self-approval by a shared certificate", w)
	}
	// The unmapped certificate alone opens no door.
	if c, b := x.approve(t, x.pki.client(shared, ""), id); c/100 == 2 {
		t.Errorf("the unmapped certificate alone approved: %d %s", c, b)
	}
	if c, b := x.approve(t, x.pki.client(nil, apSup1Token), id); c != 200 {
		t.Fatalf("sup1's token alone: %d %s", c, b)
	}
	if a := doCall(t, cs, "do_heater_zone_c", apArgs("unmapped-1")); a.Status != "success" {
		t.Errorf("the repeat approved by sup1: %s%s", a.raw, a.toolErr)
	}
	if w := x.writes(t); w != 1 {
		t.Errorf("%d writes, want 1", w)
	}
	// The audit shows the certificate's fingerprint among op1's credentials.
	found := false
	for _, r := range auditEvents(t, x.d.state, "approval_approved") {
		if strings.Contains(fmt.Sprint(r["data"]), "certfp:") {
			found = true
		}
	}
	if !found {
		t.Errorf("approval_approved does not record the requester's certificate fingerprint: %v", auditEvents(t, x.d.state, "approval_approved"))
	}
}

// TestAttackCertTokenRolesDisagree: a token and a mapped certificate whose
// roles differ are refused together (403) on the approvals route and on
// /mcp: sup1's supervisor token with an operator certificate cannot
// approve, and op1's operator token with a supervisor certificate cannot
// request nor approve.
func TestAttackCertTokenRolesDisagree(t *testing.T) {
	t.Parallel()
	x := startAtkTLS(t, "  providers:\n    - type: mtls\n      clients:\n        - {cn: op-cert, role: operator}\n        - {cn: sup-cert, role: supervisor}\n", nil)
	opCert := x.issue(t, testpki.Spec{CN: "op-cert"})
	supCert := x.issue(t, testpki.Spec{CN: "sup-cert"})
	cs := x.connect(t, x.pki.client(nil, apOp1Token))
	id := atkPending(t, cs, "do_heater_zone_c", apArgs("disagree-1"))
	for _, c := range []struct {
		what string
		hc   *http.Client
	}{
		{"sup1's token + an operator certificate", x.pki.client(opCert, apSup1Token)},
		{"op1's token + a supervisor certificate", x.pki.client(supCert, apOp1Token)},
		{"the operator certificate", x.pki.client(opCert, "")},
	} {
		if code, b := x.approve(t, c.hc, id); code == 200 {
			t.Errorf("%s approved: %d %s", c.what, code, b)
		}
	}
	if a := doCall(t, cs, "do_heater_zone_c", apArgs("disagree-1")); a.Status == "success" {
		t.Errorf("the repeat ran: %s", a.raw)
	}
	if w := x.writes(t); w != 0 {
		t.Errorf("%d writes", w)
	}
	// The supervisor certificate alone is another person than op1's token.
	if code, b := x.approve(t, x.pki.client(supCert, ""), id); code != 200 {
		t.Errorf("the supervisor certificate: %d %s", code, b)
	}
}

// TestAttackCertSANCase: one person holds two certificates for the DNS
// name sup.greenhouse.example, spelled in different cases. Whichever
// requests, the other cannot approve (the rule maps both to one name).
// Control: sup2's token approves.
func TestAttackCertSANCase(t *testing.T) {
	t.Parallel()
	x := startAtkTLS(t, "  providers:\n    - type: mtls\n      clients:\n        - {san: sup.greenhouse.example, role: supervisor}\n", nil)
	lower := x.issue(t, testpki.Spec{CN: "laptop", DNS: []string{"sup.greenhouse.example"}})
	upper := x.issue(t, testpki.Spec{CN: "phone", DNS: []string{"SUP.Greenhouse.Example"}})
	trailing := x.issue(t, testpki.Spec{CN: "tablet", DNS: []string{"sup.greenhouse.example."}})
	for i, c := range []struct{ req, app *tls.Certificate }{{lower, upper}, {upper, lower}} {
		key := fmt.Sprintf("san-case-%d", i)
		cs := x.connect(t, x.pki.client(c.req, ""))
		id := atkPending(t, cs, "do_heater_zone_c", apArgs(key))
		if code, b := x.approve(t, x.pki.client(c.app, ""), id); code != 403 {
			t.Errorf("%s: the same SAN in another case approved: %d %s, want 403", key, code, b)
		}
		if code, b := x.approve(t, x.pki.client(trailing, ""), id); code == 200 {
			t.Errorf("%s: the SAN with a trailing dot approved: %d %s", key, code, b)
		}
		if a := doCall(t, cs, "do_heater_zone_c", apArgs(key)); a.Status == "success" {
			t.Errorf("%s: the repeat ran: %s", key, a.raw)
		}
	}
	if w := x.writes(t); w != 0 {
		t.Fatalf("%d writes after SAN-case self-approvals", w)
	}
	cs := x.connect(t, x.pki.client(upper, ""))
	id := atkPending(t, cs, "do_heater_zone_c", apArgs("san-case-ok"))
	if code, b := x.approve(t, x.pki.client(nil, apSup2Token), id); code != 200 {
		t.Fatalf("sup2: %d %s", code, b)
	}
	if a := doCall(t, cs, "do_heater_zone_c", apArgs("san-case-ok")); a.Status != "success" {
		t.Errorf("sup2's approval: %s%s", a.raw, a.toolErr)
	}
}

// TestAttackPeopleCertNamedByAnotherRule: alice's certificate carries CN
// alice-cert and SAN alice.greenhouse.example, and two mtls rules map it
// (the SAN rule first). identity.people lists alice's operator token and
// her certificate by its CN rule's name. The certificate is alice's, so it
// must not approve what her token asked, whichever rule matched it.
func TestAttackPeopleCertNamedByAnotherRule(t *testing.T) {
	t.Parallel()
	const aliceOp = "attack-alice-operator-token"
	identity := "  providers:\n    - type: mtls\n      clients:\n        - {san: alice.greenhouse.example, role: supervisor}\n        - {cn: alice-cert, role: supervisor}\n" +
		"  people:\n    - name: alice\n      tokens: [alice_op]\n      certs: [alice-cert]\n"
	x := startAtkTLS(t, identity, func(pol string) {
		editFile(t, pol, "    - {id: site_admin,", "    - {id: alice_op, sha256: "+sha(aliceOp)+", role: operator}\n    - {id: site_admin,")
	})
	cert := x.issue(t, testpki.Spec{CN: "alice-cert", DNS: []string{"alice.greenhouse.example"}})
	cs := x.connect(t, x.pki.client(nil, aliceOp))
	id := atkPending(t, cs, "do_heater_zone_c", apArgs("people-cert-1"))
	code, b := x.approve(t, x.pki.client(cert, ""), id)
	if code != 403 {
		t.Errorf("alice's certificate (listed under alice by its CN) approved what alice's token asked: %d %s, want 403", code, b)
	}
	a := doCall(t, cs, "do_heater_zone_c", apArgs("people-cert-1"))
	if w := x.writes(t); w != 0 || a.Status == "success" {
		t.Errorf("alice approved herself with her certificate: repeat %q, %d writes", a.Status, w)
	}
}

// ---- JWT -----------------------------------------------------------------

const (
	atkIss1 = "https://idp.greenhouse.example"
	atkIss2 = "https://idp.greenhouse.example/a"
)

// atkJWT signs a JWT for iss with the claims.
func atkJWT(t *testing.T, secret []byte, iss string, claims jwt.MapClaims) string {
	t.Helper()
	c := jwt.MapClaims{"iss": iss, "aud": "physd", "exp": time.Now().Add(time.Hour).Unix()}
	for k, v := range claims {
		c[k] = v
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// atkJWTPolicy is the approval policy with two JWT providers whose issuers
// are a path prefix of each other, and identity extra.
func atkJWTPolicy(t *testing.T, dir string, secret []byte, extra string) string {
	t.Helper()
	sf := filepath.Join(dir, "hs256.secret")
	if err := os.WriteFile(sf, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	providers := "  providers:\n" +
		"    - {type: jwt, issuer: \"" + atkIss1 + "\", audience: physd, hs256_secret_file: " + sf + "}\n" +
		"    - {type: jwt, issuer: \"" + atkIss2 + "\", audience: physd, hs256_secret_file: " + sf + "}\n"
	return apPolicy(t, dir, providers+extra)
}

// TestAttackJWTIdentities: same subject at two issuers (two people unless
// identity.people joins them); a person joined across issuers; JWTs
// without a subject; an issuer/subject pair that collides with another
// issuer's when the two are written as one credential.
func TestAttackJWTIdentities(t *testing.T) {
	t.Parallel()
	secret := []byte(strings.Repeat("k", 40))
	dir := t.TempDir()
	people := "  people:\n    - name: carol\n      jwt:\n        - {issuer: \"" + atkIss1 + "\", subject: carol}\n        - {issuer: \"" + atkIss2 + "\", subject: carol}\n"
	pol := atkJWTPolicy(t, dir, secret, people)
	if out, err := exec.Command(physdBin, "validate", "--policy", pol, greenhouse).CombinedOutput(); err != nil {
		t.Fatalf("the policy does not validate: %v\n%s", err, out)
	}
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	tok := func(iss string, c jwt.MapClaims) string { return atkJWT(t, secret, iss, c) }
	t.Run("same subject, another issuer, joined by people", func(t *testing.T) {
		cs := connectAs(t, d, "2026-07-28", tok(atkIss1, jwt.MapClaims{"sub": "carol", "role": "operator"}), accept)
		id := atkPending(t, cs, "do_heater_zone_c", apArgs("jwt-carol"))
		if c, m := atkDecide(t, d, id, `{"decision":"approve"}`, "Bearer "+tok(atkIss2, jwt.MapClaims{"sub": "carol", "role": "supervisor"})); c != 403 {
			t.Errorf("carol at the second issuer approved carol at the first (people joins them): %d %v", c, m)
		}
		if a := doCall(t, cs, "do_heater_zone_c", apArgs("jwt-carol")); a.Status == "success" {
			t.Errorf("the repeat ran: %s", a.raw)
		}
	})
	t.Run("the same JWT subject with two roles", func(t *testing.T) {
		cs := connectAs(t, d, "2026-07-28", tok(atkIss1, jwt.MapClaims{"sub": "dave", "role": "operator"}), accept)
		id := atkPending(t, cs, "do_heater_zone_c", apArgs("jwt-dave"))
		if c, m := atkDecide(t, d, id, `{"decision":"approve"}`, "Bearer "+tok(atkIss1, jwt.MapClaims{"sub": "dave", "role": "supervisor", "jti": "x"})); c != 403 {
			t.Errorf("dave's supervisor JWT approved dave's operator JWT's request: %d %v", c, m)
		}
	})
	t.Run("no subject", func(t *testing.T) {
		// A JWT without a non-empty string sub names nobody: refused at the
		// boundary (401) for calls and decisions alike, so no two such
		// tokens are ever one person or two.
		for name, c := range map[string]jwt.MapClaims{"absent": {"role": "operator"}, "numeric": {"sub": 4711, "role": "operator"}, "empty": {"sub": "", "role": "supervisor"}} {
			req, _ := http.NewRequest(http.MethodPost, d.url("/mcp"), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Authorization", "Bearer "+tok(atkIss1, c))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 401 || !strings.Contains(string(body), "sub") {
				t.Errorf("a JWT with %s sub: %d %s", name, resp.StatusCode, body)
			}
		}
		id := atkPending(t, connectAs(t, d, "2026-07-28", tok(atkIss1, jwt.MapClaims{"sub": "erin", "role": "operator"}), accept), "do_heater_zone_c", apArgs("jwt-nosub"))
		if c, m := atkDecide(t, d, id, `{"decision":"approve"}`, "Bearer "+tok(atkIss1, jwt.MapClaims{"role": "supervisor"})); c != 401 {
			t.Errorf("a sub-less supervisor JWT deciding: %d %v", c, m)
		}
	})
	t.Run("issuer/subject collision", func(t *testing.T) {
		// victim: iss1, sub "a/bob"; attacker: iss2 (= iss1 + "/a"), sub "bob".
		victim := connectAs(t, d, "2026-07-28", tok(atkIss1, jwt.MapClaims{"sub": "a/bob", "role": "operator"}), accept)
		id := atkPending(t, victim, "do_heater_zone_c", apArgs("jwt-collide"))
		if c, m := atkDecide(t, d, id, `{"decision":"approve"}`, "Bearer "+apSup1Token); c != 200 {
			t.Fatalf("sup1: %d %v", c, m)
		}
		attacker := connectAs(t, d, "2026-07-28", tok(atkIss2, jwt.MapClaims{"sub": "bob", "role": "operator"}), accept)
		if a := doCall(t, attacker, "do_heater_zone_c", apArgs("jwt-collide")); a.Status == "success" {
			t.Errorf("issuer %q subject \"bob\" took the approval given to issuer %q subject \"a/bob\" (both are credential jwt:%s/a/bob): %s", atkIss2, atkIss1, atkIss1, a.raw)
		}
		// And a supervisor of iss2 named "bob" deciding a request of iss1's "a/bob".
		id = atkPending(t, victim, "do_heater_zone_c", apArgs("jwt-collide-2"))
		c, m := atkDecide(t, d, id, `{"decision":"approve"}`, "Bearer "+tok(atkIss2, jwt.MapClaims{"sub": "bob", "role": "supervisor"}))
		t.Logf("iss2/bob (supervisor) deciding iss1/a/bob's request: %d %v", c, m)
	})
	t.Run("same subject, another issuer, not joined", func(t *testing.T) {
		cs := connectAs(t, d, "2026-07-28", tok(atkIss1, jwt.MapClaims{"sub": "erin", "role": "operator"}), accept)
		id := atkPending(t, cs, "do_heater_zone_c", apArgs("jwt-erin"))
		c, m := atkDecide(t, d, id, `{"decision":"approve"}`, "Bearer "+tok(atkIss2, jwt.MapClaims{"sub": "erin", "role": "supervisor"}))
		t.Logf("erin at another issuer, not joined (two people by the contract): %d %v", c, m)
		if c != 200 {
			t.Errorf("by the contract (a JWT person is issuer+subject), %s/erin is another person than %s/erin: got %d", atkIss2, atkIss1, c)
		}
	})
}

// TestAttackJWTApproverIssuerRemoved: a supervisor JWT approves op1's
// calls; a reload then removes the JWT provider (the issuer is no longer
// trusted). The approver's current role under the policy in force is none:
// neither the repeat nor the grant as requestState may run.
func TestAttackJWTApproverIssuerRemoved(t *testing.T) {
	t.Parallel()
	secret := []byte(strings.Repeat("q", 40))
	dir := t.TempDir()
	sf := filepath.Join(dir, "hs256.secret")
	os.WriteFile(sf, secret, 0o600)
	provider := "  providers:\n    - {type: jwt, issuer: \"" + atkIss1 + "\", audience: physd, hs256_secret_file: " + sf + "}\n"
	man, pol := apManifest(t, dir), apPolicy(t, dir, provider)
	d := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}})
	op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
	sam := "Bearer " + atkJWT(t, secret, atkIss1, jwt.MapClaims{"sub": "sam", "role": "supervisor"})
	idA := atkPending(t, op, "do_heater_zone_c", apArgs("jwt-rm-a"))
	idB := atkPending(t, op, "do_heater_zone_c", apArgs("jwt-rm-b"))
	if c, m := atkDecide(t, d, idA, `{"decision":"approve"}`, sam); c != 200 {
		t.Fatalf("sam: %d %v", c, m)
	}
	c, m := atkDecide(t, d, idB, `{"decision":"approve"}`, sam)
	grantB, _ := m["grant"].(string)
	if c != 200 || grantB == "" {
		t.Fatalf("sam: %d %v", c, m)
	}
	editFile(t, pol, provider, "")
	hupAndWait(t, d, "policy reloaded")
	if c, _ := atkDecide(t, d, "nope", `{"decision":"approve"}`, sam); c != 401 {
		t.Errorf("sam's JWT after its issuer was removed: %d, want 401", c)
	}
	if a := doCall(t, op, "do_heater_zone_c", apArgs("jwt-rm-a")); a.Status == "success" {
		t.Errorf("the repeat approved by a JWT whose issuer was removed since: %s", a.raw)
	}
	if a := withGrant(t, op, "jwt-rm-b", grantB); a.Status == "success" {
		t.Errorf("the grant of a JWT approver whose issuer was removed since: %s", a.raw)
	}
	wantNoWrites(t, d, "after the JWT issuer was removed")
}

// ---- stdio -----------------------------------------------------------------

// TestAttackStdioGrant: the stdio caller (role operator) requests; sup1
// approves over HTTP; an HTTP caller (op1) cannot use the stdio caller's
// grant nor its decision; the stdio caller's grant as requestState runs
// once; a second use writes nothing.
func TestAttackStdioGrant(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	man, pol := apManifest(t, dir), apPolicy(t, dir, "")
	cs, d := startStdio(t, "2026-07-28", daemonOpts{manifest: man, extra: []string{"--policy", pol, "--stdio-role", "operator"}})
	d.token = adminDemoToken
	d.stderr.logValue(t, "ready", "ready")
	r := call(t, cs, "do_heater_zone_c", apArgs("stdio-1"))
	if r.IsError {
		t.Skipf("stdio caller cannot request: %s", text(r))
	}
	id := approvalID(t, structured(t, r))
	c, m := atkDecide(t, d, id, `{"decision":"approve"}`, "Bearer "+apSup1Token)
	grant, _ := m["grant"].(string)
	if c != 200 || grant == "" {
		t.Fatalf("sup1 approving the stdio caller: %d %v", c, m)
	}
	op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
	if a := withGrant(t, op, "stdio-1", grant); a.Status == "success" {
		t.Errorf("op1 over HTTP ran the stdio caller's grant: %s", a.raw)
	}
	if a := doCall(t, op, "do_heater_zone_c", apArgs("stdio-1")); a.Status == "success" {
		t.Errorf("op1 over HTTP took the stdio caller's decision: %s", a.raw)
	}
	wantNoWrites(t, d, "after op1 tried the stdio grant")
	if a := withGrant(t, cs, "stdio-1", grant); a.Status != "success" {
		t.Errorf("the stdio caller's grant: %s%s", a.raw, a.toolErr)
	}
	withGrant(t, cs, "stdio-1", grant)
	if w := atkZoneC(t, d); w != 1 {
		t.Errorf("zone_c.heater written %d times, want 1", w)
	}
}

// ---- audit -----------------------------------------------------------------

// TestAttackAuditBothParties: a self-approval (refused), an approval, its
// redemption and a void approval leave approval_refused, approval_approved,
// approval_redeemed and approval_void lines that name both parties by
// their credentials.
func TestAttackAuditBothParties(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	man, pol := apManifest(t, dir), apPolicy(t, dir, "")
	d := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}})
	op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
	id := atkPending(t, op, "do_heater_zone_c", apArgs("audit-1"))
	if c, _ := atkDecide(t, d, id, `{"decision":"approve"}`, "Bearer "+apOp1Token); c != 403 {
		t.Errorf("self-approval: %d", c)
	}
	if c, _ := atkDecide(t, d, id, `{"decision":"approve"}`, "Bearer "+apSup1Token); c != 200 {
		t.Fatalf("sup1: %d", c)
	}
	if a := doCall(t, op, "do_heater_zone_c", apArgs("audit-1")); a.Status != "success" {
		t.Fatalf("repeat: %s%s", a.raw, a.toolErr)
	}
	requestApproved(t, d, op, "audit-2")
	editCap(t, man, "heater_zone_c", "point: zone_c.heater", "point: zone_b.heater")
	hupAndWait(t, d, "manifest reloaded")
	wantVoid(t, "audit-2 after the rebinding", doCall(t, op, "do_heater_zone_c", apArgs("audit-2")))

	has := func(v any, s string) bool { return strings.Contains(fmt.Sprint(v), s) }
	check := func(event string, want func(r map[string]any) string) {
		t.Helper()
		rs := auditEvents(t, d.state, event)
		if len(rs) == 0 {
			t.Errorf("no %s audit line", event)
			return
		}
		for _, r := range rs {
			if msg := want(r); msg != "" {
				t.Errorf("%s: %s: %v", event, msg, r)
			}
		}
	}
	check("approval_refused", func(r map[string]any) string {
		data, _ := r["data"].(map[string]any)
		if !has(r["credentials"], "token:op1") || !has(data["requested_by_credentials"], "token:op1") {
			return "the self-approval does not record the approver's and the requester's credentials"
		}
		return ""
	})
	check("approval_approved", func(r map[string]any) string {
		data, _ := r["data"].(map[string]any)
		if !has(r["credentials"], "token:sup1") || !has(data["requested_by_credentials"], "token:op1") {
			return "does not record the approver's (sup1) and the requester's (op1) credentials"
		}
		return ""
	})
	check("approval_redeemed", func(r map[string]any) string {
		data, _ := r["data"].(map[string]any)
		if !has(r["credentials"], "token:op1") || !has(data["approver_credentials"], "token:sup1") {
			return "does not record the caller's (op1) and the approver's (sup1) credentials"
		}
		return ""
	})
	check("approval_void", func(r map[string]any) string {
		if !has(r["credentials"], "token:op1") {
			return "does not record the requester's credentials"
		}
		return ""
	})
	// The do line of the approved call names the approver.
	found := false
	for _, r := range auditEvents(t, d.state, "do") {
		if r["idempotency_key"] == "audit-1" {
			found = true
			if !has(r["answer"], "approved_by=token:sup1") && !has(r["data"], "sup1") {
				t.Errorf("the do line of audit-1 does not name the approver: %v", r)
			}
		}
	}
	if !found {
		t.Errorf("no do line for audit-1")
	}
}

// ---- mesh ------------------------------------------------------------------

// TestAttackMeshRoutedApproval: op1, connected to gateway A, calls B's fan
// above the two-person threshold. The request is registered at B (the
// owner). op1's token cannot approve it at B (403); A does not know it
// (404); sup2 at A sending the routed grant cannot run it; sup1 approves at
// B and op1's repeat through A runs once; the grant through A again and
// op1's grant at B's own /mcp after that write nothing more.
func TestAttackMeshRoutedApproval(t *testing.T) {
	dir := t.TempDir()
	tokens := "    - {id: op1, sha256: " + sha(apOp1Token) + ", role: operator}\n" +
		"    - {id: sup1, sha256: " + sha(apSup1Token) + ", role: supervisor}\n" +
		"    - {id: sup2, sha256: " + sha(apSup2Token) + ", role: supervisor}\n"
	polA := filepath.Join(dir, "a.yml")
	polB := filepath.Join(dir, "b.yml")
	os.WriteFile(polA, []byte(meshTokens+tokens), 0o600)
	os.WriteFile(polB, []byte(meshTokens+tokens+`capabilities:
  do_fan_zone_b:
    rules:
      - {type: permission, require: [operator]}
      - {type: approval, when: above, above: 50, approver_role: supervisor}
gate:
  fail_closed: deny
  l0:
    allow:
      - {name: fan, tool: do_fan_zone_b}
`), 0o600)
	node := func(n, ip, pol string) *daemon {
		man := repoPath("examples/mesh-3node/node_" + n + ".yml")
		args := []string{"run", "--manifest", man, "--state", filepath.Join(dir, n), "--http", ip + ":0", "--sim-control", "--policy", pol}
		d := &daemon{cmd: exec.Command(physdBin, args...), state: filepath.Join(dir, n), stderr: &syncBuffer{}, done: make(chan error, 1), token: adminDemoToken}
		d.cmd.Stderr = d.stderr
		if err := d.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { d.done <- d.cmd.Wait() }()
		t.Cleanup(func() { d.stop(t) })
		d.addr = d.stderr.logValue(t, "listening", "addr")
		d.stderr.logValue(t, "mesh joined", "node")
		return d
	}
	a := node("a", "127.0.0.2", polA)
	b := node("b", "127.0.0.3", polB)
	args := func(key string) map[string]any {
		return map[string]any{"value": 70, "idempotency_key": key, "source": "gw_zone_b"}
	}
	opA := connectAs(t, a, "2026-07-28", apOp1Token, accept)
	var first hAnswer
	deadline := time.Now().Add(20 * time.Second)
	for {
		first = doCall(t, opA, "do_fan_zone_b", args("mesh-ap-1"))
		if first.toolErr == "" || time.Now().After(deadline) || !strings.Contains(first.toolErr, "unknown") && !strings.Contains(first.toolErr, "offers") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if first.Code != "approval_pending" {
		t.Fatalf("the routed call: %s%s", first.raw, first.toolErr)
	}
	_, id, _ := strings.Cut(first.Details, "approval_id=")
	id, _, _ = strings.Cut(id, ";")
	if c, m := atkDecide(t, b, id, `{"decision":"approve"}`, "Bearer "+apOp1Token); c != 403 {
		t.Errorf("op1 approving its own routed request at the owner: %d %v, want 403", c, m)
	}
	if c, m := atkDecide(t, a, id, `{"decision":"approve"}`, "Bearer "+apSup1Token); c != 404 {
		t.Errorf("approving at the routing gateway: %d %v, want 404", c, m)
	}
	if a := doCall(t, opA, "do_fan_zone_b", args("mesh-ap-1")); a.Status == "success" {
		t.Errorf("the routed repeat before any approval ran: %s", a.raw)
	}
	c, m := atkDecide(t, b, id, `{"decision":"approve"}`, "Bearer "+apSup1Token)
	grant, _ := m["grant"].(string)
	if c != 200 || grant == "" {
		t.Fatalf("sup1 at the owner: %d %v", c, m)
	}
	// sup2 through A sends op1's grant: another person.
	supA := connectAs(t, a, "2026-07-28", apSup2Token, accept)
	if ans := atkGrantWith(t, supA, "do_fan_zone_b", args("mesh-ap-1"), grant); ans.Status == "success" {
		t.Errorf("sup2 ran op1's grant through A: %s", ans.raw)
	}
	if w := b.sim(t).writes("zone_b.fan"); w != 0 {
		t.Fatalf("B's fan written %d times before op1's repeat", w)
	}
	if ans := doCall(t, opA, "do_fan_zone_b", args("mesh-ap-1")); ans.Status != "success" {
		t.Errorf("op1's routed repeat after sup1's approval: %s%s", ans.raw, ans.toolErr)
	}
	atkGrantWith(t, opA, "do_fan_zone_b", args("mesh-ap-1"), grant)
	opB := connectAs(t, b, "2026-07-28", apOp1Token, accept)
	atkGrantWith(t, opB, "do_fan_zone_b", map[string]any{"value": 70, "idempotency_key": "mesh-ap-1"}, grant)
	if ans := atkGrantWith(t, opB, "do_fan_zone_b", map[string]any{"value": 70, "idempotency_key": "mesh-ap-1b"}, grant); ans.Status == "success" {
		t.Errorf("op1's grant with another key at B ran: %s", ans.raw)
	}
	if w := b.sim(t).writes("zone_b.fan"); w != 1 {
		t.Errorf("B's fan written %d times, want 1", w)
	}
	// B audits both parties: the routed requester and the approver.
	for _, r := range auditEvents(t, b.state, "approval_redeemed") {
		data, _ := r["data"].(map[string]any)
		if !strings.Contains(fmt.Sprint(r["credentials"]), "token:op1") || !strings.Contains(fmt.Sprint(data["approver_credentials"]), "token:sup1") {
			t.Errorf("B's approval_redeemed lacks a party: %v", r)
		}
	}

	// A second routed request: approved through a grant sent as requestState via A.
	second := doCall(t, opA, "do_fan_zone_b", args("mesh-ap-2"))
	_, id2, _ := strings.Cut(second.Details, "approval_id=")
	id2, _, _ = strings.Cut(id2, ";")
	c, m = atkDecide(t, b, id2, `{"decision":"approve"}`, "Bearer "+apSup2Token)
	grant2, _ := m["grant"].(string)
	if c != 200 || grant2 == "" {
		t.Fatalf("sup2 at the owner: %d %v", c, m)
	}
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				atkGrantWith(t, opA, "do_fan_zone_b", args("mesh-ap-2"), grant2)
			} else {
				doCall(t, opA, "do_fan_zone_b", args("mesh-ap-2"))
			}
		}()
	}
	wg.Wait()
	if w := b.sim(t).writes("zone_b.fan"); w != 2 {
		t.Errorf("B's fan written %d times after the second routed approval raced, want 2", w)
	}
}

// TestAttackPeopleCertByFingerprint: control for
// TestAttackPeopleCertNamedByAnotherRule: identity.people lists alice's
// certificate by its SHA-256 fingerprint; the certificate cannot approve
// what alice's token asked (403, no write).
func TestAttackPeopleCertByFingerprint(t *testing.T) {
	t.Parallel()
	const aliceOp = "attack-alice-operator-token-fp"
	pki := newSitePKI(t)
	l, err := pki.ca.Issue(testpki.Spec{CN: "alice-cert", DNS: []string{"alice.greenhouse.example"}, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := l.TLS()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(cert.Certificate[0])
	identity := "  providers:\n    - type: mtls\n      clients:\n        - {san: alice.greenhouse.example, role: supervisor}\n        - {cn: alice-cert, role: supervisor}\n" +
		"  people:\n    - name: alice\n      tokens: [alice_op]\n      certs: [\"sha256:" + strings.ToUpper(hex.EncodeToString(sum[:])) + "\"]\n"
	pol := apPolicy(t, t.TempDir(), identity)
	editFile(t, pol, "    - {id: site_admin,", "    - {id: alice_op, sha256: "+sha(aliceOp)+", role: operator}\n    - {id: site_admin,")
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol, "--tls-cert", pki.certFile, "--tls-key", pki.keyFile, "--tls-client-ca", pki.caFile}})
	x := &atkTLS{d: d, pki: pki, base: "https://" + d.addr}
	cs := x.connect(t, pki.client(nil, aliceOp))
	id := atkPending(t, cs, "do_heater_zone_c", apArgs("people-fp-1"))
	if code, b := x.approve(t, pki.client(&cert, ""), id); code != 403 {
		t.Errorf("alice's certificate (listed by fingerprint) approved alice's token's request: %d %s", code, b)
	}
	doCall(t, cs, "do_heater_zone_c", apArgs("people-fp-1"))
	if w := x.writes(t); w != 0 {
		t.Errorf("%d writes", w)
	}
}

// TestAttackCertApproverRuleRemoved: a supervisor certificate approves
// op1's call; a policy reload removes its mtls rule (keeping another).
// Neither the repeat nor the grant as requestState runs.
func TestAttackCertApproverRuleRemoved(t *testing.T) {
	t.Parallel()
	const rule = "        - {cn: sup-cert, role: supervisor}\n"
	var pol string
	x := startAtkTLS(t, "  providers:\n    - type: mtls\n      clients:\n"+rule+"        - {cn: other-cert, role: viewer}\n", func(p string) { pol = p })
	supCert := x.issue(t, testpki.Spec{CN: "sup-cert"})
	cs := x.connect(t, x.pki.client(nil, apOp1Token))
	idA := atkPending(t, cs, "do_heater_zone_c", apArgs("cert-rm-a"))
	idB := atkPending(t, cs, "do_heater_zone_c", apArgs("cert-rm-b"))
	if c, b := x.approve(t, x.pki.client(supCert, ""), idA); c != 200 {
		t.Fatalf("sup-cert: %d %s", c, b)
	}
	c, b := x.approve(t, x.pki.client(supCert, ""), idB)
	var m map[string]any
	json.Unmarshal([]byte(b), &m)
	grantB, _ := m["grant"].(string)
	if c != 200 || grantB == "" {
		t.Fatalf("sup-cert: %d %s", c, b)
	}
	editFile(t, pol, rule, "")
	hupAndWait(t, x.d, "policy reloaded")
	if a := doCall(t, cs, "do_heater_zone_c", apArgs("cert-rm-a")); a.Status == "success" {
		t.Errorf("the repeat approved by a certificate whose rule was removed since: %s", a.raw)
	}
	if a := withGrant(t, cs, "cert-rm-b", grantB); a.Status == "success" {
		t.Errorf("the grant of a certificate whose rule was removed since: %s", a.raw)
	}
	if w := x.writes(t); w != 0 {
		t.Errorf("%d writes", w)
	}
}

// TestAttackSpentGrantAfterRestart: with PHYSD_APPROVAL_KEY, sup1's grant
// is spent as void (heater_zone_c rebound), the manifest is then restored
// and the daemon restarted on the same state: the grant's definition is
// current again, but it was spent, so it never runs (the nonce store
// survives the restart).
func TestAttackSpentGrantAfterRestart(t *testing.T) {
	t.Setenv("PHYSD_APPROVAL_KEY", strings.Repeat("a1", 32))
	dir, state := t.TempDir(), t.TempDir()
	man, pol := apManifest(t, dir), apPolicy(t, dir, "")
	d := startHTTP(t, daemonOpts{manifest: man, state: state, extra: []string{"--policy", pol}})
	op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
	grant := requestApproved(t, d, op, "spent-1")
	editCap(t, man, "heater_zone_c", "point: zone_c.heater", "point: zone_b.heater")
	hupAndWait(t, d, "manifest reloaded")
	wantVoid(t, "the grant after the rebinding", withGrant(t, op, "spent-1", grant))
	d.stop(t)
	editCap(t, man, "heater_zone_c", "point: zone_b.heater", "point: zone_c.heater")
	d2 := startHTTP(t, daemonOpts{manifest: man, state: state, extra: []string{"--policy", pol}})
	op2 := connectAs(t, d2, "2026-07-28", apOp1Token, accept)
	if a := withGrant(t, op2, "spent-1", grant); a.Status == "success" {
		t.Errorf("a grant spent as void ran after the definition was restored and the daemon restarted: %s", a.raw)
	}
	wantNoWrites(t, d2, "after the spent grant")
}
