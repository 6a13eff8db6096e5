package e2e

import (
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/drivers/modbus/modbustest"
)

// TestScanModbusSim: the built binary scans the bundled modbus-sim (a
// separate process), the skeleton validates and names the one unit found,
// and a daemon started on the skeleton reads, over MCP, the same raw
// registers that a daemon on the hand-written example decodes.
func TestScanModbusSim(t *testing.T) {
	t.Parallel()
	sim := startModbusSim(t)
	skel := scanSkeleton(t, "1 of 20 unit(s) answered", "--tcp", sim.addr, "--units", "1-20")
	example := exampleModbus(t, func(src string) string { return strings.ReplaceAll(src, "127.0.0.1:5020", sim.addr) })
	skeletonReadsLikeExample(t, skel, example)
}

// TestScanModbusSimRTU: the same over a serial line. modbus-sim -pty
// serves the boiler as Modbus RTU on a pseudo-terminal (the RTU pty
// slave); physd scan modbus --rtu finds its one unit among five, the
// skeleton validates with a modbus_rtu bus on that port, and a daemon on
// the skeleton reads over MCP the raw registers that a daemon on the
// hand-written example, moved to the same line, decodes. The two daemons
// run one after the other: two masters on one line would collide.
func TestScanModbusSimRTU(t *testing.T) {
	sim := startModbusSim(t, "-pty")
	if sim.pty == "" {
		t.Skip("modbus-sim could not open a pty")
	}
	skel := scanSkeleton(t, "1 of 5 unit(s) answered", "--rtu", sim.pty, "--baud", "115200", "--parity", "N", "--stop-bits", "2",
		"--units", "1-5", "--timeout-ms", "200", "--silence-ms", "20")
	src, _ := os.ReadFile(skel)
	for _, part := range []string{"type: modbus_rtu", `port: "` + sim.pty + `"`, "baud: 115200", "parity: N", "stop_bits: 2"} {
		if !strings.Contains(string(src), part) {
			t.Errorf("skeleton lacks %q", part)
		}
	}
	example := exampleModbus(t, func(src string) string {
		rtu := strings.Replace(src, "    type: modbus_tcp\n    address: \"127.0.0.1:5020\"\n",
			"    type: modbus_rtu\n    port: "+sim.pty+"\n    baud: 115200\n    parity: N\n    stop_bits: 2\n    silence_ms: 20\n", 1)
		if rtu == src {
			t.Fatal("the example's bus block changed; update this test")
		}
		return rtu
	})
	skeletonReadsLikeExample(t, skel, example)
}

type modbusSim struct{ addr, pty string }

// startModbusSim builds and starts examples/modbus/modbus-sim on a free
// port, its model held still (-step 1h), with extra flags.
func startModbusSim(t *testing.T, flags ...string) modbusSim {
	t.Helper()
	dir := t.TempDir()
	simBin := filepath.Join(dir, "modbus-sim")
	if out, err := exec.Command("go", "build", "-o", simBin, "github.com/physd/physd/examples/modbus/modbus-sim").CombinedOutput(); err != nil {
		t.Fatalf("building modbus-sim: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := modbusSim{addr: l.Addr().String()}
	_ = l.Close()
	sim := exec.Command(simBin, append([]string{"-addr", s.addr, "-step", "1h"}, flags...)...)
	log := &syncBuffer{}
	sim.Stderr = log
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Process.Kill(); _ = sim.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", s.addr); err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("modbus-sim did not start listening:\n%s", log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if slices.Contains(flags, "-pty") {
		// The sim opens the pty after its TCP listener: wait for the
		// line that names it.
		for deadline := time.Now().Add(5 * time.Second); s.pty == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if _, after, ok := strings.Cut(log.String(), "RTU on "); ok {
				s.pty = strings.TrimSpace(strings.SplitN(after, "\n", 2)[0])
			}
		}
		if s.pty == "" && !strings.Contains(log.String(), "-pty:") {
			t.Fatalf("modbus-sim -pty logged no RTU line:\n%s", log.String())
		}
	}
	return s
}

