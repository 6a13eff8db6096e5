package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	gomodbus "github.com/goburrow/modbus"
)

// The example's heartbeat (examples/modbus/physmcp.manifest.yml): 40022
// every second, the watchdog time 5000 ms written into 40021 in 100 ms
// steps.
const (
	hbEvery   = time.Second
	hbTimeout = 5 * time.Second
)

// simProbe reads the modbus-sim boiler over Modbus TCP as a second master
// beside physd.
type simProbe struct {
	h *gomodbus.TCPClientHandler
	c gomodbus.Client
}

func newSimProbe(t *testing.T, addr string) *simProbe {
	t.Helper()
	h := gomodbus.NewTCPClientHandler(addr)
	h.SlaveId, h.Timeout = 1, time.Second
	t.Cleanup(func() { _ = h.Close() })
	return &simProbe{h: h, c: gomodbus.NewClient(h)}
}

// boilerState is what the probe reads: burner enable (coil 00001), the
// operating mode (40003), the status word (40011) and the watchdog time
// (40021, in 100 ms steps).
type boilerState struct {
	burner         bool
	mode, status   uint16
	watchdogTicks  uint16
	safe           bool // the safe state: burner enable off or status bit 4
	statusSafeMode bool // status bit 4
}

func (p *simProbe) read() (boilerState, error) {
	var s boilerState
	coils, err := p.c.ReadCoils(0, 1)
	if err != nil {
		_ = p.h.Close() // a fresh connection next time
		return s, err
	}
	regs, err := p.c.ReadHoldingRegisters(0, 21)
	if err != nil {
		_ = p.h.Close()
		return s, err
	}
	reg := func(i int) uint16 { return uint16(regs[2*i])<<8 | uint16(regs[2*i+1]) }
	s.burner = coils[0]&1 != 0
	s.mode, s.status, s.watchdogTicks = reg(2), reg(10), reg(20)
	s.statusSafeMode = s.status&(1<<4) != 0
	s.safe = !s.burner || s.statusSafeMode
	return s, nil
}

