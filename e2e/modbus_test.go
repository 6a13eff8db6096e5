package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/drivers/modbus/modbustest"
)

// modbusManifest is a device on one modbus_tcp bus at ADDR; CAPS are its
// capabilities.
const modbusManifest = `physmcp_version: "0.1"
device:
  id: gw_plc_001
  type: plc
  location: {zone: plant}
network:
  protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080, role: native}]
  mesh: {enabled: false}
buses:
  plc: {type: modbus_tcp, address: "ADDR", timeout_ms: 200BUSEXTRA}
capabilities:
CAPS`

// doCap is a do capability of the modbus manifest.
func doCap(name, dataType, binding, extra string) string {
	return fmt.Sprintf(`  - name: %s
    kind: do
    description: %s
    data_type: %s
    semantic_tags: [plc]
    binding: %s
%s`, name, name, dataType, binding, extra)
}

func startModbus(t *testing.T, addr, busExtra string, caps ...string) (*daemon, *mcp.ClientSession) {
	t.Helper()
	return startModbusManifest(t, strings.NewReplacer("ADDR", addr, "BUSEXTRA", busExtra, "CAPS", strings.Join(caps, "")).Replace(modbusManifest))
}

// startModbusManifest starts physd on the manifest src and connects to it.
func startModbusManifest(t *testing.T, src string) (*daemon, *mcp.ClientSession) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "physmcp.manifest.yml")
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startHTTP(t, daemonOpts{manifest: p})
	return d, connectHTTP(t, d, "2026-07-28")
}

// doModbus calls a do_ tool and decodes its answer.
func doModbus(t *testing.T, cs *mcp.ClientSession, tool string, value any, key string) doAnswer {
	t.Helper()
	res := call(t, cs, tool, map[string]any{"value": value, "idempotency_key": key})
	if res.IsError {
		t.Fatalf("%s(%v): tool error: %s", tool, value, text(res))
	}
	var a doAnswer
	if err := json.Unmarshal([]byte(text(res)), &a); err != nil {
		t.Fatalf("%s: %v: %s", tool, err, text(res))
	}
	return a
}