// scanSkeleton runs physd scan modbus with args, checks that it says
// answered and that the skeleton validates and names unit 1 and no other,
// and returns the skeleton's path.
func scanSkeleton(t *testing.T, answered string, args ...string) string {
	t.Helper()
	skel := filepath.Join(t.TempDir(), "skeleton.yml")
	out, err := exec.Command(physdBin, append(append([]string{"scan", "modbus"}, args...), "--out", skel)...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), answered) {
		t.Fatalf("scan: %v\n%s", err, out)
	}
	if out, err := exec.Command(physdBin, "validate", skel).CombinedOutput(); err != nil {
		t.Fatalf("validate: %v\n%s", err, out)
	}
	src, _ := os.ReadFile(skel)
	if !strings.Contains(string(src), "# ==== unit 1: no identification") || strings.Contains(string(src), "u2_") {
		t.Fatalf("skeleton should name unit 1 and no other:\n%.2000s", src)
	}
	return skel
}

// exampleModbus writes examples/modbus/physmcp.manifest.yml, edited by
// edit, to a temporary file.
func exampleModbus(t *testing.T, edit func(string) string) string {
	t.Helper()
	ex, err := os.ReadFile(repoPath("examples/modbus/physmcp.manifest.yml"))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "example.yml")
	if err := os.WriteFile(p, []byte(edit(string(ex))), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// skeletonReadsLikeExample starts a daemon on the skeleton and reads the
// raw registers over MCP, stops it, then starts one on the example and
// checks each of its reads against what the raw registers give.
func skeletonReadsLikeExample(t *testing.T, skel, example string) {
	t.Helper()
	read := func(cs *mcp.ClientSession, tool string) any {
		t.Helper()
		o := structured(t, call(t, cs, tool, map[string]any{}))
		if o["quality"] != "good" {
			t.Fatalf("%s: %v", tool, o)
		}
		return o["value"]
	}
	skD := startHTTP(t, daemonOpts{manifest: skel})
	sk := connectHTTP(t, skD, "2026-07-28")
	regs := map[string]uint16{}
	for _, name := range []string{"input_0", "input_1", "input_2", "input_3", "input_4", "input_5", "input_6", "holding_0", "holding_1", "holding_2", "holding_10"} {
		regs[name] = uint16(read(sk, "read_u1_"+name).(float64))
	}
	flame := read(sk, "read_u1_discrete_0")
	sk.Close()
	skD.stop(t)

	exD := startHTTP(t, daemonOpts{manifest: example})
	ex := connectHTTP(t, exD, "2026-07-28")
	f32 := func(hi, lo uint16) float64 { return float64(math.Float32frombits(uint32(hi)<<16 | uint32(lo))) }
	checks := []struct {
		tool string
		want any
	}{
		{"read_boiler_flow_temperature", f32(regs["input_0"], regs["input_1"])},
		{"read_boiler_return_temperature", f32(regs["input_3"], regs["input_2"])}, // CDAB
		{"read_outdoor_temperature", float64(int16(regs["input_4"])) * 0.1},
		{"read_burner_hours", float64(uint32(regs["input_5"])<<16 | uint32(regs["input_6"]))},
		{"read_flame_detected", flame},
		{"read_boiler_alarm", regs["holding_10"]&(1<<3) != 0},
	}
	for _, c := range checks {
		got := read(ex, c.tool)
		if g, ok := got.(float64); ok {
			if math.Abs(g-c.want.(float64)) > 0.06 { // the example rounds to its precision, 0.1
				t.Errorf("%s = %v; the skeleton's raw registers give %v", c.tool, got, c.want)
			}
		} else if got != c.want {
			t.Errorf("%s = %v; the skeleton's raw registers give %v", c.tool, got, c.want)
		}
	}
	// The setpoint, pump speed and mode registers hold the simulator's
	// documented start values (55.0 °C as int16 x0.1, 60 %, heating).
	if a, b, c := regs["holding_0"], regs["holding_1"], regs["holding_2"]; a != 550 || b != 60 || c != 1 {
		t.Errorf("holding 0..2 = %d %d %d, want 550 60 1", a, b, c)
	}
	// The burner's flow temperature is a plausible water temperature, so
	// the comparison above is not of two zeros.
	if v := f32(regs["input_0"], regs["input_1"]); v < 10 || v > 90 {
		t.Errorf("flow temperature %v °C from the skeleton's registers", v)
	}
}

// TestModbusProfileEnergyMeter: a manifest that binds an energy meter by
// its profile (profile: eastron_sdm120, point: ...) reads, over MCP from
// the built binary, a Modbus TCP server serving the meter's documented
// register map; and `physd validate` names the profile's points when a
// point is misspelt.
func TestModbusProfileEnergyMeter(t *testing.T) {
	t.Parallel()
	bank := modbustest.NewBank(1000)
	srv, err := modbustest.StartTCP("127.0.0.1:0", bank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	set := func(addr uint16, v float32) {
		u := math.Float32bits(v)
		bank.SetInput(2, addr, uint16(u>>16), uint16(u))
	}
	set(0x0000, 229.8) // voltage, 30001
	set(0x000C, 836.5) // active power, 30013
	set(0x0156, 4711.25)
	meterCap := func(name, point, unit string) string {
		return fmt.Sprintf(`  - name: %s
    kind: read
    description: %s of the main meter
    data_type: float
    unit: %s
    semantic_tags: [energy, meter]
    binding: {type: modbus, bus: plc, unit: 2, profile: eastron_sdm120, point: %s}
`, name, name, unit, point)
	}
	// The bus's 200 ms timeout is for the tests of timeouts; this one is of
	// the profile's decoding, and a loaded CI machine (-race, parallel
	// daemons) once kept the in-process server's reply past 200 ms.
	src := strings.NewReplacer("ADDR", srv.Addr, "timeout_ms: 200BUSEXTRA", "timeout_ms: 2000", "CAPS",
		meterCap("mains_voltage", "voltage", "volt")+meterCap("mains_power", "active_power", "watt")+meterCap("mains_energy", "total_active_energy", "kWh")).Replace(modbusManifest)
	if !strings.Contains(src, "timeout_ms: 2000") {
		t.Fatal("the Modbus manifest template no longer sets timeout_ms: 200BUSEXTRA")
	}
	_, cs := startModbusManifest(t, src)
	for tool, want := range map[string]float64{"read_mains_voltage": 229.8, "read_mains_power": 836.5, "read_mains_energy": 4711.25} {
		o := structured(t, call(t, cs, tool, map[string]any{}))
		if o["quality"] != "good" || math.Abs(o["value"].(float64)-want) > 1e-3 {
			t.Errorf("%s: %v, want %v", tool, o, want)
		}
	}

	bad := strings.NewReplacer("ADDR", srv.Addr, "BUSEXTRA", "", "CAPS", meterCap("mains_voltage", "volts", "volt")).Replace(modbusManifest)
	p := filepath.Join(t.TempDir(), "bad.yml")
	if err := os.WriteFile(p, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(physdBin, "validate", p).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `bad.yml:18:80: `) || !strings.Contains(string(out), `capabilities[0].binding.point: profile eastron_sdm120 (Eastron SDM120-Modbus) has no point "volts"`) ||
		!strings.Contains(string(out), "use one of its points: active_power, apparent_power, current,") {
		t.Fatalf("validate: %v\n%s", err, out)
	}
}

// TestOneWireTemperature: the built binary reads DS18B20 sensors over MCP
// from a w1 sysfs tree (a directory laid out as the kernel's w1-therm
// driver does), refuses a CRC failure as quality error, and validate
// reports a bad sensor id at file:line:col.
func TestOneWireTemperature(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(id, content string) {
		if err := os.MkdirAll(filepath.Join(dir, id), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, id, "w1_slave"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("28-0316a2794bff", "72 01 4b 46 7f ff 0e 10 57 : crc=57 YES\n72 01 4b 46 7f ff 0e 10 57 t=23125\n")
	write("28-0316a2794c0a", "72 01 4b 46 7f ff 0e 10 57 : crc=00 NO\n72 01 4b 46 7f ff 0e 10 57 t=23125\n")
	src := `physmcp_version: "0.1"
device: {id: gw_w1_001, type: gateway, location: {zone: tank_room}}
network:
  protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080, role: native}]
  mesh: {enabled: false}
buses:
  w1: {type: onewire, path: "DIR"}
capabilities:
  - name: tank_temperature
    kind: read
    description: Water tank temperature (DS18B20 probe).
    data_type: float
    unit: celsius
    semantic_tags: [temperature, water]
    cache_ttl_ms: 0
    binding: {type: onewire, bus: w1, address: "28-0316a2794bff"}
  - name: pipe_temperature
    kind: read
    description: Return pipe temperature (DS18B20 probe on a long cable).
    data_type: float
    unit: celsius
    semantic_tags: [temperature, water]
    binding: {type: onewire, bus: w1, address: "ADDR2"}
`
	p := filepath.Join(dir, "w1.yml")
	if err := os.WriteFile(p, []byte(strings.NewReplacer("DIR", dir, "ADDR2", "28-0316a2794c0a").Replace(src)), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startHTTP(t, daemonOpts{manifest: p})
	cs := connectHTTP(t, d, "2026-07-28")
	o := structured(t, call(t, cs, "read_tank_temperature", map[string]any{}))
	if o["quality"] != "good" || o["value"] != 23.125 {
		t.Fatalf("tank: %v", o)
	}
	write("28-0316a2794bff", "5e ff 4b 46 7f ff 02 10 a8 : crc=a8 YES\n5e ff 4b 46 7f ff 02 10 a8 t=-10125\n")
	if o := structured(t, call(t, cs, "read_tank_temperature", map[string]any{})); o["value"] != -10.125 {
		t.Fatalf("tank after the change: %v", o)
	}
	res := call(t, cs, "read_pipe_temperature", map[string]any{})
	if !strings.Contains(text(res), "scratchpad CRC error") {
		t.Fatalf("pipe with a CRC error: %s", text(res))
	}

	bad := filepath.Join(dir, "bad.yml")
	if err := os.WriteFile(bad, []byte(strings.NewReplacer("DIR", dir, "ADDR2", "28-0316A2794C0A").Replace(src)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(physdBin, "validate", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "bad.yml:23:14: capabilities[1].binding.address: \"28-0316A2794C0A\" is not a 1-Wire device id") {
		t.Fatalf("validate: %v\n%s", err, out)
	}
}

// TestPWMFan: the built binary drives a PWM fan through a kernel PWM sysfs
// tree (a directory laid out as /sys/class/pwm/pwmchip0): do_fan_speed is
// verified by the duty cycle read back, a value outside 0..100 is refused
// by the range before anything is written, and validate reports a bad
// duty range at file:line:col.
func TestPWMFan(t *testing.T) {
	t.Parallel()
	chip := filepath.Join(t.TempDir(), "pwmchip0")
	if err := os.MkdirAll(filepath.Join(chip, "pwm0"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"export": "", "npwm": "2\n", "pwm0/period": "0\n", "pwm0/duty_cycle": "0\n", "pwm0/enable": "0\n"} {
		if err := os.WriteFile(filepath.Join(chip, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	src := `physmcp_version: "0.1"
device: {id: gw_pwm_001, type: gateway, location: {zone: greenhouse}}
network:
  protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080, role: native}]
  mesh: {enabled: false}
buses:
  pwm0: {type: pwm, path: "CHIP"}
capabilities:
  - name: fan_speed
    kind: do
    description: Greenhouse circulation fan (4-wire PC fan, 25 kHz PWM).
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    tolerance: 0.01
    semantic_tags: [fan, air, ventilation]
    side_effects: [air_movement]
    binding: {type: pwm, bus: pwm0, channel: 0, frequency_hz: 25000, duty_min: DMIN, duty_max: 100}
`
	p := filepath.Join(t.TempDir(), "pwm.yml")
	if err := os.WriteFile(p, []byte(strings.NewReplacer("CHIP", chip, "DMIN", "20").Replace(src)), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startHTTP(t, daemonOpts{manifest: p})
	cs := connectHTTP(t, d, "2026-07-28")
	a := doModbus(t, cs, "do_fan_speed", 75, "fan-1")
	if a.Status != "success" || !a.Verified {
		t.Fatalf("do_fan_speed 75: %+v", a)
	}
	duty, _ := os.ReadFile(filepath.Join(chip, "pwm0/duty_cycle"))
	if strings.TrimSpace(string(duty)) != "32000" { // 20 + 80*0.75 = 80 % of 40000 ns
		t.Fatalf("duty_cycle %q, want 32000", duty)
	}
	res := call(t, cs, "do_fan_speed", map[string]any{"value": 120, "idempotency_key": "fan-2"})
	if duty2, _ := os.ReadFile(filepath.Join(chip, "pwm0/duty_cycle")); string(duty2) != string(duty) || !strings.Contains(text(res), "120") {
		t.Fatalf("do_fan_speed 120: %s (duty now %q)", text(res), duty2)
	}

	bad := filepath.Join(t.TempDir(), "bad.yml")
	if err := os.WriteFile(bad, []byte(strings.NewReplacer("CHIP", chip, "DMIN", "120").Replace(src)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(physdBin, "validate", bad).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "bad.yml:18:80: capabilities[0].binding.duty_min: duty_min 120 is outside 0..100") {
		t.Fatalf("validate: %v\n%s", err, out)
	}
}
