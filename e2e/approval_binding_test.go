package e2e

// A two-person grant is bound to the capability's definition the approver
// saw: tool, arguments, idempotency key, requester, expiry, and a digest of
// the definition (binding, range, unit, and the policy rules that apply to
// the tool, approver_role included). Every path that carries a grant (the
// plain repeat, the grant as requestState, either after a restart with
// PHYSD_APPROVAL_KEY) checks it against the definition in force: on a
// mismatch the answer is failed/approval_void, nothing is written, and the
// grant is spent.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tokens the approval tests add to a copy of the greenhouse policy.
const (
	apOp1Token  = "approval-e2e-op1-token"  // op1, operator: the requester
	apSup1Token = "approval-e2e-sup1-token" // sup1, supervisor: the approver
	apSup2Token = "approval-e2e-sup2-token" // sup2, supervisor: another person
)

// apTokens are the identity.tokens lines for op1, sup1 and sup2.
var apTokens = "    - {id: op1, sha256: " + sha(apOp1Token) + ", role: operator}\n" +
	"    - {id: sup1, sha256: " + sha(apSup1Token) + ", role: supervisor}\n" +
	"    - {id: sup2, sha256: " + sha(apSup2Token) + ", role: supervisor}\n"

// apZoneCGuard is do_heater_zone_c's range guard in the greenhouse policy;
// apZoneCApproval is the two-person rule the tests put after it.
const (
	apZoneCGuard    = "{type: range_guard, min: 0, max: 80, on_violation: deny}"
	apZoneCApproval = "{type: approval, when: above, above: 60, approver_role: supervisor}"
)