// TestModbusVerifyPoint: through MCP against the built binary and a Modbus
// TCP peer that reflects commands elsewhere, a coil command is verified by
// a discrete input, a setpoint by a separate register, and a status that
// does not follow is partial with code mismatch.
func TestModbusVerifyPoint(t *testing.T) {
	t.Parallel()
	bank := modbustest.NewBank(1000)
	srv, err := modbustest.StartTCP("127.0.0.1:0", bank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	bank.AddMirror(modbustest.Mirror{Unit: 1, From: modbustest.Coils, FromAddr: 5, To: modbustest.DiscreteInputs, ToAddr: 105, N: 1})
	bank.AddMirror(modbustest.Mirror{Unit: 1, From: modbustest.HoldingRegisters, FromAddr: 10, To: modbustest.HoldingRegisters, ToAddr: 110, N: 2})
	_, cs := startModbus(t, srv.Addr, "",
		doCap("pump", "bool", `{type: modbus, bus: plc, table: coil, address: 5, verify: {table: discrete, address: 105}}`, ""),
		doCap("setpoint", "float", `{type: modbus, bus: plc, table: holding, address: 10, data_type: float32, verify: {table: holding, address: 110}}`,
			"    range: {min: 0, max: 100}\n"),
		doCap("valve", "bool", `{type: modbus, bus: plc, table: coil, address: 7, verify: {table: discrete, address: 107}}`, ""))

	for i, v := range []bool{true, false, true} {
		a := doModbus(t, cs, "do_pump", v, fmt.Sprint("pump-", i))
		if a.Status != "success" || !a.Verified || !strings.Contains(a.Details, "verify=unit 1 discrete 10106 (address 105) shows "+fmt.Sprint(v)) {
			t.Errorf("do_pump %v: %+v, want success verified by discrete input 105", v, a)
		}
	}
	if a := doModbus(t, cs, "do_setpoint", 21.3, "sp-1"); a.Status != "success" || !a.Verified || !strings.Contains(a.Details, "holding 40111 (address 110)") {
		t.Errorf("do_setpoint 21.3: %+v, want success verified by holding 110", a)
	}
	// The valve's status input does not follow the coil (a stuck valve).
	a := doModbus(t, cs, "do_valve", true, "valve-1")
	if a.Status != "partial" || a.Verified || a.Code != "mismatch" || !strings.Contains(a.Details, "shows false, expected true") {
		t.Errorf("do_valve with a stuck status input: %+v, want partial, verified false, code mismatch", a)
	}
	if !bank.Coil(1, 7) {
		t.Error("the valve's coil was not written")
	}
	// The setpoint's echo register stops following: mismatch too.
	bank.StopMirrors()
	if a := doModbus(t, cs, "do_setpoint", 40, "sp-2"); a.Status != "partial" || a.Code != "mismatch" || !strings.Contains(a.Reason, "verify point") {
		t.Errorf("do_setpoint with a frozen echo register: %+v, want partial mismatch naming the verify point", a)
	}
}

// TestModbusExceptions: exceptions 01, 02, 03, 04 and 06 to a write each
// come back through MCP as status failed with their own code and a fix
// that fits, never source_unreachable; busy (06) is resent within the
// capability's timeout first.
func TestModbusExceptions(t *testing.T) {
	bank := modbustest.NewBank(1000)
	srv, err := modbustest.StartTCP("127.0.0.1:0", bank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	excs := map[uint16]modbustest.Exception{201: modbustest.IllegalFunction, 202: modbustest.IllegalDataAddress,
		203: modbustest.IllegalDataValue, 204: modbustest.DeviceFailure, 206: modbustest.DeviceBusy}
	bank.SetFault(func(r modbustest.Request) error {
		if e, ok := excs[r.Addr]; ok && r.Write {
			return e
		}
		if r.Write && r.Addr == 214 {
			// A device that fails half way: it stored something else.
			bank.SetHolding(1, 214, r.Regs[0]+1)
			return modbustest.DeviceFailure
		}
		return nil
	})
	var caps []string
	for _, addr := range []int{201, 202, 203, 204, 206, 214} {
		caps = append(caps, doCap(fmt.Sprint("ex", addr), "int",
			fmt.Sprintf(`{type: modbus, bus: plc, table: holding, address: %d, data_type: uint16}`, addr), "    timeout_ms: 2000\n"))
	}
	_, cs := startModbus(t, srv.Addr, "", caps...)
	cases := []struct {
		addr      uint16
		code, fix string
	}{
		{201, "illegal_function", "try write_function 16"},
		{202, "illegal_data_address", "the register exists (a read of it works) but refuses writes"},
		{203, "illegal_data_value", "check the capability's range against the device's"},
		{204, "server_device_failure", "read the value back before retrying"},
		{206, "slave_device_busy", "stayed busy through 3 resends"},
	}
	for _, c := range cases {
		start := time.Now()
		a := doModbus(t, cs, fmt.Sprint("do_ex", c.addr), 7, fmt.Sprint("ex-", c.addr))
		took := time.Since(start)
		if a.Status != "failed" || a.Code != c.code || a.Permission != "allowed" || !strings.Contains(a.Reason, "; fix: ") || !strings.Contains(a.Reason, c.fix) || strings.Count(a.Reason, "fix: ") != 1 || a.Verified {
			t.Errorf("exception at %d: %+v\nwant status failed, permission allowed, code %s, fix containing %q", c.addr, a, c.code, c.fix)
		}
		if strings.Contains(a.Reason, "source_unreachable") {
			t.Errorf("exception at %d names source_unreachable: %s", c.addr, a.Reason)
		}
		if c.addr == 206 {
			writes := 0
			for _, r := range bank.Requests() {
				if r.Write && r.Addr == 206 {
					writes++
				}
			}
			if writes != 4 || took > 2*time.Second {
				t.Errorf("busy: %d writes in %v, want 1 + busy_retries (3) within the 2 s timeout", writes, took)
			}
			t.Logf("busy: %d writes (1 + 3 resends) in %v", writes, took.Round(time.Millisecond))
		}
	}
	// 04 after which the device holds neither value: the outcome is open.
	a := doModbus(t, cs, "do_ex214", 7, "ex-214")
	if a.Status != "partial" || a.Code != "outcome_unknown" || !strings.Contains(a.Details, "device_code=server_device_failure") || !strings.Contains(a.Details, "read_back=8") {
		t.Errorf("04 with another value stored: %+v, want partial outcome_unknown naming the device code and the read-back", a)
	}
	for _, r := range bank.Requests() {
		if r.Write && r.Addr != 206 && r.Addr != 214 && len(r.Regs) > 0 {
			if got := bank.Holding(1, r.Addr, 1)[0]; got != 0 {
				t.Errorf("holding %d = %d after a refused write", r.Addr, got)
			}
		}
	}
}

// TestModbusTCPDroppedFrames: many do_ calls through a proxy that drops or
// resets requests and replies. The slave's write log shows no value
// written twice; every answer is success (and the value landed), failed
// (and it did not), or partial with a code; a lost verifying read-back is
// partial code=unverified, never success.
func TestModbusTCPDroppedFrames(t *testing.T) {
	t.Parallel()
	bank := modbustest.NewBank(1000)
	srv, err := modbustest.StartTCP("127.0.0.1:0", bank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	px, err := modbustest.StartProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	bank.AddMirror(modbustest.Mirror{Unit: 1, From: modbustest.HoldingRegisters, FromAddr: 40, To: modbustest.InputRegisters, ToAddr: 140, N: 1})
	_, cs := startModbus(t, px.Addr, ", down_after: 1000", // every call reaches the wire
		doCap("level", "int", `{type: modbus, bus: plc, table: holding, address: 30, data_type: uint16}`, "    timeout_ms: 1000\n"),
		doCap("speed", "int", `{type: modbus, bus: plc, table: holding, address: 40, data_type: uint16, verify: {table: input, address: 140}}`, "    timeout_ms: 1000\n"))
	px.SetDrop(func(n int) modbustest.Drop {
		switch {
		case n%7 == 3:
			return modbustest.DropRequest
		case n%7 == 5:
			return modbustest.DropReply
		case n%13 == 0:
			return modbustest.ResetReply
		case n%17 == 0:
			return modbustest.ResetRequest
		}
		return modbustest.Pass
	})

	const calls = 60
	counts := map[string]int{}
	verifyLost := 0 // do_speed answers whose verify-point read was lost
	type sent struct {
		addr uint16
		v    int
		a    doAnswer
	}
	var all []sent
	for i := range calls {
		tool, addr := "do_level", uint16(30)
		if i%2 == 1 {
			tool, addr = "do_speed", 40
		}
		v := 1000 + i
		a := doModbus(t, cs, tool, v, fmt.Sprint("drop-", i))
		all = append(all, sent{addr, v, a})
		k := a.Status
		if a.Code != "" && a.Status != "success" {
			k += "/" + a.Code
		}
		counts[k]++
		if tool == "do_speed" && a.Code == "unverified" {
			verifyLost++
			if !strings.Contains(a.Reason, "verify point unit 1 input 30141 (address 140)") {
				t.Errorf("unverified do_speed does not name its verify point: %s", a.Reason)
			}
		}
	}
	writes := map[[2]int]int{}
	total := 0
	for _, r := range bank.Requests() {
		if r.Write && len(r.Regs) == 1 {
			writes[[2]int{int(r.Addr), int(r.Regs[0])}]++
			total++
		}
	}
	doubles := 0
	for _, s := range all {
		n := writes[[2]int{int(s.addr), s.v}]
		if n > 1 {
			doubles++
			t.Errorf("%d written %d times at holding %d (answer %+v)", s.v, n, s.addr, s.a)
		}
		switch {
		case s.a.Status == "success":
			if !s.a.Verified || n != 1 || s.a.Code != "" {
				t.Errorf("success for %d at %d with %d writes received, verified %v, code %q", s.v, s.addr, n, s.a.Verified, s.a.Code)
			}
		case s.a.Status == "failed":
			if n != 0 {
				t.Errorf("failed for %d at %d, but the slave received it %d times: %+v", s.v, s.addr, n, s.a)
			}
		case s.a.Status == "partial":
			switch s.a.Code {
			case "outcome_unknown", "mismatch":
			case "unverified":
				if n != 1 {
					t.Errorf("unverified for %d: the device acknowledged it, yet the slave received %d writes", s.v, n)
				}
			default:
				t.Errorf("partial without a vocabulary code: %+v", s.a)
			}
			if s.a.Verified {
				t.Errorf("partial with verified true: %+v", s.a)
			}
		default:
			t.Errorf("status outside the vocabulary: %+v", s.a)
		}
	}
	t.Logf("%d do_ calls through the fault proxy: answers %v (%d unverified by a lost verify-point read); %d writes received by the slave, %d values written twice",
		calls, counts, verifyLost, total, doubles)
	if counts["partial/unverified"] == 0 || verifyLost == 0 {
		t.Errorf("no lost verifying read-back (of the point or of its verify point: %d) came back as partial/unverified: %v (the drop pattern should produce some)", verifyLost, counts)
	}
	if counts["success"] == 0 {
		t.Errorf("no call succeeded: %v", counts)
	}
}

// TestModbusVerifyValidate: physd validate reports a bad verify point at
// its line and column, with the field under binding.verify and a fix.
func TestModbusVerifyValidate(t *testing.T) {
	t.Parallel()
	src := strings.NewReplacer("ADDR", "127.0.0.1:5020", "BUSEXTRA", "", "CAPS",
		doCap("pump", "bool", `{type: modbus, bus: plc, table: coil, address: 5,
      verify: {table: discrete, address: 105, expect: {true: on, false: off}}}`, "")+
			doCap("fan", "bool", `{type: modbus, bus: plc, table: coil, address: 6, verify: {table: coil, address: 6}}`, "")).Replace(modbusManifest)
	p := filepath.Join(t.TempDir(), "physmcp.manifest.yml")
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(physdBin, "validate", p).CombinedOutput()
	if err == nil {
		t.Fatalf("validate accepted a bad verify point:\n%s", out)
	}
	for _, want := range []string{
		p + ":18:62: capabilities[0].binding.verify.expect.true: verify.expect.true must be true, false or an integer (what the verify point shows); fix: write e.g. true: true",
		"capabilities[1].binding.verify: verify names the written point itself (unit 1 coil 00007 (address 6)); fix: name the input or register that shows the command at another address",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("validate output lacks\n  %s\ngot:\n%s", want, out)
		}
	}
}
