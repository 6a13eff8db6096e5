package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/drivers/modbus/modbustest"
	"github.com/physd/physd/manifest"
)

// rolePolicy lets every do_ through the gate and requires ROLE.
const rolePolicy = `physmcp_policy_version: "0.1"
defaults:
  require_permission: ROLE
gate:
  fail_closed: deny
  l0:
    allow:
      - {name: every_do, tool: "do_*"}
  l1: {enabled: false}
`

// TestRejectedReloadKeepsThePolicyInForce: a manifest that passes
// validation but cannot be bound (two do_ capabilities writing one Modbus
// register, which only the open bus detects) is rejected together with
// the policy saved beside it — the policy in force stays the one that was,
// not the new file's (which would let a role run what it may not).
func TestRejectedReloadKeepsThePolicyInForce(t *testing.T) {
	t.Parallel()
	bank := modbustest.NewBank(100)
	srv, err := modbustest.StartTCP("127.0.0.1:0", bank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	dir := t.TempDir()
	valve := doCap("valve", "int", `{type: modbus, bus: plc, table: holding, address: 1, data_type: uint16}`, "    range: {min: 0, max: 100}\n")
	manifestOf := func(caps ...string) string {
		return strings.NewReplacer("ADDR", srv.Addr, "BUSEXTRA", "", "CAPS", strings.Join(caps, "")).Replace(modbusManifest)
	}
	mpath, ppath := filepath.Join(dir, "physmcp.manifest.yml"), filepath.Join(dir, "physmcp.policy.yml")
	write := func(path, s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(mpath, manifestOf(valve))
	write(ppath, strings.Replace(rolePolicy, "ROLE", "supervisor", 1))
	cs, d := startStdio(t, "2025-11-25", daemonOpts{manifest: mpath, extra: []string{"--policy", ppath, "--stdio-role", "operator"}})
	if o := structured(t, call(t, cs, "do_valve", map[string]any{"value": 10, "idempotency_key": "before"})); o["status"] != "failed" || o["permission"] != "permission_insufficient" {
		t.Fatalf("an operator before the reload: %v", o)
	}
	// The new files: a second capability on the valve's register, and a
	// policy that lets role none actuate.
	write(mpath, manifestOf(valve, doCap("valve_alias", "int", `{type: modbus, bus: plc, table: holding, address: 1, data_type: uint16}`, "    range: {min: 0, max: 100}\n")))
	write(ppath, strings.Replace(rolePolicy, "ROLE", "none", 1))
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if reason := waitAudit(t, d.state, "manifest_reload_rejected", 1); !strings.Contains(reason, "both write") {
		t.Fatalf("rejection: %q", reason)
	}
	o := structured(t, call(t, cs, "do_valve", map[string]any{"value": 20, "idempotency_key": "after"}))
	if o["status"] != "failed" || o["permission"] != "permission_insufficient" {
		t.Errorf("after a rejected reload an operator runs do_valve (the rejected policy is in force): %v", o)
	}
	if v := bank.Holding(1, 1, 1)[0]; v != 0 {
		t.Errorf("the valve register holds %d", v)
	}
}

// TestWatchManifestNeverAppliesAHalfWrittenFile: with --watch-manifest, a
// file rewritten in place (truncated, then written; or written in two
// parts whose first part is itself a valid manifest with fewer
// capabilities) is never applied half-written: only a content that stayed
// the same from one check to the next is. Here every intermediate state
// lasts 60 ms against a 250 ms watch, twenty times over, and the file ends
// as it began: nothing may be reloaded or rejected. A broken file that
// stays is rejected (and audited) once, not at every check.
func TestWatchManifestNeverAppliesAHalfWrittenFile(t *testing.T) {
	orig, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	// The greenhouse with its capabilities last (as most manifests are):
	// a prefix cut at a capability drops capabilities and still validates.
	src := string(orig)
	tail := src[strings.Index(src, "\naudit:\n")+1:]
	head := src[:strings.Index(src, "\naudit:\n")+1]
	capsAt := strings.Index(head, "\ncapabilities:\n") + 1
	full := head[:capsAt] + tail + "\n" + head[capsAt:]
	half := full[:strings.LastIndex(full, "\n  - name: heater_zone_c\n")+1]
	if _, err := manifest.Parse("half.yml", []byte(half)); err != nil {
		t.Fatalf("the half file must validate for this test: %v", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(path, []byte(full), 0o644); err != nil {
		t.Fatal(err)
	}
	_, d := startStdio(t, "2025-11-25", daemonOpts{manifest: path, extra: []string{"--watch-manifest", "1s"}})
	// The writes below leave a file half-written for 60 ms, far shorter
	// than the 1 s watch interval. On a loaded machine a 60 ms state can
	// still last a whole watch interval; such a state may be applied (it is what the file held), so each one
	// excuses up to two audit lines (it, and the full file again).
	long := 0
	for i := range 20 {
		start := time.Now()
		if i%2 == 0 {
			// An editor's in-place save: truncate, then write.
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(path, []byte(half), 0o644); err != nil {
			t.Fatal(err)
		}
		time.Sleep(60 * time.Millisecond)
		if err := os.WriteFile(path, []byte(full), 0o644); err != nil {
			t.Fatal(err)
		}
		if time.Since(start) >= 800*time.Millisecond {
			long++
		}
		time.Sleep(157 * time.Millisecond) // not a multiple of the watch: the checks fall anywhere in the cycle
	}
	time.Sleep(2500 * time.Millisecond) // two more checks of the final file
	applied, rejected := auditEvents(t, d.state, "manifest_reload"), auditEvents(t, d.state, "manifest_reload_rejected")
	if len(applied)+len(rejected) > 2*long {
		if len(applied) > 0 {
			t.Errorf("a half-written file was applied %d times; first: %v", len(applied), applied[0]["data"])
		}
		if len(rejected) > 0 {
			t.Errorf("a file being written was rejected %d times; first: %v", len(rejected), rejected[0]["reason"])
		}
	}
	if long > 0 {
		t.Logf("%d of 20 intermediate states lasted 800 ms or more (a loaded machine)", long)
	}
	// A broken file left in place is rejected once, not at every check.
	if err := os.WriteFile(path, []byte(strings.Replace(full, "data_type: int\n", "data_type: integer\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitAudit(t, d.state, "manifest_reload_rejected", len(rejected)+1)
	time.Sleep(4 * time.Second)
	if rs := auditEvents(t, d.state, "manifest_reload_rejected"); len(rs) != len(rejected)+1 {
		t.Errorf("a broken file left in place for six checks was rejected %d times", len(rs)-len(rejected))
	}
}

// procFDs counts the open file descriptors of pid.
func procFDs(t *testing.T, pid int) int {
	t.Helper()
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// goroutines reads go_goroutines from the daemon's /metrics.
func (d *daemon) goroutines(t *testing.T) int {
	t.Helper()
	_, body := d.request(t, "GET", "/metrics", "")
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no go_goroutines in /metrics:\n%s", body)
	return 0
}

// TestReloadBattery: HTTP sessions actuate, read and ask can_do while
// SIGHUPs flip the manifest a hundred times between the greenhouse and a
// version that narrows fan_zone_b to 0–50 and removes vent_zone_c. Every
// do_ answer is success (verified) or failed, and the simulator saw
// exactly one write per success and none for a failure; the daemon stays
// up; after the storm its open files and goroutines are back where they
// were.
func TestReloadBattery(t *testing.T) {
	t.Parallel()
	orig, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	a := string(orig)
	b := strings.Replace(a, fanBlock(t, a), strings.Replace(fanBlock(t, a), "range: {min: 0, max: 100}", "range: {min: 0, max: 50}", 1), 1)
	vent := a[strings.Index(a, "  - name: vent_zone_c\n"):strings.Index(a, "  - name: heater_zone_c\n")]
	b = strings.Replace(b, vent, speedBlock, 1)
	path := filepath.Join(t.TempDir(), "physmcp.manifest.yml")
	if err := os.WriteFile(path, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	d := startHTTP(t, daemonOpts{manifest: path})
	pid := d.cmd.Process.Pid
	// Warm up: sessions, pools and the first reload's lazy state.
	var sessions []*mcp.ClientSession
	for range 3 {
		sessions = append(sessions, connectHTTP(t, d, "2026-07-28"))
	}
	reload := func(i int, content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitAudit(t, d.state, "manifest_reload", i)
	}
	reload(1, b)
	reload(2, a)
	time.Sleep(200 * time.Millisecond)
	fds0, gr0 := procFDs(t, pid), d.goroutines(t)
	d.request(t, "POST", "/sim/plant/fault", `{"point":"zone_b.fan","mode":"slow","delay_ms":20}`)

	type tally struct{ success, failed, toolErr int }
	var mu sync.Mutex
	counts := map[string]*tally{"zone_b.fan": {}, "zone_c.vent": {}}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range 6 {
		cs := sessions[w%len(sessions)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				tool, point := "do_fan_zone_b", "zone_b.fan"
				if i%2 == 1 {
					tool, point = "do_vent_zone_c", "zone_c.vent"
				}
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool,
					Arguments: map[string]any{"value": (w*37 + i*11) % 101, "idempotency_key": fmt.Sprintf("bat-%d-%d", w, i)}})
				mu.Lock()
				c := counts[point]
				switch {
				case err != nil && strings.Contains(err.Error(), `unknown tool "`+tool+`"`):
					c.toolErr++ // removed by the manifest in force
				case err != nil:
					t.Errorf("%s: %v", tool, err)
				case res.IsError:
					c.toolErr++
					if !strings.Contains(text(res), "unknown") {
						t.Errorf("%s: tool error %s", tool, text(res))
					}
				default:
					var o map[string]any
					_ = json.Unmarshal([]byte(text(res)), &o)
					switch {
					case o["status"] == "success" && o["verified"] == true:
						c.success++
					case o["status"] == "failed":
						c.failed++
					default:
						t.Errorf("%s: %s", tool, text(res))
					}
				}
				mu.Unlock()
				switch i % 3 {
				case 0:
					_, _ = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "read_temperature_zone_a", Arguments: map[string]any{}})
				case 1:
					_, _ = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "can_do",
						Arguments: map[string]any{"intent": map[string]any{"semantic_tags": []string{"ventilation"}, "action": "set", "target": "airflow"}}})
				}
			}
		}()
	}
	for i := range 100 {
		content := b
		if i%2 == 1 {
			content = a
		}
		reload(3+i, content)
	}
	stop()
	wg.Wait()
	if err := d.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the daemon died: %v\n%s", err, d.stderr.String())
	}
	d.request(t, "POST", "/sim/plant/fault", `{"point":"zone_b.fan","mode":"none"}`)
	sim := d.sim(t)
	for point, c := range counts {
		t.Logf("%s: %+v, simulator writes %d", point, *c, sim.writes(point))
		if w := sim.writes(point); w != uint64(c.success) {
			t.Errorf("%s: %d successes but the simulator saw %d writes", point, c.success, w)
		}
	}
	if counts["zone_c.vent"].toolErr == 0 || counts["zone_b.fan"].failed == 0 {
		t.Errorf("the battery did not exercise the removed tool and the narrowed range: %v %v", *counts["zone_c.vent"], *counts["zone_b.fan"])
	}
	// Leaks: give finished requests a moment to unwind, then compare.
	deadline := time.Now().Add(5 * time.Second)
	for {
		fds, gr := procFDs(t, pid), d.goroutines(t)
		if fds <= fds0+2 && gr <= gr0+5 {
			t.Logf("fds %d → %d, goroutines %d → %d after 100 reloads", fds0, fds, gr0, gr)
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("after 100 reloads: fds %d → %d, goroutines %d → %d", fds0, fds, gr0, gr)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestReloadVoidsApprovalsOfARedefinedCapability: a person approved
// do_heater_zone_a 70 as the capability was defined then; a reload
// redefines it before the agent repeats the call. The approval was a
// decision about the old definition: the repeated call must not actuate
// on it (the agent asks again, and the approver sees the new definition).
func TestReloadVoidsApprovalsOfARedefinedCapability(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(greenhousePolicy)
	if err != nil {
		t.Fatal(err)
	}
	const rule = "{type: approval, when: above, above: 60}"
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yml")
	if err := os.WriteFile(pol, []byte(strings.Replace(string(b), rule, "{type: approval, when: above, above: 60, approver_role: admin}", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(path, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	d := startHTTP(t, daemonOpts{manifest: path, extra: []string{"--policy", pol}})
	agent := connectAs(t, d, "2026-07-28", operatorToken, accept)
	args := map[string]any{"value": 70, "idempotency_key": "approved-before-reload"}
	r := structured(t, call(t, agent, "do_heater_zone_a", args))
	details, _ := r["details"].(string)
	_, id, _ := strings.Cut(details, "approval_id=")
	id, _, _ = strings.Cut(id, ";")
	if r["code"] != "approval_pending" || id == "" {
		t.Fatalf("the agent's call: %v", r)
	}
	if code, body := d.requestAs(t, adminDemoToken, "POST", "/approvals/"+id, `{"decision":"approve"}`); code != 200 {
		t.Fatalf("approval: %d %s", code, body)
	}
	// The heater is redefined: another description and a lower maximum
	// that still admits 70.
	src := string(orig)
	heater := src[strings.Index(src, "  - name: heater_zone_a\n"):]
	heater = heater[:strings.Index(heater, "\n\n")+1]
	next := strings.Replace(heater, "range: {min: 0, max: 100}", "range: {min: 0, max: 90}", 1)
	if next == heater {
		t.Fatal("could not redefine heater_zone_a")
	}
	// A second request, still pending at the reload that follows.
	args2 := map[string]any{"value": 65, "idempotency_key": "pending-at-reload"}
	r = structured(t, call(t, agent, "do_heater_zone_a", args2))
	details, _ = r["details"].(string)
	_, id2, _ := strings.Cut(details, "approval_id=")
	id2, _, _ = strings.Cut(id2, ";")
	if r["code"] != "approval_pending" || id2 == "" {
		t.Fatalf("the second call: %v", r)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(src, heater, next, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if rs := waitAuditAny(t, d.state, "manifest_reload", "manifest_reload_rejected"); rs["event"] != "manifest_reload" {
		t.Fatalf("the reload was rejected: %v", rs["reason"])
	}
	res := call(t, agent, "do_heater_zone_a", args)
	if w := d.sim(t).writes("zone_a.heater"); w != 0 {
		t.Errorf("an approval given for the old definition actuated the redefined heater (%d writes): %s", w, text(res))
	}
	if o := structured(t, res); o["status"] != "failed" || o["code"] != "approval_void" {
		t.Errorf("the approved call after the reload: %v", o)
	}
	// The approver is shown the request no more as approvable.
	if code, body := d.requestAs(t, adminDemoToken, "POST", "/approvals/"+id2, `{"decision":"approve"}`); code != 409 || !strings.Contains(string(body), "manifest reload") {
		t.Errorf("approving a request for the old definition: %d %s", code, body)
	}
	// Asked again, the call waits for an approval of the new definition.
	if o := structured(t, call(t, agent, "do_heater_zone_a", args)); o["code"] != "approval_pending" {
		t.Errorf("the call asked again: %v", o)
	}
}

// requestAs is request with another bearer token.
func (d *daemon) requestAs(t *testing.T, token, method, path, body string) (int, []byte) {
	t.Helper()
	saved := d.token
	d.token = token
	defer func() { d.token = saved }()
	return d.request(t, method, path, body)
}

// waitAuditAny waits for the first audit line of any of events.
func waitAuditAny(t *testing.T, state string, events ...string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, e := range events {
			if rs := auditEvents(t, state, e); len(rs) > 0 {
				return rs[0]
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("none of %v in the audit trail", events)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMeshSeesAReload: gw_zone_c reloads a manifest that removes
// vent_zone_c and adds read_humidity_zone_c. Through gw_zone_a, the added
// tool becomes listed and its routed read answers; the removed one is
// unlisted, and a call of it — also one sent right after the reload, while
// gw_zone_a may still list it — fails at once, clearly, and moves nothing.
func TestMeshSeesAReload(t *testing.T) {
	dir := t.TempDir()
	orig, err := os.ReadFile(repoPath("examples/mesh-3node/node_c.yml"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "node_c.yml")
	if err := os.WriteFile(path, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	a := meshNode(t, "a", "127.0.0.2", dir+"/a")
	c := meshNodeWith(t, path, "127.0.0.4", dir+"/c")
	cs := connectHTTP(t, a, "2026-07-28")
	// A 2026-07-28 client keeps a tools/list for its TTL (60 s): each look
	// is a new 2025-11-25 session.
	has := func(tool string) bool { return listTools(t, connectHTTP(t, a, "2025-11-25"))[tool] != nil }
	deadline := time.Now().Add(30 * time.Second)
	for !has("do_vent_zone_c") {
		if time.Now().After(deadline) {
			t.Fatalf("gw_zone_c's tools never listed on gw_zone_a\n%s", a.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	src := string(orig)
	vent := src[strings.Index(src, "  - name: vent_zone_c\n"):]
	humidity := `  - name: humidity_zone_c
    kind: read
    description: Relative humidity in zone C.
    zone: zone_c
    binding: {type: sim, bus: plant, point: zone_c.humidity}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [humidity, air, zone_c]
`
	if err := os.WriteFile(path, []byte(strings.Replace(src, vent, humidity, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitAudit(t, c.state, "manifest_reload", 1)
	start := time.Now()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_vent_zone_c",
		Arguments: map[string]any{"value": 40, "idempotency_key": "after-c-reload", "source": "gw_zone_c"}})
	took := time.Since(start)
	switch {
	case err != nil:
		t.Logf("do_vent_zone_c right after the reload: %v (%v)", err, took)
	case res.IsError:
		t.Logf("do_vent_zone_c right after the reload: %s (%v)", text(res), took)
	default:
		t.Errorf("do_vent_zone_c right after its removal answered (%v): %s", took, text(res))
	}
	if took > 3*time.Second {
		t.Errorf("a call of a tool removed by a peer's reload took %v", took)
	}
	deadline = time.Now().Add(30 * time.Second)
	for has("do_vent_zone_c") || !has("read_humidity_zone_c") {
		if time.Now().After(deadline) {
			t.Fatalf("gw_zone_a still lists vent=%v, humidity=%v", has("do_vent_zone_c"), has("read_humidity_zone_c"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if o := structured(t, call(t, cs, "read_humidity_zone_c", map[string]any{"source": "gw_zone_c"})); o["quality"] != "good" || o["source"] != "gw_zone_c" {
		t.Errorf("the routed read of the added tool: %v", o)
	}
	if w := c.sim(t).writes("zone_c.vent"); w != 0 {
		t.Errorf("the removed vent was written %d times", w)
	}
}

// TestReloadMovesAModbusBus: a bus whose address a reload changes (another
// Modbus server, holding another value) while readers hammer it: every
// read that begins after a reload was audited answers the new server's
// value or an error, never the old server's (a cached or stale good), and
// the daemon's open files do not grow over the reopenings.
func TestReloadMovesAModbusBus(t *testing.T) {
	t.Parallel()
	var addrs [2]string
	for i, v := range []uint16{111, 222} {
		bank := modbustest.NewBank(100)
		bank.SetHolding(1, 3, v)
		srv, err := modbustest.StartTCP("127.0.0.1:0", bank)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Stop() })
		addrs[i] = srv.Addr
	}
	level := `  - name: level
    kind: read
    description: Tank level.
    data_type: int
    semantic_tags: [plc]
    cache_ttl_ms: 5000
    binding: {type: modbus, bus: plc, table: holding, address: 3, data_type: uint16}
`
	manifestAt := func(i int) string {
		return strings.NewReplacer("ADDR", addrs[i], "BUSEXTRA", "", "CAPS", level).Replace(modbusManifest)
	}
	path := filepath.Join(t.TempDir(), "physmcp.manifest.yml")
	if err := os.WriteFile(path, []byte(manifestAt(0)), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startHTTP(t, daemonOpts{manifest: path})
	cs := connectHTTP(t, d, "2026-07-28")
	read := func() map[string]any {
		return structured(t, call(t, cs, "read_level", map[string]any{}))
	}
	if o := read(); o["value"] != 111.0 {
		t.Fatalf("first read: %v", o)
	}
	fds0, gr0 := procFDs(t, d.cmd.Process.Pid), d.goroutines(t)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				_, _ = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "read_level", Arguments: map[string]any{"max_age_ms": 0}})
			}
		}()
	}
	want := map[int]float64{0: 111, 1: 222}
	goods := 0
	for i := 1; i <= 20; i++ {
		if err := os.WriteFile(path, []byte(manifestAt(i%2)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitAudit(t, d.state, "manifest_reload", i)
		o := read()
		if o["quality"] == "good" {
			goods++
		}
		if o["quality"] == "good" && o["value"] != want[i%2] {
			t.Errorf("reload %d: read after the reload answered %v good from the other server: %v", i, o["value"], o)
		}
	}
	stop()
	wg.Wait()
	if goods < 10 {
		t.Errorf("only %d of 20 reads after a reload were good", goods)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		fds, gr := procFDs(t, d.cmd.Process.Pid), d.goroutines(t)
		if fds <= fds0+2 && gr <= gr0+5 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("over 20 bus reopenings: open files %d → %d, goroutines %d → %d", fds0, fds, gr0, gr)
			break
		}
	}
	// The bus metrics follow the reopened bus, not the first instance.
	requests := func() float64 {
		_, body := d.request(t, "GET", "/metrics", "")
		return metric(string(body), `physd_bus_requests{bus="plc"}`)
	}
	before := requests()
	for range 3 {
		call(t, cs, "read_level", map[string]any{"max_age_ms": 0})
	}
	if after := requests(); after < before+3 {
		t.Errorf("physd_bus_requests{bus=\"plc\"} %v → %v over three device reads on the reopened bus", before, after)
	}
}

// TestReloadGuardsWhatItAdds: what a reload adds or tightens is guarded
// from the first call. With the greenhouse policy, an added do_ capability
// that the gate's allow table does not name is refused (fail_closed: deny);
// without a policy, requires_permission raised by the manifest refuses the
// stdio caller's role at once.
func TestReloadGuardsWhatItAdds(t *testing.T) {
	t.Parallel()
	orig, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	src := string(orig)
	fan := fanBlock(t, src)
	fanA := strings.NewReplacer("fan_zone_b", "fan_zone_a", "zone: zone_b", "zone: zone_a", "zone_b.fan", "zone_a.fan", "in zone B", "in zone A",
		", zone_b]", ", zone_a]", "zone_b_air_change", "zone_a_air_change").Replace(fan)
	added := strings.Replace(src, fan, fan+fanA, 1)

	t.Run("policy", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		path := filepath.Join(dir, "physmcp.manifest.yml")
		if err := os.WriteFile(path, orig, 0o644); err != nil {
			t.Fatal(err)
		}
		d := startHTTP(t, daemonOpts{manifest: path, extra: []string{"--policy", greenhousePolicy}})
		cs := connectAs(t, d, "2026-07-28", adminDemoToken, nil)
		if err := os.WriteFile(path, []byte(added), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		if rs := waitAuditAny(t, d.state, "manifest_reload", "manifest_reload_rejected"); rs["event"] != "manifest_reload" {
			t.Fatalf("the reload was rejected: %v", rs["reason"])
		}
		o := structured(t, call(t, cs, "do_fan_zone_a", map[string]any{"value": 30, "idempotency_key": "added-1"}))
		if o["status"] != "failed" || d.sim(t).writes("zone_a.fan") != 0 {
			t.Errorf("an added do_ the gate does not allow: %v", o)
		}
	})
	t.Run("policy names a removed tool", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		path := filepath.Join(dir, "physmcp.manifest.yml")
		if err := os.WriteFile(path, orig, 0o644); err != nil {
			t.Fatal(err)
		}
		d := startHTTP(t, daemonOpts{manifest: path, extra: []string{"--policy", greenhousePolicy}})
		cs := connectAs(t, d, "2026-07-28", adminDemoToken, nil)
		vent := src[strings.Index(src, "  - name: vent_zone_c\n"):strings.Index(src, "  - name: heater_zone_c\n")]
		if err := os.WriteFile(path, []byte(strings.Replace(src, vent, "", 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		rs := waitAuditAny(t, d.state, "manifest_reload", "manifest_reload_rejected")
		if reason, _ := rs["reason"].(string); rs["event"] != "manifest_reload_rejected" || !strings.Contains(reason, "do_vent_zone_c") || !strings.Contains(reason, "physmcp.policy.yml:") {
			t.Errorf("a manifest removing a tool its policy names: %v", rs)
		}
		if o := structured(t, call(t, cs, "do_vent_zone_c", map[string]any{"value": 30, "idempotency_key": "still-guarded"})); o["status"] != "success" {
			t.Errorf("the vent after the rejected reload: %v", o)
		}
	})
	t.Run("manifest only", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		path := filepath.Join(dir, "physmcp.manifest.yml")
		if err := os.WriteFile(path, orig, 0o644); err != nil {
			t.Fatal(err)
		}
		cs, d := startStdio(t, "2025-11-25", daemonOpts{manifest: path, extra: []string{"--stdio-role", "operator"}})
		if o := structured(t, call(t, cs, "do_fan_zone_b", map[string]any{"value": 30, "idempotency_key": "before"})); o["status"] != "success" {
			t.Fatalf("before: %v", o)
		}
		raised := strings.Replace(src, fan, strings.Replace(fan, "    timeout_ms: 2000\n", "    timeout_ms: 2000\n    requires_permission: supervisor\n", 1), 1)
		if err := os.WriteFile(path, []byte(raised), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		if rs := waitAuditAny(t, d.state, "manifest_reload", "manifest_reload_rejected"); rs["event"] != "manifest_reload" {
			t.Fatalf("the reload was rejected: %v", rs["reason"])
		}
		o := structured(t, call(t, cs, "do_fan_zone_b", map[string]any{"value": 40, "idempotency_key": "after"}))
		if o["status"] != "failed" || o["permission"] != "permission_insufficient" {
			t.Errorf("an operator after requires_permission: supervisor: %v", o)
		}
		if w := d.sim(t).writes("zone_b.fan"); w != 1 {
			t.Errorf("%d writes of the fan", w)
		}
	})
}

// TestReloadAppliesAlarms: alarms are part of the manifest a reload puts
// in force. A threshold lowered below the current value raises; a
// capability removed with its stale_s alarm raises nothing afterwards
// (the engine kept the startup manifest's alarms: neither held).
func TestReloadAppliesAlarms(t *testing.T) {
	t.Parallel()
	orig, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	src := string(orig)
	temp := src[strings.Index(src, "  - name: temperature_zone_a\n"):]
	temp = temp[:strings.Index(temp, "\n\n")+1]
	watched := func(high string) string {
		return strings.Replace(src, temp, temp+"    poll_ms: 200\n    alarms: {high: "+high+", stale_s: 2}\n", 1)
	}
	path := filepath.Join(t.TempDir(), "physmcp.manifest.yml")
	if err := os.WriteFile(path, []byte(watched("45")), 0o644); err != nil {
		t.Fatal(err)
	}
	_, d := startStdio(t, "2025-11-25", daemonOpts{manifest: path})
	hup := func(content string, n int) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitAudit(t, d.state, "manifest_reload", n)
	}
	time.Sleep(time.Second)
	if rs := auditEvents(t, d.state, "alarm_raised"); len(rs) != 0 {
		t.Fatalf("an alarm before the reload: %v", rs)
	}
	hup(watched("-5"), 1) // the greenhouse is warmer than -5 °C
	raised := func() []map[string]any { return auditEvents(t, d.state, "alarm_raised") }
	deadline := time.Now().Add(5 * time.Second)
	for len(raised()) == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if rs := raised(); len(rs) == 0 || rs[0]["tool"] != "read_temperature_zone_a" {
		t.Errorf("a high threshold lowered below the value by a reload raised nothing: %v", rs)
	}
	// Removed: nothing reads it any more, and no stale alarm may follow.
	n := len(raised())
	hup(strings.Replace(src, temp, "", 1), 2)
	time.Sleep(4 * time.Second)
	for _, r := range raised()[n:] {
		t.Errorf("an alarm of a capability the reload removed: %v", r)
	}
}

// TestReloadKeepsHistoryOfAddedCapabilities: a numeric capability a
// reload adds has a history like the others (the issue: "the ledger and
// history carry over by capability name"; history kept the startup
// manifest's capabilities).
func TestReloadKeepsHistoryOfAddedCapabilities(t *testing.T) {
	t.Parallel()
	orig, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(path, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	cs, d := startStdio(t, "2025-11-25", daemonOpts{manifest: path})
	next := strings.Replace(string(orig), "  - name: vent_zone_c\n", strings.Replace(speedBlock, "    semantic_tags: [fan, airflow, zone_b]\n",
		"    semantic_tags: [fan, airflow, zone_b]\n    poll_ms: 200\n", 1)+"  - name: vent_zone_c\n", 1)
	if err := os.WriteFile(path, []byte(next), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitAudit(t, d.state, "manifest_reload", 1)
	time.Sleep(2 * time.Second)
	res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "physmcp://history/fan_speed_zone_b"})
	if err != nil {
		t.Fatalf("history of the added capability: %v", err)
	}
	if len(res.Contents) == 0 || !strings.Contains(res.Contents[0].Text, `"count":`) {
		t.Errorf("history of the added capability: %s", res.Contents[0].Text)
	}
}

// TestRapidSIGHUPs: ten SIGHUPs in 100 ms, each after a new version of the
// file: the daemon stays up and ends serving the last version.
func TestRapidSIGHUPs(t *testing.T) {
	t.Parallel()
	orig, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	a := string(orig)
	b := strings.Replace(a, "  - name: vent_zone_c\n", speedBlock+"  - name: vent_zone_c\n", 1)
	path := filepath.Join(t.TempDir(), "physmcp.manifest.yml")
	if err := os.WriteFile(path, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	cs, d := startStdio(t, "2025-11-25", daemonOpts{manifest: path})
	for i := range 10 {
		content := a
		if i%2 == 0 {
			content = b
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The last version (a) has no read_fan_speed_zone_b.
	deadline := time.Now().Add(10 * time.Second)
	for slices.Contains(listed(t, cs), "read_fan_speed_zone_b") {
		if time.Now().After(deadline) {
			t.Fatalf("the last version is not in force; audit reloads: %d", len(auditEvents(t, d.state, "manifest_reload")))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if o := structured(t, call(t, cs, "read_temperature_zone_a", map[string]any{})); o["quality"] != "good" {
		t.Errorf("after the storm: %v", o)
	}
	t.Logf("%d reloads applied, %d rejected", len(auditEvents(t, d.state, "manifest_reload")), len(auditEvents(t, d.state, "manifest_reload_rejected")))
}

// TestReloadKeepsTheStdioView: physd --stdio --view water refuses a
// manifest that no longer declares the view (saying so); the view stays
// served.
func TestReloadKeepsTheStdioView(t *testing.T) {
	t.Parallel()
	orig, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "physmcp.manifest.yml")
	if err := os.WriteFile(path, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	cs, d := startStdio(t, "2025-11-25", daemonOpts{manifest: path, extra: []string{"--view", "water", "--stdio-role", "operator"}})
	before := listed(t, cs)
	src := string(orig)
	if err := os.WriteFile(path, []byte(src[:strings.Index(src, "\nviews:")+1]), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if reason := waitAudit(t, d.state, "manifest_reload_rejected", 1); !strings.Contains(reason, `--view "water"`) {
		t.Errorf("rejection: %q", reason)
	}
	if got := listed(t, cs); !slices.Equal(got, before) || slices.Contains(got, "do_fan_zone_b") {
		t.Errorf("the view after a rejected reload: %v (before %v)", got, before)
	}
	if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_fan_zone_b", Arguments: map[string]any{"value": 30, "idempotency_key": "outside"}}); err == nil && !res.IsError {
		t.Errorf("a tool outside the view ran: %s", text(res))
	}
}

// TestReloadReopensTheSimulator: a reload that changes the simulator's
// settings reopens it; its development controls (--sim-control) then act
// on the plant in force, not on the closed one.
func TestReloadReopensTheSimulator(t *testing.T) {
	t.Parallel()
	orig, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "physmcp.manifest.yml")
	if err := os.WriteFile(path, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	cs, d := startStdio(t, "2025-11-25", daemonOpts{manifest: path})
	if err := os.WriteFile(path, []byte(strings.Replace(string(orig), "    seed: 7\n", "    seed: 8\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitAudit(t, d.state, "manifest_reload", 1)
	d.fault(t, "zone_a.temperature", "offline")
	if o := structured(t, call(t, cs, "read_temperature_zone_a", map[string]any{"max_age_ms": 0})); o["quality"] == "good" {
		t.Errorf("a fault set through /sim/plant after the reopen did not reach the plant in force: %v", o)
	}
}

// TestReloadRejectsASharedRegisterOnAReopenedBus: the manifest of
// TestRejectedReloadKeepsThePolicyInForce (two do_ capabilities on one
// register), this time with the bus's settings changed too, so the bus is
// reopened: it must be rejected the same way, and the running manifest
// keep working.
func TestReloadRejectsASharedRegisterOnAReopenedBus(t *testing.T) {
	t.Parallel()
	bank := modbustest.NewBank(100)
	srv, err := modbustest.StartTCP("127.0.0.1:0", bank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	valve := doCap("valve", "int", `{type: modbus, bus: plc, table: holding, address: 1, data_type: uint16}`, "    range: {min: 0, max: 100}\n")
	alias := doCap("valve_alias", "int", `{type: modbus, bus: plc, table: holding, address: 1, data_type: uint16}`, "    range: {min: 0, max: 100}\n")
	manifestOf := func(busExtra string, caps ...string) string {
		return strings.NewReplacer("ADDR", srv.Addr, "BUSEXTRA", busExtra, "CAPS", strings.Join(caps, "")).Replace(modbusManifest)
	}
	path := filepath.Join(t.TempDir(), "physmcp.manifest.yml")
	if err := os.WriteFile(path, []byte(manifestOf("", valve)), 0o644); err != nil {
		t.Fatal(err)
	}
	cs, d := startStdio(t, "2025-11-25", daemonOpts{manifest: path})
	if err := os.WriteFile(path, []byte(manifestOf(", busy_retries: 1", valve, alias)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	rs := waitAuditAny(t, d.state, "manifest_reload", "manifest_reload_rejected")
	if rs["event"] != "manifest_reload_rejected" {
		t.Errorf("a manifest whose reopened bus cannot be bound was put in force: %v", rs["data"])
	}
	if o := structured(t, call(t, cs, "do_valve", map[string]any{"value": 20, "idempotency_key": "after"})); o["status"] != "success" {
		t.Errorf("do_valve after the reload: %v", o)
	}
}
