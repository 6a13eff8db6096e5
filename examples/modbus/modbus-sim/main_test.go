package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	gomodbus "github.com/goburrow/modbus"
	"github.com/goburrow/serial"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers/modbus" // registers modbus_tcp, modbus_rtu
	"github.com/physd/physd/drivers/modbus/modbustest"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// TestExampleEndToEnd runs the example manifest through the node against
// the simulator: every capability reads good, do_ calls are verified by
// read-back, and a controller that goes away is reported, not guessed.
func TestExampleEndToEnd(t *testing.T) {
	b := newBoiler()
	srv, err := modbustest.StartTCP("127.0.0.1:0", b.bank)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	b.step(0.2)

	m, err := manifest.Load("../physmcp.manifest.yml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := m.Buses["boiler"].Config
	for i := 0; i+1 < len(cfg.Content); i += 2 {
		if cfg.Content[i].Value == "address" {
			cfg.Content[i+1].Value = srv.Addr // the manifest says 127.0.0.1:5020
		}
	}
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	al, err := audit.Open(dir + "/audit")
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	if ok, checks := n.Ready(); !ok {
		t.Fatalf("not ready: %+v", checks)
	}
	ctx := context.Background()
	want := map[string]any{
		"do_flow_setpoint": 55.0, "do_pump_speed": int64(60), "do_operating_mode": "heating",
		"do_burner_enable": true, "do_pump_enable": true, "read_flame_detected": true,
		"read_boiler_alarm": false, "read_burner_hours": int64(0),
	}
	for _, c := range m.Capabilities {
		tool := c.ToolName()
		o, err := n.Read(ctx, tool, 0)
		if err != nil || o.Quality != promcp.QualityGood {
			t.Fatalf("%s: %+v, %v", tool, o, err)
		}
		if w, ok := want[tool]; ok && o.Value != w {
			t.Errorf("%s = %v, want %v", tool, o.Value, w)
		}
	}

	do := func(tool string, v any, key string) promcp.DoResult {
		raw, _ := json.Marshal(v)
		body, err := n.Do(ctx, node.DoRequest{Tool: tool, Value: raw, IdempotencyKey: key, Caller: node.Caller{ID: "test", Role: "admin"}})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		var r promcp.DoResult
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := do("do_flow_setpoint", 62.5, "k1")
	if r.Status != promcp.StatusSuccess || !r.Verified || r.AppliedValue != 62.5 || r.PreviousValue != 55.0 {
		t.Fatalf("do_flow_setpoint: %+v", r)
	}
	if got := int16(b.bank.Holding(1, 0, 1)[0]); got != 625 {
		t.Fatalf("the controller holds %d, want 625", got)
	}
	for tool, v := range map[string]any{"do_operating_mode": "hot_water", "do_burner_enable": false, "do_pump_speed": 35} {
		if r := do(tool, v, "k-"+tool); r.Status != promcp.StatusSuccess || !r.Verified {
			t.Fatalf("%s(%v): %+v", tool, v, r)
		}
	}

	// The controller goes away: the endpoint is marked down at the first
	// refused connection, reads serve the last value as degraded, and the
	// do_ pipeline refuses without touching anything.
	_ = srv.Stop()
	o, _ := n.Read(ctx, "read_boiler_flow_temperature", 0)
	if o.Quality != promcp.QualityDegraded || o.Value == nil || !strings.Contains(o.Reason, "marked down") {
		t.Fatalf("read with the controller gone: %+v", o)
	}
	r = do("do_pump_speed", 50, "k2")
	if r.Status != promcp.StatusFailed || r.Permission != promcp.PermSourceUnreachable {
		t.Fatalf("do with the controller gone: %+v", r)
	}
	deadline := time.Now().Add(5 * time.Second)
	for ready, _ := n.Ready(); ready; ready, _ = n.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("Ready still true with the controller gone")
		}
		_, _ = n.Read(ctx, "do_pump_speed", 0)
	}
	_, checks := n.Ready()
	for _, c := range checks {
		if c.Name == "bus:boiler" && !strings.Contains(c.Error, srv.Addr) {
			t.Fatalf("readiness check %+v should name the endpoint", c)
		}
	}
}

