package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/drivers/modbus/modbustest"
)

// The fail-safe chaos battery (docs/safety.md): each test triggers one
// safe-state event against the built binary and a Modbus TCP device (the
// in-process modbustest bank, which the test reads directly), and measures
// the time from the trigger to the safe value at the device. Each runs
// PHYSD_CHAOS_ROUNDS rounds (default 2); every round must end safe.
//
//	PHYSD_CHAOS_ROUNDS=20 go test -race -run 'TestFailSafe' -v ./e2e
//
// prints p50/p99 per trigger (the README's figures).

// failSafeCaps are the outputs: a heater setpoint (holding 10, leased,
// safe 0) and a pump (coil 5, safe off), and a polled status read so the
// bus notices an outage by itself.
var failSafeCaps = []string{
	doCap("heater", "int", `{type: modbus, bus: plc, table: holding, address: 10, data_type: uint16}`,
		"    range: {min: 0, max: 100}\n    safe: {value: 0, on: [shutdown, start_after_crash, lease_expiry, bus_restored]}\n    lease: {default_s: 60, max_s: 600}\n"),
	doCap("pump", "bool", `{type: modbus, bus: plc, table: coil, address: 5}`,
		"    safe: {value: false, on: [shutdown, start_after_crash]}\n"),
	`  - name: status
    kind: read
    description: status word
    data_type: int
    semantic_tags: [plc]
    binding: {type: modbus, bus: plc, table: holding, address: 20, data_type: uint16}
    poll_ms: 100
`,
}

func chaosRounds(t *testing.T) int { return chaosRoundsOr(t, 2) }

// chaosRoundsOr is PHYSD_CHAOS_ROUNDS, or def without it (1 for the tests
// that start a mesh each round: the test command stays fast; the report's
// 20 rounds come from the variable).
func chaosRoundsOr(t *testing.T, def int) int {
	if s := os.Getenv("PHYSD_CHAOS_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("PHYSD_CHAOS_ROUNDS=%q: want a whole number ≥ 1", s)
		}
		return n
	}
	return def
}

