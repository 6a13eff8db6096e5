package e2e

// Attacks on the fail-safe feature through the built binary and a Modbus
// TCP peer (docs/safety.md): hold_s over MCP, a stuck device, SIGTERM while
// a lease drive waits for a slow do_, a lease across SIGKILL, an interlock
// that must not wait for another event's retry backoff.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/drivers/modbus/modbustest"
)

// atkAuditLine is one audit line as the attacks read it.
type atkAuditLine struct {
	Seq     uint64         `json:"seq"`
	Event   string         `json:"event"`
	Tool    string         `json:"tool"`
	Key     string         `json:"idempotency_key"`
	Status  string         `json:"status"`
	Applied any            `json:"applied_value"`
	Reason  string         `json:"reason"`
	Data    map[string]any `json:"data"`
}

// atkAudit is every audit line of the state directory, by seq.
func atkAudit(t *testing.T, state string) []atkAuditLine {
	t.Helper()
	var out []atkAuditLine
	files, _ := filepath.Glob(filepath.Join(state, "audit", "*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			var r atkAuditLine
			if json.Unmarshal([]byte(line), &r) == nil && r.Event != "" {
				out = append(out, r)
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out
}

// atkLeaseHistory fails the test if a lease_expiry drive of tool is for a
// lease other than the last applied do_'s.
func atkLeaseHistory(t *testing.T, lines []atkAuditLine, tool string) {
	t.Helper()
	last := ""
	for _, r := range lines {
		if r.Tool != tool {
			continue
		}
		switch {
		case r.Event == "do" && (r.Status == "success" || r.Status == "partial"):
			last = r.Key
		case r.Event == "safe_state" && r.Data["event"] == "lease_expiry":
			_, rest, _ := strings.Cut(r.Reason, ", key ")
			k, _, _ := strings.Cut(rest, ",")
			if k != last {
				t.Errorf("audit seq %d: a lease_expiry drive for key %q after the do_ with key %q applied: %s", r.Seq, k, last, r.Reason)
			}
		}
	}
}

// atkCall is a tools/call that returns protocol errors instead of failing.
func atkCall(cs *mcp.ClientSession, name string, args any) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
}

// TestAttackHoldSOverMCP: every malformed hold_s — 0, negative, a fraction,
// a string, a boolean, above max_s, a huge number, and any hold_s on an
// unleased capability — is a clear error naming hold_s with nothing
// actuated and the lease in force untouched.
func TestAttackHoldSOverMCP(t *testing.T) {
	t.Parallel() // its own daemon, port 0 state and Modbus bank; generous limits
	bank, srv := startDevice(t, "127.0.0.1:0")
	d := startHTTP(t, daemonOpts{manifest: failSafeManifest(t, srv.Addr)})
	cs := connectHTTP(t, d, "2026-07-28")
	first := doLease(t, cs, "do_heater", 70, "base", 600)
	doLease(t, cs, "do_pump", false, "pump-base", 0)
	bad := []struct {
		tool string
		hold any
		v    any
	}{
		{"do_heater", 0, 40}, {"do_heater", -1, 40}, {"do_heater", 1.5, 40}, {"do_heater", "10", 40},
		{"do_heater", true, 40}, {"do_heater", 601, 40}, {"do_heater", 1e20, 40}, {"do_heater", -1e20, 40},
		{"do_heater", json.RawMessage("9223372036854775808"), 40}, {"do_heater", map[string]any{"s": 10}, 40},
		{"do_heater", []int{10}, 40}, {"do_heater", 1e3, 40},
		{"do_pump", 5, true}, {"do_pump", 1, true}, {"do_pump", 0, true}, {"do_pump", 600, true},
	}
	for i, b := range bad {
		key := fmt.Sprint("bad-", i)
		res, err := atkCall(cs, b.tool, map[string]any{"value": b.v, "idempotency_key": key, "hold_s": b.hold})
		msg := ""
		switch {
		case err != nil:
			msg = err.Error()
		case res.IsError:
			msg = text(res)
		default:
			t.Errorf("%s hold_s %v: answered as a call, not an error: %s", b.tool, b.hold, text(res))
		}
		if msg != "" && !strings.Contains(msg, "hold_s") {
			t.Errorf("%s hold_s %v: the error does not name hold_s: %s", b.tool, b.hold, msg)
		}
		if heaterAt(bank) != 70 || bank.Coil(1, 5) {
			t.Fatalf("%s hold_s %v actuated: heater %d pump %v", b.tool, b.hold, heaterAt(bank), bank.Coil(1, 5))
		}
	}
	for _, r := range atkAudit(t, d.state) {
		if strings.HasPrefix(r.Key, "bad-") && r.Event == "do" {
			t.Errorf("a malformed hold_s reached the device: %+v", r)
		}
	}
	// The lease in force is the first one.
	code, body := d.request(t, "GET", "/status", "")
	var st struct {
		Leases []struct {
			Tool      string    `json:"tool"`
			Key       string    `json:"idempotency_key"`
			ExpiresAt time.Time `json:"expires_at"`
		} `json:"leases"`
	}
	if code != 200 || json.Unmarshal(body, &st) != nil {
		t.Fatalf("/status %d %s", code, body)
	}
	if len(st.Leases) != 1 || st.Leases[0].Key != "base" || !st.Leases[0].ExpiresAt.Equal(*first.LeaseExpiresAt) {
		t.Errorf("leases after the malformed calls: %+v; want only base until %v", st.Leases, first.LeaseExpiresAt)
	}
	// hold_s 10.0 is an integer for JSON Schema: either a 10 s hold or a
	// clear error naming hold_s.
	res, err := atkCall(cs, "do_heater", map[string]any{"value": 41, "idempotency_key": "float-int", "hold_s": 10.0})
	if err == nil && !res.IsError {
		var a leaseAnswer
		_ = json.Unmarshal([]byte(text(res)), &a)
		switch {
		case a.Status != "success":
			// Not applied (a device too slow on a loaded machine): no
			// lease is right, and nothing is said about hold_s.
			t.Logf("hold_s 10.0: the do_ was not applied (%s %s: %s); its lease is not tested", a.Status, a.Code, a.Reason)
		case a.LeaseExpiresAt == nil || a.LeaseExpiresAt.Sub(a.Timestamp) != 10*time.Second:
			t.Errorf("hold_s 10.0 accepted with lease %v for timestamp %v", a.LeaseExpiresAt, a.Timestamp)
		}
	}
}

// TestAttackStuckDeviceStaysFailed: the device acknowledges the safe write
// but its register keeps the held value (a stuck actuator). The drive stays
// failed and retried, /readyz stays 503 naming safe:do_heater and can_do
// shows the failed state; once the device acts, the next retry verifies.
func TestAttackStuckDeviceStaysFailed(t *testing.T) {
	bank, srv := startDevice(t, "127.0.0.1:0")
	d := startHTTP(t, daemonOpts{manifest: failSafeManifest(t, srv.Addr)})
	cs := connectHTTP(t, d, "2026-07-28")
	doLease(t, cs, "do_heater", 55, "stuck", 1)
	bank.SetFault(func(r modbustest.Request) error {
		if !r.Write && r.Table == modbustest.HoldingRegisters && r.Addr <= 10 && int(r.Addr)+int(r.Qty) > 10 {
			bank.SetHolding(1, 10, 55) // whatever was written, it shows 55
		}
		return nil
	})
	// Attempts at 1 s, +1, +2, +4: by 9 s four, all partial, never ready.
	end := time.Now().Add(9 * time.Second)
	for time.Now().Before(end) {
		code, body := d.request(t, "GET", "/readyz", "")
		if time.Until(end) < 7*time.Second && (code != 503 || !strings.Contains(string(body), "safe:do_heater")) {
			t.Fatalf("/readyz %d %s with a stuck safe drive", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if a := safeAudit(t, d.state); a["lease_expiry/partial"] < 4 || a["lease_expiry/success"] != 0 {
		t.Fatalf("safe_state audit with a stuck device: %v; want ≥ 4 lease_expiry/partial and no success", a)
	}
	res := call(t, cs, "can_do", map[string]any{"intent": map[string]any{"semantic_tags": []string{"plc"}}})
	if !strings.Contains(text(res), `"state":"failed","event":"lease_expiry"`) {
		t.Errorf("can_do does not show the failed drive: %s", text(res))
	}
	bank.SetFault(nil)
	awaitDevice(t, 20*time.Second, "device acts again → heater 0", func() bool { return heaterAt(bank) == 0 })
	end = time.Now().Add(5 * time.Second)
	for {
		if code, _ := d.request(t, "GET", "/readyz", ""); code == 200 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("/readyz not 200 after the verified drive")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAttackSIGTERMWhileLeaseDriveWaits: a lease runs out while a renewal
// on a slow device (each access near the bus timeout) holds the output's
// turn, and SIGTERM arrives then. physd must end with the heater at its
// safe value, verified and audited, exit within its grace, never drive for
// the replaced lease, and leave no lease to restore.
func TestAttackSIGTERMWhileLeaseDriveWaits(t *testing.T) {
	bank, srv := startDevice(t, "127.0.0.1:0")
	manifest := failSafeManifest(t, srv.Addr)
	state := t.TempDir()
	for round := range chaosRounds(t) {
		d := startHTTP(t, daemonOpts{manifest: manifest, state: state})
		cs := connectHTTP(t, d, "2026-07-28")
		a := doLease(t, cs, "do_heater", 70, fmt.Sprint("old", round), 1)
		bank.SetDelay(func(r modbustest.Request) time.Duration {
			if r.Table == modbustest.HoldingRegisters && r.Addr == 10 {
				return 150 * time.Millisecond
			}
			return 0
		})
		// The renewal's device step (three slow accesses) spans the end
		// of the old lease.
		time.Sleep(time.Until(a.LeaseExpiresAt.Add(-250 * time.Millisecond)))
		renewed := make(chan string, 1)
		go func() {
			res, err := atkCall(cs, "do_heater", map[string]any{"value": 33, "idempotency_key": fmt.Sprint("new", round), "hold_s": 600})
			if err != nil {
				renewed <- err.Error()
				return
			}
			renewed <- text(res)
		}()
		time.Sleep(time.Until(a.LeaseExpiresAt.Add(50 * time.Millisecond)))
		t0 := time.Now()
		if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-d.done:
		case <-time.After(15 * time.Second):
			t.Fatalf("round %d: physd did not exit after SIGTERM; stderr:\n%s", round, d.stderr.String())
		}
		took := time.Since(t0)
		bank.SetDelay(nil)
		ans := <-renewed
		if v := heaterAt(bank); v != 0 {
			t.Fatalf("round %d: physd exited with the heater at %d (renewal: %s)", round, v, ans)
		}
		if a := safeAudit(t, state); a["shutdown/success"] < round+1 {
			t.Fatalf("round %d: safe_state audit %v; want a verified shutdown drive", round, a)
		}
		if strings.Contains(d.stderr.String(), "SHUTDOWN SAFE STATE NOT VERIFIED") {
			t.Errorf("round %d: %s", round, d.stderr.String())
		}
		atkLeaseHistory(t, atkAudit(t, state), "do_heater")
		t.Logf("round %d: SIGTERM → exit %v; renewal answered %.120s", round, took, ans)
		// A clean restart restores no lease and moves nothing.
		bank.SetHolding(1, 10, 0)
		r := startHTTP(t, daemonOpts{manifest: manifest, state: state})
		code, body := r.request(t, "GET", "/status", "")
		if code != 200 || strings.Contains(string(body), `"leases":[{`) {
			t.Errorf("round %d: after a verified shutdown drive a lease is restored: %s", round, body)
		}
		r.stop(t)
	}
}

// leaseOnlyCaps: a heater whose only safe event is lease_expiry, so a
// SIGKILL leaves its lease to the record.
var leaseOnlyCaps = []string{
	doCap("heater", "int", `{type: modbus, bus: plc, table: holding, address: 10, data_type: uint16}`,
		"    range: {min: 0, max: 100}\n    safe: {value: 0, on: [lease_expiry]}\n    lease: {default_s: 60, max_s: 600}\n"),
}

func atkManifestFile(t *testing.T, addr string, caps []string) string {
	t.Helper()
	src := strings.NewReplacer("ADDR", addr, "BUSEXTRA", "", "CAPS", strings.Join(caps, "")).Replace(modbusManifest)
	p := filepath.Join(t.TempDir(), "physmcp.manifest.yml")
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAttackLeaseAcrossSIGKILL: physd is killed in the middle of a lease
// and restarted: the output holds its value until the recorded expiry (not
// longer, not a fresh hold from the restart) and then goes safe; the
// restart shows the lease with its original expiry.
func TestAttackLeaseAcrossSIGKILL(t *testing.T) {
	t.Parallel() // its own daemon, port 0 state and Modbus bank; generous limits
	bank, srv := startDevice(t, "127.0.0.1:0")
	manifest := atkManifestFile(t, srv.Addr, leaseOnlyCaps)
	state := t.TempDir()
	d := startHTTP(t, daemonOpts{manifest: manifest, state: state})
	cs := connectHTTP(t, d, "2026-07-28")
	a := doLease(t, cs, "do_heater", 70, "held", 6)
	cs.Close()
	time.Sleep(time.Second)
	_ = d.cmd.Process.Kill()
	<-d.done
	r := startHTTP(t, daemonOpts{manifest: manifest, state: state})
	_, body := r.request(t, "GET", "/status", "")
	if !strings.Contains(string(body), `"idempotency_key":"held"`) {
		t.Fatalf("the lease was not restored after SIGKILL: %s", body)
	}
	var st struct {
		Leases []struct {
			ExpiresAt time.Time `json:"expires_at"`
		} `json:"leases"`
	}
	_ = json.Unmarshal(body, &st)
	if len(st.Leases) != 1 || !st.Leases[0].ExpiresAt.Equal(*a.LeaseExpiresAt) {
		t.Errorf("restored lease %+v; want expires_at %v", st.Leases, a.LeaseExpiresAt)
	}
	time.Sleep(time.Until(a.LeaseExpiresAt.Add(-300 * time.Millisecond)))
	if v := heaterAt(bank); v != 70 {
		t.Fatalf("the heater is %d before the recorded lease ends; want 70", v)
	}
	at := awaitDevice(t, 3*time.Second, "recorded lease end → heater 0", func() bool { return heaterAt(bank) == 0 })
	if at.Before(*a.LeaseExpiresAt) {
		t.Errorf("the heater went safe %v before the recorded lease ended", a.LeaseExpiresAt.Sub(at))
	}
	if late := at.Sub(*a.LeaseExpiresAt); late > time.Second {
		t.Errorf("the heater went safe %v after the recorded lease ended", late)
	}
}

// tripLeaseCaps: a leased heater safe on lease_expiry and interlock_trip,
// and the vent it depends on, polled every 100 ms.
var tripLeaseCaps = []string{
	doCap("heater", "int", `{type: modbus, bus: plc, table: holding, address: 10, data_type: uint16}`,
		"    range: {min: 0, max: 100}\n    safe: {value: 0, on: [lease_expiry, interlock_trip]}\n    lease: {default_s: 60, max_s: 600}\n"),
	`  - name: vent
    kind: read
    description: vent position
    data_type: int
    semantic_tags: [plc]
    binding: {type: modbus, bus: plc, table: holding, address: 30, data_type: uint16}
    poll_ms: 100
`,
}

const tripLeasePolicy = `physmcp_policy_version: "0.1"
interlocks:
  - name: vent_open
    kind: interlock
    tool: do_heater
    while: {read: read_vent, above: 80}
    max: 20
gate:
  fail_closed: deny
  l0:
    allow:
      - {name: heater, tool: do_heater}
`

// TestAttackTripWaitsForLeaseRetry: the lease drive of the heater fails
// (the device refuses writes) and backs off; the device takes writes again
// and then the vent opens with the heater above the interlock's bound. The
// heater must go safe within an observation, not at the lease drive's next
// retry seconds later.
func TestAttackTripWaitsForLeaseRetry(t *testing.T) {
	bank, srv := startDevice(t, "127.0.0.1:0")
	dir := t.TempDir()
	mp, pp := atkManifestFile(t, srv.Addr, tripLeaseCaps), filepath.Join(dir, "physmcp.policy.yml")
	if err := os.WriteFile(pp, []byte(tripLeasePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	bank.SetHolding(1, 30, 40)
	d := startHTTP(t, daemonOpts{manifest: mp, extra: []string{"--policy", pp}})
	cs := connectHTTP(t, d, "2026-07-28")
	time.Sleep(300 * time.Millisecond)
	res := call(t, cs, "do_heater", map[string]any{"value": 60, "idempotency_key": "h", "hold_s": 1})
	if !strings.Contains(text(res), `"status":"success"`) {
		t.Fatalf("heater 60: %s", text(res))
	}
	bank.SetFault(func(r modbustest.Request) error {
		if r.Write && r.Table == modbustest.HoldingRegisters && r.Addr == 10 {
			return modbustest.Exception(4)
		}
		return nil
	})
	// Attempts at 1 s, +1 and +2 s; the next is 4 s after the third.
	end := time.Now().Add(15 * time.Second)
	for safeAudit(t, d.state)["lease_expiry/failed"]+safeAudit(t, d.state)["lease_expiry/partial"] < 3 {
		if time.Now().After(end) {
			t.Fatalf("the lease drive did not fail three times: %v", safeAudit(t, d.state))
		}
		time.Sleep(10 * time.Millisecond)
	}
	bank.SetFault(nil)
	t0 := time.Now()
	bank.SetHolding(1, 30, 95) // the interlock's condition starts to hold
	end = time.Now().Add(4 * time.Second)
	for heaterAt(bank) != 0 && time.Now().Before(end) {
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(t0)
	if heaterAt(bank) != 0 {
		t.Fatalf("the vent opened with the heater at 60 and the device taking writes; the heater is still %d after %v", heaterAt(bank), took)
	}
	if took > time.Second {
		t.Errorf("the vent opened with the heater at 60 and the device taking writes; the heater went safe only after %v (the lease drive's retry backoff, not the interlock's observation)", took.Round(time.Millisecond))
	}
}

// verifyTripCaps: the heater (holding 10) verified by its active-setpoint
// register (holding 11, which the device mirrors), safe on interlock_trip;
// the vent (holding 30) polled every 100 ms.
var verifyTripCaps = []string{
	doCap("heater", "int", `{type: modbus, bus: plc, table: holding, address: 10, data_type: uint16, verify: {table: holding, address: 11}}`,
		"    range: {min: 0, max: 100}\n    safe: {value: 0, on: [interlock_trip]}\n"),
	`  - name: vent
    kind: read
    description: vent position
    data_type: int
    semantic_tags: [plc]
    binding: {type: modbus, bus: plc, table: holding, address: 30, data_type: uint16}
    poll_ms: 100
`,
}

// TestAttackInterlockVerifyPointOutput: through the binary, a heater whose
// binding has a verify point (the recommended setup for a stuck actuator,
// docs/safety.md) is set to 60 with the vent closed and verified; then a
// fault opens the vent. The interlock must drive the heater safe within an
// observation, as it does for a heater without a verify point.
func TestAttackInterlockVerifyPointOutput(t *testing.T) {
	t.Parallel() // its own daemon, port 0 state and Modbus bank; generous limits
	bank, srv := startDevice(t, "127.0.0.1:0")
	bank.AddMirror(modbustest.Mirror{Unit: 1, From: modbustest.HoldingRegisters, FromAddr: 10, To: modbustest.HoldingRegisters, ToAddr: 11, N: 1})
	dir := t.TempDir()
	mp, pp := atkManifestFile(t, srv.Addr, verifyTripCaps), filepath.Join(dir, "physmcp.policy.yml")
	if err := os.WriteFile(pp, []byte(tripLeasePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	bank.SetHolding(1, 30, 40)
	d := startHTTP(t, daemonOpts{manifest: mp, extra: []string{"--policy", pp}})
	cs := connectHTTP(t, d, "2026-07-28")
	time.Sleep(300 * time.Millisecond)
	for round := range chaosRounds(t) {
		bank.SetHolding(1, 30, 40)
		time.Sleep(300 * time.Millisecond)
		a := doRaw(t, cs, "do_heater", 60, fmt.Sprint("v", round))
		if a.Status != "success" || !a.Verified {
			t.Fatalf("round %d: heater 60 with the vent at 40: %+v", round, a)
		}
		t0 := time.Now()
		bank.SetHolding(1, 30, 95)
		end := time.Now().Add(5 * time.Second)
		for heaterAt(bank) != 0 && time.Now().Before(end) {
			time.Sleep(5 * time.Millisecond)
		}
		if v := heaterAt(bank); v != 0 {
			t.Fatalf("round %d: the vent is at 95 and the verified heater is still %d after %v (the interlock judges it on the reading taken before the write)", round, v, time.Since(t0).Round(time.Millisecond))
		}
	}
}

// TestAttackSIGTERMWithOpenSession: SIGTERM while an agent's MCP session
// is still connected (its standing stream open, as a real agent's is).
// The shutdown outputs must go safe promptly: an idle session must not
// hold the drive back for the whole shutdown grace.
func TestAttackSIGTERMWithOpenSession(t *testing.T) {
	t.Parallel() // its own daemon, port 0 state and Modbus bank; generous limits
	bank, srv := startDevice(t, "127.0.0.1:0")
	d := startHTTP(t, daemonOpts{manifest: failSafeManifest(t, srv.Addr)})
	cs := connectHTTP(t, d, "2026-07-28")
	doLease(t, cs, "do_heater", 70, "open-session", 600)
	t0 := time.Now()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	at := awaitDevice(t, 15*time.Second, "SIGTERM with a session open → heater 0", func() bool { return heaterAt(bank) == 0 })
	if took := at.Sub(t0); took > 3*time.Second {
		t.Errorf("SIGTERM with an idle MCP session open: the heater went safe only after %v", took.Round(time.Millisecond))
	}
	select {
	case <-d.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("physd did not exit; stderr:\n%s", d.stderr.String())
	}
}

// TestAttackSIGHUPTripsHealthyPlant: through the binary, a SIGHUP reload
// that changes only the vent's description (a slow-ish device: 120 ms per
// vent read) must not drive the heater safe while the vent stays closed.
func TestAttackSIGHUPTripsHealthyPlant(t *testing.T) {
	t.Parallel() // its own daemon, port 0 state and Modbus bank; generous limits
	bank, srv := startDevice(t, "127.0.0.1:0")
	dir := t.TempDir()
	// The bus and the vent wait up to a second for a reply (default max
	// age: 2 × poll + timeout = 1.2 s): the test is about the reload, and
	// on a loaded machine a 120 ms read that misses the usual 200 ms bus
	// timeout is a real stale reading, which rightly trips.
	caps := slices.Clone(interlockCaps)
	for i, c := range caps {
		caps[i] = strings.Replace(c, "    description: vent position\n", "    description: vent position\n    timeout_ms: 1000\n", 1)
	}
	mp, pp := atkManifestFile(t, srv.Addr, caps), filepath.Join(dir, "physmcp.policy.yml")
	if b, err := os.ReadFile(mp); err != nil || !strings.Contains(string(b), "timeout_ms: 200}") {
		t.Fatalf("the modbus manifest's bus timeout changed: update this test (%v)", err)
	} else if err := os.WriteFile(mp, []byte(strings.Replace(string(b), "timeout_ms: 200}", "timeout_ms: 1000}", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pp, []byte(interlockPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	bank.SetHolding(1, 30, 40)
	bank.SetHolding(1, 31, 50)
	bank.SetDelay(func(r modbustest.Request) time.Duration {
		if !r.Write && r.Addr == 30 {
			return 120 * time.Millisecond
		}
		return 0
	})
	d := startHTTP(t, daemonOpts{manifest: mp, extra: []string{"--policy", pp}})
	cs := connectHTTP(t, d, "2026-07-28")
	time.Sleep(500 * time.Millisecond)
	if a := doRaw(t, cs, "do_heater", 60, "h"); a.Status != "success" {
		t.Fatalf("heater 60 with the vent at 40: %+v", a)
	}
	src, err := os.ReadFile(mp)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 6 {
		next := strings.Replace(string(src), "description: vent position", fmt.Sprintf("description: vent position rev %d", round), 1)
		if err := os.WriteFile(mp, []byte(next), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(1300+round*170) * time.Millisecond)
		if v := heaterAt(bank); v != 60 {
			// The drive's audit line follows its verified write: give it a
			// moment, so the failure says why.
			var why []string
			for end := time.Now().Add(3 * time.Second); len(why) == 0 && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				for _, r := range atkAudit(t, d.state) {
					if r.Event == "safe_state" {
						why = append(why, r.Reason)
					}
				}
			}
			var logged []string
			for _, line := range strings.Split(d.stderr.String(), "\n") {
				if strings.Contains(line, "interlock") || strings.Contains(line, "safe state") || strings.Contains(line, "reload") {
					logged = append(logged, line)
				}
			}
			t.Fatalf("round %d: a SIGHUP that changed only read_vent's description drove the heater to %d with the vent at 40: %q\nlog:\n%s", round, v, why, strings.Join(logged, "\n"))
		}
	}
}

// slowLeaseCaps: a leased heater whose device accesses are bounded by
// 300 ms (so a safe drive waits for its turn at most 4×300 ms + 1 s).
var slowLeaseCaps = []string{
	doCap("heater", "int", `{type: modbus, bus: plc, table: holding, address: 10, data_type: uint16}`,
		"    range: {min: 0, max: 100}\n    timeout_ms: 300\n    safe: {value: 0, on: [lease_expiry]}\n    lease: {default_s: 60, max_s: 600}\n"),
}

// TestAttackLeaseDriveTimesOutWaitingForTurn: through the binary, a lease
// ends while agents' do_ calls (each refused by the slow device, nothing
// applied) hold the heater's turn longer than the drive waits. The drive
// is recorded failed; it must be retried, so that once the device answers
// normally the heater whose lease ran out reaches its safe value.
func TestAttackLeaseDriveTimesOutWaitingForTurn(t *testing.T) {
	bank, srv := startDevice(t, "127.0.0.1:0")
	d := startHTTP(t, daemonOpts{manifest: atkManifestFile(t, srv.Addr, slowLeaseCaps)})
	cs := connectHTTP(t, d, "2026-07-28")
	a := doLease(t, cs, "do_heater", 60, "held", 1)
	bank.SetDelay(func(r modbustest.Request) time.Duration {
		if r.Table == modbustest.HoldingRegisters && r.Addr == 10 {
			return 150 * time.Millisecond
		}
		return 0
	})
	bank.SetFault(func(r modbustest.Request) error {
		if r.Write && r.Table == modbustest.HoldingRegisters && r.Addr == 10 {
			return modbustest.Exception(4)
		}
		return nil
	})
	done := make(chan string, 12)
	for i := range 12 {
		go func() {
			res, err := atkCall(cs, "do_heater", map[string]any{"value": 10, "idempotency_key": fmt.Sprint("q", i), "hold_s": 600})
			if err != nil {
				done <- err.Error()
				return
			}
			done <- text(res)
		}()
	}
	for range 12 {
		if ans := <-done; strings.Contains(ans, `"status":"success"`) {
			t.Fatalf("a do_ applied on a device refusing writes: %s", ans)
		}
	}
	bank.SetDelay(nil)
	bank.SetFault(nil)
	if time.Now().Before(*a.LeaseExpiresAt) {
		t.Fatalf("the queue ended before the lease did (%v): the drive did not wait", a.LeaseExpiresAt)
	}
	t.Logf("safe_state audit after the queue: %v", safeAudit(t, d.state))
	end := time.Now().Add(15 * time.Second)
	for heaterAt(bank) != 0 && time.Now().Before(end) {
		time.Sleep(10 * time.Millisecond)
	}
	if v := heaterAt(bank); v != 0 {
		_, body := d.request(t, "GET", "/readyz", "")
		t.Errorf("15 s after the device answers again the heater whose lease ended is still %d; /readyz: %s; audit %v", v, body, safeAudit(t, d.state))
	}
}