// until polls the sim every 20 ms until cond holds and returns when it
// first did; false after limit. Read errors are retried (the sim is local:
// they are rare, and a poll that fails is just a later sample).
func (p *simProbe) until(limit time.Duration, cond func(boilerState) bool) (time.Time, boilerState, bool) {
	deadline := time.Now().Add(limit)
	var last boilerState
	for time.Now().Before(deadline) {
		s, err := p.read()
		if err == nil {
			last = s
			if cond(s) {
				return time.Now(), s, true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Time{}, last, false
}

// heartbeatManifest is the modbus example on the sim's address, with
// burner_enable open to any caller (the example asks supervisor, which a
// daemon without a policy gives nobody).
func heartbeatManifest(t *testing.T, addr string) string {
	t.Helper()
	return exampleModbus(t, func(src string) string {
		if !strings.Contains(src, "heartbeat: {unit: 1, register: 40022, every_ms: 1000, value: counter,\n                timeout_register: 40021, timeout_ms: 5000, timeout_scale_ms: 100}") {
			t.Fatal("the example's heartbeat changed; update hbEvery, hbTimeout and this test")
		}
		src = strings.ReplaceAll(src, "127.0.0.1:5020", addr)
		i := strings.Index(src, "- name: burner_enable")
		j := strings.Index(src[i:], "requires_permission: supervisor")
		if i < 0 || j < 0 {
			t.Fatal("the example's burner_enable changed; update this test")
		}
		return src[:i+j] + "requires_permission: none" + src[i+j+len("requires_permission: supervisor"):]
	})
}

// TestHeartbeatKillToSafe: the safe state below the daemon. The built
// physd runs the modbus example (its bus feeds the controller's host
// watchdog) against the built modbus-sim, started without -watchdog: physd
// itself writes the watchdog time into 40021 at connect. Each round starts
// physd, turns the burner on through do_burner_enable, watches the sim for
// longer than the watchdog time (it must never go safe while physd runs),
// SIGKILLs physd and measures, polling the sim over Modbus TCP, the time
// until the controller shows the safe state (coil 00001 off, status bit 4
// set, mode off): within timeout_ms + 1 s, and no sooner than the watchdog
// time less one heartbeat period. PHYSD_CHAOS_ROUNDS rounds (default 1);
// the kill→safe p50/p99 are logged.
func TestHeartbeatKillToSafe(t *testing.T) {
	rounds := chaosRoundsOr(t, 1)
	sim := startModbusSim(t) // -step 1h: the model holds still; the watchdog keeps its own clock
	probe := newSimProbe(t, sim.addr)
	if _, s, ok := probe.until(5*time.Second, func(boilerState) bool { return true }); !ok || s.watchdogTicks != 0 {
		t.Fatalf("the sim before physd: %+v (ok %v), want the watchdog off (40021 = 0)", s, ok)
	}
	manifest := heartbeatManifest(t, sim.addr)
	var killToSafe []time.Duration
	for round := range rounds {
		d := startHTTP(t, daemonOpts{manifest: manifest})
		if reg := d.stderr.logValue(t, "modbus heartbeat running", "register"); reg != "unit 1 holding 40022 (address 21)" {
			t.Fatalf("round %d: heartbeat register %q", round, reg)
		}
		// physd wrote the watchdog time (5000 ms / 100 ms), which also
		// leaves the safe mode of the round before.
		if _, s, ok := probe.until(5*time.Second, func(s boilerState) bool { return s.watchdogTicks == 50 && !s.statusSafeMode }); !ok {
			t.Fatalf("round %d: physd did not arm the watchdog: %+v\nphysd:\n%s", round, s, d.stderr.String())
		}
		cs := connectHTTP(t, d, "2026-07-28")
		if a := doModbus(t, cs, "do_burner_enable", true, fmt.Sprint("hb-burner-", round)); a.Status != "success" || !a.Verified {
			t.Fatalf("round %d: do_burner_enable true: %+v", round, a)
		}
		if _, err := probe.c.WriteSingleRegister(2, 1); err != nil { // mode heating, as before the safe state
			t.Fatalf("round %d: mode: %v", round, err)
		}
		// Alive: longer than the watchdog time, the sim never goes safe.
		if at, s, went := probe.until(hbTimeout+time.Second, func(s boilerState) bool { return s.safe || s.mode == 0 }); went {
			t.Fatalf("round %d: the sim went to its safe state at %v while physd ran: %+v\nphysd:\n%s", round, at, s, d.stderr.String())
		}
		_ = cs.Close()
		killed := time.Now()
		if err := d.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-d.done
		at, s, ok := probe.until(hbTimeout+3*time.Second, func(s boilerState) bool { return s.safe })
		if !ok {
			t.Fatalf("round %d: no safe state %v after SIGKILL: %+v", round, hbTimeout+3*time.Second, s)
		}
		took := at.Sub(killed)
		killToSafe = append(killToSafe, took)
		t.Logf("round %d: SIGKILL → safe state in %v", round, took.Round(time.Millisecond))
		if took > hbTimeout+time.Second {
			t.Errorf("round %d: SIGKILL → safe state took %v, want within timeout_ms + 1 s (%v)", round, took, hbTimeout+time.Second)
		}
		// The last heartbeat came at most a period before the kill; sooner
		// than that, something else put the boiler safe.
		if took < hbTimeout-hbEvery-200*time.Millisecond {
			t.Errorf("round %d: safe state %v after SIGKILL, before the watchdog time less a heartbeat period could pass", round, took)
		}
		// The whole safe state, with its cause.
		if _, s, ok := probe.until(time.Second, func(s boilerState) bool { return !s.burner && s.mode == 0 && s.statusSafeMode }); !ok {
			t.Errorf("round %d: safe state %+v, want burner off, mode off, status bit 4", round, s)
		}
	}
	t.Logf("REPORT host watchdog (timeout_ms %d, every_ms %d), %d rounds: SIGKILL → safe state %s",
		hbTimeout.Milliseconds(), hbEvery.Milliseconds(), rounds, quantiles(killToSafe))
}