// TestScanSkeletonReadsLikeExample: physd scan's engine finds the
// simulator's one unit among ten, over Modbus TCP and over RTU (the same
// register bank behind the RTU slave on a pty), and a node started on the
// skeleton it writes reads the same raw registers the hand-written example
// decodes: every example capability is checked against the skeleton's raw
// reads of its registers.
func TestScanSkeletonReadsLikeExample(t *testing.T) {
	example, err := os.ReadFile("../physmcp.manifest.yml")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("tcp", func(t *testing.T) {
		b := newBoiler()
		srv, err := modbustest.StartTCP("127.0.0.1:0", b.bank)
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Stop()
		b.step(0.2) // the model is not stepped again: the registers hold still
		scanMatchesExample(t, b, modbus.ScanOptions{TCP: srv.Addr}, strings.ReplaceAll(string(example), "127.0.0.1:5020", srv.Addr))
	})
	t.Run("rtu", func(t *testing.T) {
		ptmx, tty, err := pty.Open()
		if err != nil {
			t.Skipf("no pty: %v", err)
		}
		b := newBoiler()
		slave := modbustest.ServeRTU(ptmx, b.bank, 1)
		t.Cleanup(func() {
			_ = tty.Close()
			<-slave.Done()
			_ = ptmx.Close()
		})
		b.step(0.2)
		rtu := strings.Replace(string(example), "    type: modbus_tcp\n    address: \"127.0.0.1:5020\"\n",
			"    type: modbus_rtu\n    port: "+tty.Name()+"\n    baud: 115200\n    parity: N\n    stop_bits: 2\n", 1)
		if rtu == string(example) {
			t.Fatal("the example's bus block changed; update this test")
		}
		// Every binding needs its unit on RTU; the example's address
		// strings carry slave=1, and the one plain binding says unit: 1.
		scanMatchesExample(t, b, modbus.ScanOptions{Serial: serial.Config{Address: tty.Name(), BaudRate: 115200, DataBits: 8, Parity: "N", StopBits: 2},
			Silence: 20 * time.Millisecond}, rtu)
	})
}

func scanMatchesExample(t *testing.T, b *boiler, o modbus.ScanOptions, exampleSrc string) {
	o.Units = []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	o.Timeout = 200 * time.Millisecond
	o.To = 255
	rep, err := modbus.Scan(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Units) != 1 || rep.Units[0].ID != 1 {
		t.Fatalf("scan found %+v, want unit 1 only", rep.Units)
	}
	skel, err := manifest.Parse("skeleton.yml", rep.Skeleton(modbus.SkeletonOptions{Bus: "boiler"}))
	if err != nil {
		t.Fatalf("skeleton does not validate: %v", err)
	}
	ex, err := manifest.Parse("example.yml", []byte(exampleSrc))
	if err != nil {
		t.Fatal(err)
	}
	open := func(m *manifest.Manifest) *node.Node {
		dir := t.TempDir()
		st, err := store.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		al, err := audit.Open(dir + "/audit")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { al.Close() })
		n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	ctx := context.Background()
	read := func(n *node.Node, tool string) any {
		t.Helper()
		o, err := n.Read(ctx, tool, 0)
		if err != nil || o.Quality != promcp.QualityGood {
			t.Fatalf("%s: %+v, %v", tool, o, err)
		}
		return o.Value
	}
	// One node at a time: on RTU both would otherwise be masters on one line.
	skN := open(skel)
	reg := func(name string) uint16 { return uint16(read(skN, "read_u1_"+name).(int64)) }
	f32 := func(hi, lo uint16) float64 { return float64(math.Float32frombits(uint32(hi)<<16 | uint32(lo))) }
	want := map[string]any{
		"read_boiler_flow_temperature":   f32(reg("input_0"), reg("input_1")),
		"read_boiler_return_temperature": f32(reg("input_3"), reg("input_2")), // CDAB
		"read_outdoor_temperature":       float64(int16(reg("input_4"))) * 0.1,
		"read_burner_hours":              int64(uint32(reg("input_5"))<<16 | uint32(reg("input_6"))),
		"read_flame_detected":            read(skN, "read_u1_discrete_0"),
		"read_boiler_alarm":              reg("holding_10")&(1<<3) != 0,
		"do_flow_setpoint":               float64(int16(reg("holding_0"))) * 0.1,
		"do_pump_speed":                  int64(reg("holding_1")),
		"do_operating_mode":              []string{"off", "heating", "hot_water", "frost_protection"}[reg("holding_2")],
		"do_burner_enable":               read(skN, "read_u1_coil_0"),
		"do_pump_enable":                 read(skN, "read_u1_coil_1"),
	}
	if reg("holding_0") != 550 || reg("holding_1") != 60 {
		t.Fatalf("setpoint registers %d %d, want the simulator's 550 60", reg("holding_0"), reg("holding_1"))
	}
	skN.Close(ctx)
	exN := open(ex)
	defer exN.Close(ctx)
	for _, c := range ex.Capabilities {
		w, ok := want[c.ToolName()]
		if !ok {
			t.Errorf("%s: no comparison", c.ToolName())
			continue
		}
		got := read(exN, c.ToolName())
		if g, isF := got.(float64); isF {
			if math.Abs(g-w.(float64)) > 1e-3 {
				t.Errorf("%s = %v, the skeleton's registers give %v", c.ToolName(), got, w)
			}
		} else if got != w {
			t.Errorf("%s = %v, the skeleton's registers give %v", c.ToolName(), got, w)
		}
	}
}