// failSafeManifest writes the manifest for the device at addr.
func failSafeManifest(t *testing.T, addr string) string {
	t.Helper()
	src := strings.NewReplacer("ADDR", addr, "BUSEXTRA", "", "CAPS", strings.Join(failSafeCaps, "")).Replace(modbusManifest)
	p := filepath.Join(t.TempDir(), "physmcp.manifest.yml")
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func startDevice(t *testing.T, addr string) (*modbustest.Bank, *modbustest.Server) {
	t.Helper()
	bank := modbustest.NewBank(100)
	srv, err := modbustest.StartTCP(addr, bank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return bank, srv
}

// awaitDevice polls the bank every millisecond until ok holds, and returns
// when it first did (the test fails after limit).
func awaitDevice(t *testing.T, limit time.Duration, what string, ok func() bool) time.Time {
	t.Helper()
	end := time.Now().Add(limit)
	for time.Now().Before(end) {
		if ok() {
			return time.Now()
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%s: not within %v", what, limit)
	return time.Time{}
}

func heaterAt(bank *modbustest.Bank) uint16 { return bank.Holding(1, 10, 1)[0] }

// leaseAnswer is a do_ answer with the lease fields.
type leaseAnswer struct {
	doAnswer
	Timestamp      time.Time  `json:"timestamp"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at"`
}

func doLease(t *testing.T, cs *mcp.ClientSession, tool string, value any, key string, holdS int) leaseAnswer {
	t.Helper()
	args := map[string]any{"value": value, "idempotency_key": key}
	if holdS > 0 {
		args["hold_s"] = holdS
	}
	res := call(t, cs, tool, args)
	if res.IsError {
		t.Fatalf("%s(%v): tool error: %s", tool, value, text(res))
	}
	var a leaseAnswer
	if err := json.Unmarshal([]byte(text(res)), &a); err != nil {
		t.Fatalf("%s: %v: %s", tool, err, text(res))
	}
	if a.Status != "success" {
		t.Fatalf("%s(%v): %+v", tool, value, a)
	}
	return a
}

// safeAudit counts the audit's safe_state lines by event and status.
func safeAudit(t *testing.T, state string) map[string]int {
	t.Helper()
	out := map[string]int{}
	files, _ := filepath.Glob(filepath.Join(state, "audit", "*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			var r struct {
				Event  string         `json:"event"`
				Status string         `json:"status"`
				Data   map[string]any `json:"data"`
			}
			if json.Unmarshal([]byte(line), &r) == nil && r.Event == "safe_state" {
				out[fmt.Sprint(r.Data["event"], "/", r.Status)]++
			}
		}
	}
	return out
}

// awaitSafeAudit waits (5 s at most) until the audit holds at least n
// safe_state lines of key (event/status): the device shows the value a
// moment before the drive's audit line is written.
func awaitSafeAudit(t *testing.T, state, key string, n int) map[string]int {
	t.Helper()
	end := time.Now().Add(5 * time.Second)
	for {
		got := safeAudit(t, state)
		if got[key] >= n || time.Now().After(end) {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFailSafeSIGTERM: a SIGTERM drives the shutdown outputs to safe before
// the process exits, each audited.
func TestFailSafeSIGTERM(t *testing.T) {
	t.Parallel() // its own daemon, port 0 state and Modbus bank; generous limits
	bank, srv := startDevice(t, "127.0.0.1:0")
	manifest := failSafeManifest(t, srv.Addr)
	var took []time.Duration
	for round := range chaosRounds(t) {
		d := startHTTP(t, daemonOpts{manifest: manifest})
		cs := connectHTTP(t, d, "2026-07-28")
		doLease(t, cs, "do_heater", 70, fmt.Sprint("h", round), 0)
		doLease(t, cs, "do_pump", true, fmt.Sprint("p", round), 0)
		if heaterAt(bank) != 70 || !bank.Coil(1, 5) {
			t.Fatalf("round %d: the device does not show the commands", round)
		}
		cs.Close()
		t0 := time.Now()
		if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		at := awaitDevice(t, 10*time.Second, "SIGTERM → heater 0 and pump off", func() bool { return heaterAt(bank) == 0 && !bank.Coil(1, 5) })
		took = append(took, at.Sub(t0))
		select {
		case <-d.done:
		case <-time.After(15 * time.Second):
			t.Fatalf("physd did not exit after SIGTERM; stderr:\n%s", d.stderr.String())
		}
		if a := safeAudit(t, d.state); a["shutdown/success"] != 2 {
			t.Fatalf("round %d: safe_state audit %v; want 2 shutdown/success", round, a)
		}
	}
	t.Logf("SIGTERM → safe value at the device over %d rounds: %s", len(took), quantiles(took))
}

// TestFailSafeStartAfterCrash: after a SIGKILL the outputs stay where they
// were (no device watchdog here); the restart drives the start_after_crash
// outputs safe before /readyz answers 200 and before any call is served.
func TestFailSafeStartAfterCrash(t *testing.T) {
	t.Parallel() // its own daemon, port 0 state and Modbus bank; generous limits
	bank, srv := startDevice(t, "127.0.0.1:0")
	manifest := failSafeManifest(t, srv.Addr)
	state := t.TempDir()
	var took []time.Duration
	for round := range chaosRounds(t) {
		d := startHTTP(t, daemonOpts{manifest: manifest, state: state})
		cs := connectHTTP(t, d, "2026-07-28")
		doLease(t, cs, "do_heater", 70, fmt.Sprint("h", round), 0)
		doLease(t, cs, "do_pump", true, fmt.Sprint("p", round), 0)
		cs.Close()
		if err := d.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-d.done
		if heaterAt(bank) != 70 || !bank.Coil(1, 5) {
			t.Fatalf("round %d: the outputs moved after SIGKILL with no device watchdog", round)
		}
		t0 := time.Now()
		ready := make(chan time.Time, 1)
		safe := make(chan time.Time, 1)
		go func() {
			safe <- awaitDevice(t, 30*time.Second, "restart → heater 0 and pump off", func() bool { return heaterAt(bank) == 0 && !bank.Coil(1, 5) })
		}()
		r := startHTTP(t, daemonOpts{manifest: manifest, state: state})
		// The first answer of /readyz: by then the device must be safe.
		for {
			code, body := r.request(t, "GET", "/readyz", "")
			if code == 200 {
				ready <- time.Now()
				break
			}
			if time.Since(t0) > 30*time.Second {
				t.Fatalf("/readyz never 200: %s", body)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if heaterAt(bank) != 0 || bank.Coil(1, 5) {
			t.Fatalf("round %d: /readyz answered 200 while the device showed heater %d pump %v", round, heaterAt(bank), bank.Coil(1, 5))
		}
		st, rd := <-safe, <-ready
		if st.After(rd) {
			t.Fatalf("round %d: safe at %v, after /readyz 200 at %v", round, st, rd)
		}
		took = append(took, st.Sub(t0))
		if a := safeAudit(t, state); a["start_after_crash/success"] != 2*(round+1) {
			t.Fatalf("round %d: safe_state audit %v", round, a)
		}
		r.stop(t) // a clean stop: shutdown drives them (already safe) again
	}
	t.Logf("restart after SIGKILL → safe value at the device over %d rounds: %s", len(took), quantiles(took))
}

// TestFailSafeLeaseExpiry: an agent that goes silent past its lease finds
// the output at its safe value when the lease ends.
func TestFailSafeLeaseExpiry(t *testing.T) {
	t.Parallel() // its own daemon, port 0 state and Modbus bank; generous limits
	bank, srv := startDevice(t, "127.0.0.1:0")
	d := startHTTP(t, daemonOpts{manifest: failSafeManifest(t, srv.Addr)})
	cs := connectHTTP(t, d, "2026-07-28")
	var took []time.Duration
	for round := range chaosRounds(t) {
		a := doLease(t, cs, "do_heater", 60+round%30, fmt.Sprint("lease-", round), 1)
		if a.LeaseExpiresAt == nil || !a.LeaseExpiresAt.Equal(a.Timestamp.Add(time.Second)) {
			t.Fatalf("round %d: lease_expires_at %v for timestamp %v and hold_s 1", round, a.LeaseExpiresAt, a.Timestamp)
		}
		if time.Now().After(*a.LeaseExpiresAt) {
			t.Fatalf("round %d: the answer came after its own lease ended", round)
		}
		if v := heaterAt(bank); v == 0 {
			t.Fatalf("round %d: heater 0 within the lease", round)
		}
		at := awaitDevice(t, 5*time.Second, "lease end → heater 0", func() bool { return heaterAt(bank) == 0 })
		if at.Before(*a.LeaseExpiresAt) {
			t.Fatalf("round %d: the output went safe %v before the lease ended", round, a.LeaseExpiresAt.Sub(at))
		}
		took = append(took, at.Sub(*a.LeaseExpiresAt))
	}
	// can_do shows the terms and, after expiry, the safe state.
	res := call(t, cs, "can_do", map[string]any{"intent": map[string]any{"semantic_tags": []string{"plc"}}})
	if !strings.Contains(text(res), `"fail_safe":{"safe_value":0,"on":["shutdown","start_after_crash","lease_expiry","bus_restored"],"lease":{"default_s":60,"max_s":600}`) ||
		!strings.Contains(text(res), `"state":"safe","event":"lease_expiry"`) {
		t.Errorf("can_do does not show the heater's lease terms and safe state: %s", text(res))
	}
	if a := awaitSafeAudit(t, d.state, "lease_expiry/success", len(took)); a["lease_expiry/success"] != len(took) {
		t.Errorf("safe_state audit %v; want %d lease_expiry/success", a, len(took))
	}
	t.Logf("lease end → safe value at the device over %d rounds: %s", len(took), quantiles(took))
}

// TestFailSafeWriteFailsThenSucceeds: the device refuses the safe write
// (exception 04); physd keeps /readyz 503 naming the output and retries
// with backoff, and the output is safe once the device takes writes again.
func TestFailSafeWriteFailsThenSucceeds(t *testing.T) {
	t.Parallel() // its own daemon, port 0 state and Modbus bank; generous limits
	bank, srv := startDevice(t, "127.0.0.1:0")
	d := startHTTP(t, daemonOpts{manifest: failSafeManifest(t, srv.Addr)})
	cs := connectHTTP(t, d, "2026-07-28")
	var took []time.Duration
	for round := range chaosRounds(t) {
		a := doLease(t, cs, "do_heater", 55, fmt.Sprint("f", round), 1)
		bank.SetFault(func(r modbustest.Request) error {
			if r.Write && r.Table == modbustest.HoldingRegisters && r.Addr == 10 {
				return modbustest.Exception(4)
			}
			return nil
		})
		// The lease ends, the drive fails: not ready, the output named.
		end := time.Now().Add(10 * time.Second)
		for {
			code, body := d.request(t, "GET", "/readyz", "")
			if code == 503 && strings.Contains(string(body), "safe:do_heater") {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("round %d: /readyz %d %s; want 503 naming safe:do_heater after the lease %v", round, code, body, a.LeaseExpiresAt)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if heaterAt(bank) != 55 {
			t.Fatalf("round %d: heater %d under the fault", round, heaterAt(bank))
		}
		t0 := time.Now()
		bank.SetFault(nil)
		at := awaitDevice(t, 40*time.Second, "fault cleared → heater 0", func() bool { return heaterAt(bank) == 0 })
		took = append(took, at.Sub(t0))
		end = time.Now().Add(5 * time.Second)
		for {
			if code, _ := d.request(t, "GET", "/readyz", ""); code == 200 {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("round %d: /readyz not 200 after the verified drive", round)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if a := awaitSafeAudit(t, d.state, "lease_expiry/success", len(took)); a["lease_expiry/success"] != len(took) || a["lease_expiry/partial"] < len(took) {
		t.Errorf("safe_state audit %v", a)
	}
	t.Logf("device accepts writes again → safe value (retry backoff) over %d rounds: %s", len(took), quantiles(took))
}

// TestFailSafeBusRestored: the device goes away and comes back holding a
// value nobody commanded; physd drives the bus_restored outputs safe as
// soon as the bus answers again.
func TestFailSafeBusRestored(t *testing.T) {
	t.Parallel() // its own daemon, port 0 state and Modbus bank; generous limits
	bank, srv := startDevice(t, "127.0.0.1:0")
	addr := srv.Addr
	d := startHTTP(t, daemonOpts{manifest: failSafeManifest(t, addr)})
	cs := connectHTTP(t, d, "2026-07-28")
	var took []time.Duration
	for round := range chaosRounds(t) {
		doLease(t, cs, "do_heater", 40, fmt.Sprint("b", round), 600)
		_ = srv.Stop()
		end := time.Now().Add(10 * time.Second)
		for {
			code, body := d.request(t, "GET", "/readyz", "")
			if code == 503 && strings.Contains(string(body), "bus:plc") {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("round %d: the bus outage never showed in /readyz: %d %s", round, code, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
		bank.SetHolding(1, 10, 77) // the device came back with its own idea
		var err error
		t0 := time.Now()
		if srv, err = modbustest.StartTCP(addr, bank); err != nil {
			t.Fatal(err)
		}
		at := awaitDevice(t, 15*time.Second, "bus restored → heater 0", func() bool { return heaterAt(bank) == 0 })
		took = append(took, at.Sub(t0))
	}
	t.Cleanup(func() { _ = srv.Stop() })
	if a := awaitSafeAudit(t, d.state, "bus_restored/success", len(took)); a["bus_restored/success"] < len(took) {
		t.Errorf("safe_state audit %v", a)
	}
	t.Logf("bus answers again → safe value over %d rounds: %s", len(took), quantiles(took))
}

// TestFailSafeQuorumLoss: three gateways; two are SIGKILLed, so the third
// is in a minority partition; once that has held for the partition hold,
// its quorum_loss output goes safe. The time is from the kill to the safe
// value at the survivor's plant (memberlist's failure detection, the 3 s
// partition hold, the drive).
func TestFailSafeQuorumLoss(t *testing.T) {
	src, err := os.ReadFile(repoPath("examples/mesh-3node/node_a.yml"))
	if err != nil {
		t.Fatal(err)
	}
	const anchor = "    side_effects: [zone_a_temperature_change, energy_consumption]\n"
	if !strings.Contains(string(src), anchor) {
		t.Fatal("examples/mesh-3node/node_a.yml changed: no heater_zone_a side_effects line to add the safe state after")
	}
	withSafe := strings.Replace(string(src), anchor, anchor+"    safe: {value: 0, on: [quorum_loss]}\n", 1)
	manifestA := filepath.Join(t.TempDir(), "node_a.yml")
	if err := os.WriteFile(manifestA, []byte(withSafe), 0o600); err != nil {
		t.Fatal(err)
	}
	var took []time.Duration
	for round := range chaosRoundsOr(t, 1) {
		dir := t.TempDir()
		a := meshNodeWith(t, manifestA, "127.0.0.2", dir+"/a")
		b := meshNode(t, "b", "127.0.0.3", dir+"/b")
		c := meshNode(t, "c", "127.0.0.4", dir+"/c")
		cs := connectHTTP(t, a, "2026-07-28")
		res := call(t, cs, "do_heater_zone_a", map[string]any{"value": 60, "idempotency_key": fmt.Sprint("q", round)})
		if r := structured(t, res); r["status"] != "success" {
			t.Fatalf("round %d: do_heater_zone_a: %v", round, r)
		}
		cs.Close()
		// Wait for a healthy mesh before cutting it.
		end := time.Now().Add(20 * time.Second)
		for {
			_, body := get(t, a.url("/status"))
			if strings.Contains(body, `"partition_state":"healthy"`) {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("round %d: the mesh never became healthy: %s", round, body)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// On a loaded machine a starting gateway can sit alone past the
		// partition hold before its peers join: a minority partition, which
		// rightly drives safe too. Count only the drives the kill causes.
		before := safeAudit(t, a.state)["quorum_loss/success"]
		t0 := time.Now()
		for _, d := range []*daemon{b, c} {
			_ = d.cmd.Process.Kill()
			<-d.done
		}
		at := awaitDevice(t, 30*time.Second, "minority partition → heater 0", func() bool { return a.sim(t).Signals["zone_a.heater"] == 0 })
		took = append(took, at.Sub(t0))
		if got := awaitSafeAudit(t, a.state, "quorum_loss/success", before+1); got["quorum_loss/success"] != before+1 {
			t.Fatalf("round %d: safe_state audit %v, %d of them before the kill; want one more", round, got, before)
		}
		a.stop(t)
	}
	t.Logf("two of three gateways killed → safe value at the survivor over %d rounds: %s", len(took), quantiles(took))
}

// interlockCaps: a heater (holding 10) and an irrigation valve (holding
// 12), both safe at 0 on interlock_trip, and the vent position (holding
// 30) and tank level (holding 31) they depend on, polled every 100 ms.
var interlockCaps = []string{
	doCap("heater", "int", `{type: modbus, bus: plc, table: holding, address: 10, data_type: uint16}`,
		"    range: {min: 0, max: 100}\n    safe: {value: 0, on: [interlock_trip]}\n"),
	doCap("valve", "int", `{type: modbus, bus: plc, table: holding, address: 12, data_type: uint16}`,
		"    range: {min: 0, max: 100}\n    safe: {value: 0, on: [interlock_trip]}\n"),
	`  - name: vent
    kind: read
    description: vent position
    data_type: int
    semantic_tags: [plc]
    binding: {type: modbus, bus: plc, table: holding, address: 30, data_type: uint16}
    poll_ms: 100
  - name: tank
    kind: read
    description: tank level
    data_type: int
    semantic_tags: [plc]
    binding: {type: modbus, bus: plc, table: holding, address: 31, data_type: uint16}
    poll_ms: 100
`,
}

const interlockPolicy = `physmcp_policy_version: "0.1"
interlocks:
  - name: vent_open
    kind: interlock
    tool: do_heater
    while: {read: read_vent, above: 80}
    max: 20
  - name: tank_low
    kind: permissive
    tool: do_valve
    applies_above: 0
    requires: {read: read_tank, above: 10}
gate:
  fail_closed: deny
  l0:
    allow:
      - {name: heater, tool: do_heater}
      - {name: valve, tool: do_valve}
`

func startInterlocked(t *testing.T) (*modbustest.Bank, *daemon, *mcp.ClientSession) {
	t.Helper()
	bank, d := startInterlockedWith(t, interlockPolicy)
	return bank, d, connectHTTP(t, d, "2026-07-28")
}

// startInterlockedWith runs physd on the interlock manifest and policy pol
// against a fresh Modbus bank.
func startInterlockedWith(t *testing.T, pol string) (*modbustest.Bank, *daemon) {
	t.Helper()
	bank, srv := startDevice(t, "127.0.0.1:0")
	src := strings.NewReplacer("ADDR", srv.Addr, "BUSEXTRA", "", "CAPS", strings.Join(interlockCaps, "")).Replace(modbusManifest)
	dir := t.TempDir()
	mp, pp := filepath.Join(dir, "physmcp.manifest.yml"), filepath.Join(dir, "physmcp.policy.yml")
	if err := os.WriteFile(mp, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pp, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startHTTP(t, daemonOpts{manifest: mp, extra: []string{"--policy", pp}})
	return bank, d
}

// doRaw calls a do_ tool and returns its answer (tool errors fail).
func doRaw(t *testing.T, cs *mcp.ClientSession, tool string, v any, key string) leaseAnswer {
	t.Helper()
	res := call(t, cs, tool, map[string]any{"value": v, "idempotency_key": key})
	if res.IsError {
		t.Fatalf("%s(%v): %s", tool, v, text(res))
	}
	var a leaseAnswer
	_ = json.Unmarshal([]byte(text(res)), &a)
	return a
}

// TestFailSafeInterlockTrip: a fault opens the vent while the heater runs
// above the interlock's bound: the heater goes safe within an observation;
// while the vent is open a do_ above the bound is refused, naming the rule.
func TestFailSafeInterlockTrip(t *testing.T) {
	t.Parallel() // its own daemon, port 0 state and Modbus bank; generous limits
	bank, _, cs := startInterlocked(t)
	bank.SetHolding(1, 31, 50)
	var took []time.Duration
	for round := range chaosRounds(t) {
		bank.SetHolding(1, 30, 40)
		time.Sleep(250 * time.Millisecond) // polled
		if a := doRaw(t, cs, "do_heater", 60, fmt.Sprint("h", round)); a.Status != "success" {
			t.Fatalf("round %d: heater 60 with the vent at 40: %+v", round, a)
		}
		t0 := time.Now()
		bank.SetHolding(1, 30, 95) // the fault
		at := awaitDevice(t, 5*time.Second, "vent open → heater 0", func() bool { return heaterAt(bank) == 0 })
		took = append(took, at.Sub(t0))
		a := doRaw(t, cs, "do_heater", 30, fmt.Sprint("h2-", round))
		if a.Status != "failed" || a.Code != "interlock_active" || !strings.Contains(a.Reason, "vent_open") || !strings.Contains(a.Reason, "read_vent is 95 (good") {
			t.Fatalf("round %d: heater 30 with the vent at 95: %+v", round, a)
		}
		if heaterAt(bank) != 0 {
			t.Fatalf("round %d: a refused do_ moved the heater", round)
		}
	}
	t.Logf("interlock condition starts to hold → safe value at the device over %d rounds: %s", len(took), quantiles(took))
}

// TestFailSafePermissiveStops: the tank falls below the permissive's level
// while the valve is open: the valve goes safe within an observation.
func TestFailSafePermissiveStops(t *testing.T) {
	t.Parallel() // its own daemon, port 0 state and Modbus bank; generous limits
	bank, _, cs := startInterlocked(t)
	valve := func() uint16 { return bank.Holding(1, 12, 1)[0] }
	var took []time.Duration
	for round := range chaosRounds(t) {
		bank.SetHolding(1, 31, 50)
		time.Sleep(250 * time.Millisecond)
		if a := doRaw(t, cs, "do_valve", 40, fmt.Sprint("v", round)); a.Status != "success" {
			t.Fatalf("round %d: valve 40 with the tank at 50: %+v", round, a)
		}
		t0 := time.Now()
		bank.SetHolding(1, 31, 4)
		at := awaitDevice(t, 5*time.Second, "tank low → valve 0", func() bool { return valve() == 0 })
		took = append(took, at.Sub(t0))
		if a := doRaw(t, cs, "do_valve", 40, fmt.Sprint("v2-", round)); a.Code != "interlock_active" || !strings.Contains(a.Reason, "tank_low") {
			t.Fatalf("round %d: valve 40 with the tank at 4: %+v", round, a)
		}
	}
	t.Logf("permissive stops holding → safe value at the device over %d rounds: %s", len(took), quantiles(took))
}

// TestFailSafeRemoteInterlock: gw_zone_a's heater has a trip on gw_zone_c's
// temperature (read over the mesh). While gw_zone_c answers and the
// condition does not hold, the heater runs; gw_zone_c is SIGKILLed: its
// reading is unknown, the unsafe side, and the heater goes safe.
func TestFailSafeRemoteInterlock(t *testing.T) {
	src, err := os.ReadFile(repoPath("examples/mesh-3node/node_a.yml"))
	if err != nil {
		t.Fatal(err)
	}
	const anchor = "    side_effects: [zone_a_temperature_change, energy_consumption]\n"
	withSafe := strings.Replace(string(src), anchor, anchor+"    safe: {value: 0, on: [interlock_trip]}\n", 1)
	dir := t.TempDir()
	manifestA, policyA := filepath.Join(dir, "node_a.yml"), filepath.Join(dir, "policy_a.yml")
	if err := os.WriteFile(manifestA, []byte(withSafe), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(policyA, []byte(`physmcp_policy_version: "0.1"
interlocks:
  - name: zone_c_hot
    kind: trip
    while: {read: read_temperature_zone_c, source: gw_zone_c, above: 45}
    safe: [do_heater_zone_a]
    max_age_ms: 2000
gate:
  fail_closed: deny
  l0:
    allow:
      - {name: heater, tool: do_heater_zone_a}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var took []time.Duration
	for round := range chaosRoundsOr(t, 1) {
		st := t.TempDir()
		a := meshNodeWithArgs(t, manifestA, "127.0.0.2", st+"/a", "--policy", policyA)
		b := meshNode(t, "b", "127.0.0.3", st+"/b")
		c := meshNode(t, "c", "127.0.0.4", st+"/c")
		cs := connectHTTP(t, a, "2026-07-28")
		var r map[string]any
		end := time.Now().Add(20 * time.Second)
		for { // until gw_zone_c's reading has come over the mesh
			r = structured(t, call(t, cs, "do_heater_zone_a", map[string]any{"value": 60, "idempotency_key": fmt.Sprintf("r%d-%d", round, time.Now().UnixNano())}))
			if r["status"] == "success" || time.Now().After(end) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if r["status"] != "success" {
			t.Fatalf("round %d: heater with gw_zone_c answering: %v", round, r)
		}
		cs.Close()
		t0 := time.Now()
		_ = c.cmd.Process.Kill()
		<-c.done
		at := awaitDevice(t, 20*time.Second, "gw_zone_c killed → heater 0", func() bool { return a.sim(t).Signals["zone_a.heater"] == 0 })
		took = append(took, at.Sub(t0))
		if got := awaitSafeAudit(t, a.state, "interlock_trip/success", 1); got["interlock_trip/success"] < 1 {
			t.Fatalf("round %d: safe_state audit %v", round, got)
		}
		a.stop(t) // the next round binds the same mesh addresses
		b.stop(t)
	}
	t.Logf("owner of a remote interlock reading killed → safe value over %d rounds: %s", len(took), quantiles(took))
}

// TestInterlockBypassTwoPerson: over HTTP, an operator asks for a bypass of
// the vent interlock; the same operator cannot approve it, an admin (another
// person) does; under it the heater may run above the bound with the vent
// open, and the status page and /interlocks show the bypass; DELETE ends it
// and the heater goes safe at once.
func TestInterlockBypassTwoPerson(t *testing.T) {
	t.Parallel() // its own daemon, port 0 state and Modbus bank; generous limits
	pol := strings.Replace(interlockPolicy, "    max: 20\n", "    max: 20\n    bypass: {role: operator, max_minutes: 5}\n", 1) + `identity:
  tokens:
    - {id: operator_console, sha256: d44723fb54413f57fbf393e54ead396013e587a55f29ae10d8565e39e2d6189d, role: operator}
    - {id: site_admin, sha256: ` + adminDemoTokenHash + `, role: admin}
`
	bank, d := startInterlockedWith(t, pol)
	d.token = adminDemoToken
	cs := connectAs(t, d, "2026-07-28", operatorToken, nil)
	bank.SetHolding(1, 31, 50)
	bank.SetHolding(1, 30, 95) // the vent is open
	time.Sleep(300 * time.Millisecond)
	if a := doRaw(t, cs, "do_heater", 60, "bp-1"); a.Code != "interlock_active" {
		t.Fatalf("heater 60 with the vent open: %+v", a)
	}
	send := func(method, path, token, body string) (int, string) {
		req, _ := http.NewRequest(method, d.url(path), strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		if method == "POST" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := send("POST", "/interlocks/vent_open/bypass", operatorToken, `{"minutes": 3, "reason": "vent sensor under repair"}`); code != 200 || !strings.Contains(body, `"state":"pending"`) {
		t.Fatalf("operator asks: %d %s", code, body)
	}
	if code, body := send("POST", "/interlocks/vent_open/bypass/approve", operatorToken, ""); code != 403 || !strings.Contains(body, "another person") {
		t.Fatalf("the operator approves its own request: %d %s", code, body)
	}
	if code, body := send("POST", "/interlocks/vent_open/bypass/approve", adminDemoToken, ""); code != 200 || !strings.Contains(body, `"state":"active"`) {
		t.Fatalf("the admin approves: %d %s", code, body)
	}
	if a := doRaw(t, cs, "do_heater", 60, "bp-2"); a.Status != "success" {
		t.Fatalf("heater 60 under the bypass: %+v", a)
	}
	time.Sleep(300 * time.Millisecond) // polls: the bypassed rule must not trip
	if heaterAt(bank) != 60 {
		t.Fatalf("the bypassed interlock drove the heater to %d", heaterAt(bank))
	}
	if code, body := send("GET", "/interlocks", adminDemoToken, ""); code != 200 || !strings.Contains(body, `"bypassed_by":"token:operator_console and token:site_admin"`) {
		t.Fatalf("/interlocks: %d %s", code, body)
	}
	if _, page := send("GET", "/", adminDemoToken, ""); !strings.Contains(page, "bypassed until") {
		t.Errorf("the status page does not show the bypass")
	}
	t0 := time.Now()
	if code, body := send("DELETE", "/interlocks/vent_open/bypass", operatorToken, ""); code != 200 {
		t.Fatalf("end the bypass: %d %s", code, body)
	}
	at := awaitDevice(t, 5*time.Second, "bypass ended → heater 0", func() bool { return heaterAt(bank) == 0 })
	t.Logf("bypass ended → heater safe in %v", at.Sub(t0).Round(time.Millisecond))
	if a := doRaw(t, cs, "do_heater", 60, "bp-3"); a.Code != "interlock_active" {
		t.Fatalf("heater 60 after the bypass: %+v", a)
	}
}