// apPolicy writes to dir a copy of the greenhouse policy with op1, sup1 and
// sup2, the two-person rule (approver_role supervisor) on do_heater_zone_c
// above 60, and identity (indented under identity:, e.g. providers or
// people) appended to the identity section.
func apPolicy(t *testing.T, dir, identity string) string {
	t.Helper()
	b, err := os.ReadFile(greenhousePolicy)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, anchor := range []string{"    - {id: site_admin,", "      - " + apZoneCGuard + "\n", "\nemergency:"} {
		if strings.Count(s, anchor) != 1 {
			t.Fatalf("the greenhouse policy changed (%q): update this test", anchor)
		}
	}
	s = strings.Replace(s, "    - {id: site_admin,", apTokens+"    - {id: site_admin,", 1)
	s = strings.Replace(s, "      - "+apZoneCGuard+"\n", "      - "+apZoneCGuard+"\n      - "+apZoneCApproval+"\n", 1)
	s = strings.Replace(s, "\nemergency:", identity+"\nemergency:", 1)
	p := filepath.Join(dir, "policy.yml")
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// apManifest writes a copy of the greenhouse manifest to dir.
func apManifest(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "manifest.yml")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// capBlock returns the manifest entry of capability name.
func capBlock(t *testing.T, src, name string) string {
	t.Helper()
	start := strings.Index(src, "  - name: "+name+"\n")
	if start < 0 {
		t.Fatalf("the greenhouse manifest has no %s", name)
	}
	end := strings.Index(src[start+1:], "\n  - name: ")
	if end < 0 {
		t.Fatalf("%s is the greenhouse manifest's last capability: update this test", name)
	}
	return src[start : start+1+end+1]
}

// editCap replaces old with new inside capability name's entry of the
// manifest at path.
func editCap(t *testing.T, path, name, old, new string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk := capBlock(t, string(b), name)
	if !strings.Contains(blk, old) {
		t.Fatalf("%s's entry has no %q:\n%s", name, old, blk)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), blk, strings.Replace(blk, old, new, 1), 1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// editFile replaces old (which must occur once) with new in the file at path.
func editFile(t *testing.T, path, old, new string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(b), old) != 1 {
		t.Fatalf("%s: %q occurs %d times, want once", path, old, strings.Count(string(b), old))
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// logCount counts the daemon's JSON log lines with msg.
func logCount(d *daemon, msg string) int {
	n := 0
	for l := range strings.SplitSeq(d.stderr.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == msg {
			n++
		}
	}
	return n
}

// hupAndWait sends SIGHUP and waits for one more log line of each msg; a
// rejected reload fails the test.
func hupAndWait(t *testing.T, d *daemon, msgs ...string) {
	t.Helper()
	const rejected = "reload rejected; the running manifest and policy stay in force"
	before := make([]int, len(msgs))
	for i, m := range msgs {
		before[i] = logCount(d, m)
	}
	rej := logCount(d, rejected)
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; i < len(msgs); {
		if logCount(d, rejected) > rej {
			t.Fatalf("the reload was rejected:\n%s", d.stderr.String())
		}
		if logCount(d, msgs[i]) > before[i] {
			i++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new %q log line after SIGHUP; stderr:\n%s", msgs[i], d.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// apArgs is the approved call: 70 % is above the approval threshold (60)
// and inside every range and guard the tests leave in force.
func apArgs(key string) map[string]any { return map[string]any{"value": 70, "idempotency_key": key} }

// requestApproved makes op's call of do_heater_zone_c pending, has sup1
// approve it on POST /approvals/<id>, and returns the grant.
func requestApproved(t *testing.T, d *daemon, op *mcp.ClientSession, key string) string {
	t.Helper()
	id := approvalID(t, structured(t, call(t, op, "do_heater_zone_c", apArgs(key))))
	c, _, b := hsReq(t, d, "POST", "/approvals/"+id, "", "", `{"decision":"approve"}`, "Bearer "+apSup1Token)
	var m map[string]any
	json.Unmarshal([]byte(b), &m)
	grant, _ := m["grant"].(string)
	if c != 200 || grant == "" {
		t.Fatalf("sup1 approving %s: %d %s", key, c, b)
	}
	return grant
}

// withGrant sends the call with the grant as requestState.
func withGrant(t *testing.T, cs *mcp.ClientSession, key, grant string) hAnswer {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_zone_c", Arguments: apArgs(key), RequestState: grant})
	return decodeDo(t, res, err)
}

// wantVoid: a normal do_ answer (not a tool error), failed/approval_void.
func wantVoid(t *testing.T, what string, a hAnswer) {
	t.Helper()
	if a.toolErr != "" || a.Status != "failed" || a.Code != "approval_void" {
		t.Errorf("%s: want a failed/approval_void answer, got status=%q code=%q: %s%s", what, a.Status, a.Code, a.raw, a.toolErr)
	}
}

// wantNoWrites: nothing reached either heater point.
func wantNoWrites(t *testing.T, d *daemon, when string) {
	t.Helper()
	s := d.sim(t)
	if b, c := s.writes("zone_b.heater"), s.writes("zone_c.heater"); b != 0 || c != 0 {
		t.Errorf("%s: zone_b.heater written %d times, zone_c.heater %d times; want 0, 0", when, b, c)
	}
}

// TestApprovalVoidGrantViaRequestState: sup1 approves op1's call of
// do_heater_zone_c; a manifest reload then binds heater_zone_c to another
// point (zone_b.heater). The repeat is void, and so is the grant sent as
// requestState: neither heater is ever written.
func TestApprovalVoidGrantViaRequestState(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	man, pol := apManifest(t, dir), apPolicy(t, dir, "")
	d := startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}})
	op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
	grant := requestApproved(t, d, op, "void-1")
	wantNoWrites(t, d, "after the approval")

	editCap(t, man, "heater_zone_c", "point: zone_c.heater", "point: zone_b.heater")
	hupAndWait(t, d, "manifest reloaded")

	wantVoid(t, "the repeat after heater_zone_c was rebound to zone_b.heater", doCall(t, op, "do_heater_zone_c", apArgs("void-1")))
	wantNoWrites(t, d, "after the repeat")
	wantVoid(t, "the grant as requestState after heater_zone_c was rebound to zone_b.heater", withGrant(t, op, "void-1", grant))
	wantNoWrites(t, d, "after the grant as requestState")
}

// TestApprovalVoidGrantAcrossRestart: with PHYSD_APPROVAL_KEY a grant
// survives a restart, but only for the definition it was given for: after a
// restart with heater_zone_c bound to zone_b.heater, the grant as
// requestState is void and writes nothing. Control: after a restart with the
// manifest unchanged, it runs exactly once.
func TestApprovalVoidGrantAcrossRestart(t *testing.T) {
	t.Setenv("PHYSD_APPROVAL_KEY", strings.Repeat("5a", 32))
	for _, redefine := range []bool{true, false} {
		name := "unchanged"
		if redefine {
			name = "rebound"
		}
		t.Run(name, func(t *testing.T) {
			dir, state := t.TempDir(), t.TempDir()
			man, pol := apManifest(t, dir), apPolicy(t, dir, "")
			d := startHTTP(t, daemonOpts{manifest: man, state: state, extra: []string{"--policy", pol}})
			grant := requestApproved(t, d, connectAs(t, d, "2026-07-28", apOp1Token, accept), "restart-1")
			wantNoWrites(t, d, "after the approval")
			d.stop(t)
			if redefine {
				editCap(t, man, "heater_zone_c", "point: zone_c.heater", "point: zone_b.heater")
			}
			d2 := startHTTP(t, daemonOpts{manifest: man, state: state, extra: []string{"--policy", pol}})
			op := connectAs(t, d2, "2026-07-28", apOp1Token, accept)
			a := withGrant(t, op, "restart-1", grant)
			if redefine {
				wantVoid(t, "the grant as requestState after a restart that rebound heater_zone_c to zone_b.heater", a)
				wantNoWrites(t, d2, "after the grant, rebound")
				// Spent: a second use, and the plain repeat, write nothing either.
				if a := withGrant(t, op, "restart-1", grant); a.Status == "success" {
					t.Errorf("the void grant, used again: %s", a.raw)
				}
				if a := doCall(t, op, "do_heater_zone_c", apArgs("restart-1")); a.Status == "success" {
					t.Errorf("the repeat after the void grant: %s", a.raw)
				}
				wantNoWrites(t, d2, "after the void grant was used again")
				return
			}
			if a.Status != "success" {
				t.Errorf("the grant as requestState after a restart with the same manifest: %s%s", a.raw, a.toolErr)
			}
			withGrant(t, op, "restart-1", grant) // used again: the recorded answer at most
			s := d2.sim(t)
			if c, b := s.writes("zone_c.heater"), s.writes("zone_b.heater"); c != 1 || b != 0 {
				t.Errorf("the grant after a restart with the same manifest: zone_c.heater written %d times, zone_b.heater %d; want 1, 0", c, b)
			}
		})
	}
}

// TestApprovalGrantVoidOnEveryDefinitionChange: between sup1's approvals of
// two of op1's calls and their use, a SIGHUP reload changes one part of
// do_heater_zone_c's definition (binding point, manifest range, unit, an
// applicable policy rule, approver_role). Neither grant ever actuates,
// whichever path uses it first (the repeat for one call, the grant as
// requestState for the other). Controls: a change to another capability
// voids nothing, and each approved call runs exactly once.
func TestApprovalGrantVoidOnEveryDefinitionChange(t *testing.T) {
	t.Parallel()
	const (
		manifestReloaded = "manifest reloaded"
		policyReloaded   = "policy reloaded"
	)
	type files struct{ man, pol string }
	cases := []struct {
		name   string
		change func(t *testing.T, f files)
		logs   []string
		void   bool
	}{
		{"binding point", func(t *testing.T, f files) {
			editCap(t, f.man, "heater_zone_c", "point: zone_c.heater", "point: zone_b.heater")
		}, []string{manifestReloaded}, true},
		{"manifest range", func(t *testing.T, f files) {
			editCap(t, f.man, "heater_zone_c", "range: {min: 0, max: 100}", "range: {min: 0, max: 95}")
		}, []string{manifestReloaded}, true},
		{"unit", func(t *testing.T, f files) {
			// A family's members share one unit: heater_zone_a changes with it.
			editCap(t, f.man, "heater_zone_c", "unit: percent", "unit: kilowatt")
			editCap(t, f.man, "heater_zone_a", "unit: percent", "unit: kilowatt")
		}, []string{manifestReloaded}, true},
		{"policy range_guard", func(t *testing.T, f files) {
			editFile(t, f.pol, apZoneCGuard, "{type: range_guard, min: 0, max: 75, on_violation: deny}")
		}, []string{policyReloaded}, true},
		{"policy rate rule added", func(t *testing.T, f files) {
			editFile(t, f.pol, "      - "+apZoneCApproval+"\n", "      - "+apZoneCApproval+"\n      - {type: rate, max: \"10/min\"}\n")
		}, []string{policyReloaded}, true},
		{"approver_role supervisor to admin", func(t *testing.T, f files) {
			editFile(t, f.pol, apZoneCApproval, "{type: approval, when: above, above: 60, approver_role: admin}")
		}, []string{policyReloaded}, true},
		{"control: another capability's description", func(t *testing.T, f files) {
			editCap(t, f.man, "vent_zone_c", "description: Roof vent opening in zone C (percent).", "description: Roof vent of zone C, opening in percent.")
		}, []string{manifestReloaded}, false},
		{"control: another capability's range", func(t *testing.T, f files) {
			editCap(t, f.man, "fan_zone_b", "range: {min: 0, max: 100}", "range: {min: 0, max: 90}")
		}, []string{manifestReloaded}, false},
		{"control: another tool's policy rule", func(t *testing.T, f files) {
			editFile(t, f.pol, `{type: rate, max: "30/min"}`, `{type: rate, max: "20/min"}`)
		}, []string{policyReloaded}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			f := files{apManifest(t, dir), apPolicy(t, dir, "")}
			d := startHTTP(t, daemonOpts{manifest: f.man, extra: []string{"--policy", f.pol}})
			op := connectAs(t, d, "2026-07-28", apOp1Token, accept)
			grantA := requestApproved(t, d, op, "change-a") // used first by the repeat
			grantB := requestApproved(t, d, op, "change-b") // used first as requestState
			wantNoWrites(t, d, "after the approvals")
			tc.change(t, f)
			hupAndWait(t, d, tc.logs...)

			if !tc.void {
				if a := doCall(t, op, "do_heater_zone_c", apArgs("change-a")); a.Status != "success" {
					t.Errorf("the approved repeat after an unrelated change: %s%s", a.raw, a.toolErr)
				}
				if w := d.sim(t).writes("zone_c.heater"); w != 1 {
					t.Errorf("after the approved repeat: zone_c.heater written %d times, want 1", w)
				}
				if a := withGrant(t, op, "change-b", grantB); a.Status != "success" {
					t.Errorf("the grant as requestState after an unrelated change: %s%s", a.raw, a.toolErr)
				}
				withGrant(t, op, "change-a", grantA) // spent: the recorded answer at most
				s := d.sim(t)
				if c, b := s.writes("zone_c.heater"), s.writes("zone_b.heater"); c != 2 || b != 0 {
					t.Errorf("two approved calls after an unrelated change: zone_c.heater written %d times, zone_b.heater %d; want 2, 0", c, b)
				}
				return
			}
			wantVoid(t, "change-a, the repeat", doCall(t, op, "do_heater_zone_c", apArgs("change-a")))
			wantNoWrites(t, d, "after change-a's repeat")
			wantVoid(t, "change-a, then its grant as requestState", withGrant(t, op, "change-a", grantA))
			wantNoWrites(t, d, "after change-a's grant as requestState")
			wantVoid(t, "change-b, the grant as requestState", withGrant(t, op, "change-b", grantB))
			wantNoWrites(t, d, "after change-b's grant as requestState")
			if a := doCall(t, op, "do_heater_zone_c", apArgs("change-b")); a.Status == "success" {
				t.Errorf("change-b, then the repeat: %s", a.raw)
			}
			wantNoWrites(t, d, "after change-b's repeat")
		})
	}
}