// TestHostWatchdog: through a Modbus TCP client (goburrow, the library
// physd's driver uses), a host that sets the watchdog time and then stops
// writing the heartbeat finds the burner disabled and the mode off with
// status bit 4 set, exactly once the watchdog time has passed since its
// last heartbeat; the next heartbeat clears bit 4 and leaves the outputs
// safe; an out-of-range watchdog time is refused; time 0 turns it off.
func TestHostWatchdog(t *testing.T) {
	b := newBoiler()
	clock := time.Unix(1_700_000_000, 0)
	b.now = func() time.Time { return clock }
	srv, err := modbustest.StartTCP("127.0.0.1:0", b.bank)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	h := gomodbus.NewTCPClientHandler(srv.Addr)
	h.SlaveId, h.Timeout = unit, 2*time.Second
	if err := h.Connect(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	c := gomodbus.NewClient(h)
	status := func() uint16 {
		t.Helper()
		b.step(0.1)
		r, err := c.ReadHoldingRegisters(10, 1)
		if err != nil {
			t.Fatal(err)
		}
		return uint16(r[0])<<8 | uint16(r[1])
	}
	if _, err := c.WriteSingleRegister(regWatchdogTime, maxWatchdogTicks+1); err == nil || !strings.Contains(err.Error(), "exception '3'") {
		t.Fatalf("watchdog time 60.1 s: err %v, want exception 3", err)
	}
	if _, err := c.WriteSingleRegister(regWatchdogTime, 5); err != nil { // 500 ms
		t.Fatal(err)
	}
	clock = clock.Add(400 * time.Millisecond)
	if s := status(); s&statusSafeMode != 0 {
		t.Fatalf("400 ms after the watchdog time was set: status %b, want no safe mode", s)
	}
	if _, err := c.WriteSingleRegister(regWatchdogBeat, 1); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(499 * time.Millisecond)
	if s := status(); s&statusSafeMode != 0 || !b.bank.Coil(unit, 0) {
		t.Fatalf("499 ms after a heartbeat: status %b, burner %v; want running", s, b.bank.Coil(unit, 0))
	}
	clock = clock.Add(time.Millisecond)
	if s := status(); s&statusSafeMode == 0 {
		t.Fatalf("500 ms after the last heartbeat: status %b, want safe mode", s)
	}
	if b.bank.Coil(unit, 0) || b.bank.Holding(unit, 2, 1)[0] != 0 || status()&1 != 0 {
		t.Fatalf("safe mode: burner enable %v, mode %d; want off, off", b.bank.Coil(unit, 0), b.bank.Holding(unit, 2, 1)[0])
	}
	if _, err := c.WriteSingleRegister(regWatchdogBeat, 2); err != nil {
		t.Fatal(err)
	}
	if s := status(); s&statusSafeMode != 0 || b.bank.Coil(unit, 0) || b.bank.Holding(unit, 2, 1)[0] != 0 {
		t.Fatalf("after the next heartbeat: status %b, burner %v; want safe mode cleared and the outputs still safe", s, b.bank.Coil(unit, 0))
	}
	if _, err := c.WriteSingleRegister(regWatchdogTime, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteSingleCoil(0, 0xFF00); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Hour)
	if s := status(); s&statusSafeMode != 0 || !b.bank.Coil(unit, 0) {
		t.Fatalf("watchdog off, an hour without heartbeat: status %b, burner %v; want running", s, b.bank.Coil(unit, 0))
	}
}

// TestHostWatchdogOwnClock: the watchdog trips on its own clock (watch),
// with the model held still (no step, as under -step 1h): the status word
// shows safe mode (bit 4) and the burner off (bit 0) at once, and the next
// heartbeat clears bit 4 at once.
func TestHostWatchdogOwnClock(t *testing.T) {
	b := newBoiler()
	clock := time.Unix(1_700_000_000, 0)
	b.now = func() time.Time { return clock }
	b.step(0.2)
	status := func() uint16 { return b.bank.Holding(unit, regStatus, 1)[0] }
	if status()&1 == 0 {
		t.Fatalf("status %b: the burner should be on", status())
	}
	b.bank.SetHolding(unit, regWatchdogTime, 10) // 1 s
	b.heartbeat()
	clock = clock.Add(999 * time.Millisecond)
	if b.watch() || status()&statusSafeMode != 0 {
		t.Fatalf("999 ms after a heartbeat: safe mode, status %b", status())
	}
	clock = clock.Add(time.Millisecond)
	if !b.watch() || status()&statusSafeMode == 0 || status()&1 != 0 || b.bank.Coil(unit, 0) {
		t.Fatalf("1 s after the last heartbeat: status %b, burner enable %v; want bit 4 set, bit 0 clear, burner off", status(), b.bank.Coil(unit, 0))
	}
	b.heartbeat()
	if status()&statusSafeMode != 0 || b.bank.Coil(unit, 0) {
		t.Fatalf("after a heartbeat: status %b, burner enable %v; want bit 4 clear, the burner still off", status(), b.bank.Coil(unit, 0))
	}
}

// TestPointBank: -points 500 serves 500 moving int16 input registers from
// 30101 (four reads of 125 registers, the protocol's most), values within
// 10.0 … 90.0 that move between steps; the setpoints from 40101 keep what
// is written, the holding register below them still refuses writes, and
// the boiler's own registers are as before.
func TestPointBank(t *testing.T) {
	b := newBoiler()
	t0 := time.Unix(1_700_000_000, 0)
	p, err := newPointBank(b, 500, 8, t0)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := modbustest.StartTCP("127.0.0.1:0", b.bank)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	h := gomodbus.NewTCPClientHandler(srv.Addr)
	h.SlaveId, h.Timeout = unit, 2*time.Second
	if err := h.Connect(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	c := gomodbus.NewClient(h)
	read := func() []int16 {
		t.Helper()
		var out []int16
		for a := uint16(pointsBase); a < pointsBase+500; a += 125 {
			r, err := c.ReadInputRegisters(a, 125)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < len(r); i += 2 {
				out = append(out, int16(uint16(r[i])<<8|uint16(r[i+1])))
			}
		}
		return out
	}
	first := read()
	p.step(b.bank, t0.Add(15*time.Second))
	second := read()
	moved := 0
	for i := range first {
		if first[i] < 100 || first[i] > 900 {
			t.Fatalf("point %d = %d, want 100 … 900", i, first[i])
		}
		if first[i] != second[i] {
			moved++
		}
	}
	if moved < 125 {
		t.Errorf("%d of 500 points moved in 15 s, want at least the fast quarter", moved)
	}
	if _, err := c.ReadInputRegisters(pointsBase+500, 1); err == nil {
		t.Error("the register after the last point answers")
	}
	if _, err := c.WriteSingleRegister(pointsBase+7, 12345); err != nil {
		t.Fatal(err)
	}
	if got := b.bank.Holding(unit, pointsBase+7, 1)[0]; got != 12345 {
		t.Errorf("setpoint 40108 holds %d, want 12345", got)
	}
	if _, err := c.WriteSingleRegister(pointsBase+8, 1); err == nil || !strings.Contains(err.Error(), "exception '2'") {
		t.Errorf("holding 40109 (no setpoint): err %v, want exception 2", err)
	}
	if _, err := c.WriteSingleRegister(0, 900); err == nil || !strings.Contains(err.Error(), "exception '3'") {
		t.Errorf("the boiler's flow setpoint 90.0: err %v, want exception 3", err)
	}
	if _, err := newPointBank(newBoiler(), maxPoints+1, 0, t0); err == nil {
		t.Error("-points past the limit accepted")
	}
}
