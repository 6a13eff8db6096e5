package modbus

import (
	"context"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/modbus/modbustest"
	"github.com/physd/physd/manifest"
)

// A bad verify point is refused at validate time with its position, the
// field under binding.verify and a fix.
func TestVerifyBindingErrors(t *testing.T) {
	cases := []struct {
		name, src string
		want      []string
	}{
		{"read capability", `{name: p, kind: read, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 1,
  verify: {table: discrete, address: 2}}}`,
			[]string{"m.yml:2:11", "binding.verify", "do capabilities only", "fix: remove verify"}},
		{"not a mapping", `{name: p, kind: do, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 1, verify: 12}}`,
			[]string{"binding.verify:", "must be a mapping", "fix: write verify: {table: discrete"}},
		{"no address", `{name: p, kind: do, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 1, verify: {table: discrete}}}`,
			[]string{"binding.verify:", "verify has no address", "fix: add address"}},
		{"itself", `{name: p, kind: do, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 1, verify: {table: coil, address: 1}}}`,
			[]string{"binding.verify:", "names the written point itself (unit 1 coil 00002 (address 1))", "fix: name the input or register"}},
		{"unknown key", `{name: p, kind: do, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 1,
  verify: {tabel: discrete, address: 2}}}`,
			[]string{"m.yml:2:12", "binding.verify.tabel", "table"}},
		{"unknown table", `{name: p, kind: do, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 1,
  verify: {table: status, address: 2}}}`,
			[]string{"m.yml:2:19", "binding.verify.table", `unknown table "status"`, "fix: use coil, discrete, input or holding"}},
		{"write_function", `{name: p, kind: do, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 1,
  verify: {table: discrete, address: 2, write_function: 5}}}`,
			[]string{"binding.verify.write_function", "only read"}},
		{"expect on a float", `{name: p, kind: do, data_type: float, binding: {type: modbus, bus: plc, table: holding, address: 1, data_type: float32,
  verify: {table: input, address: 2, expect: {1: 1}}}}`,
			[]string{"m.yml:2:46", "binding.verify.expect", "bool and enum capabilities, not float", "fix: remove expect"}},
		{"expect incomplete", `{name: p, kind: do, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 1,
  verify: {table: discrete, address: 2, expect: {true: false}}}}`,
			[]string{"binding.verify.expect", "no entry for false", "fix: map every value"}},
		{"expect bad value", `{name: p, kind: do, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 1,
  verify: {table: discrete, address: 2, expect: {true: on, false: off}}}}`,
			[]string{"binding.verify.expect.true", "must be true, false or an integer"}},
		{"expect mixed", `{name: p, kind: do, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 1,
  verify: {table: input, address: 2, data_type: uint16, expect: {true: 3, false: false}}}}`,
			[]string{"binding.verify.expect", "mixes true/false and integers"}},
		{"expect enum name", `{name: p, kind: do, data_type: enum, enum_values: [off, on], binding: {type: modbus, bus: plc, table: holding, address: 1,
  verify: {table: input, address: 2, expect: {off: 0, onn: 1}}}}`,
			[]string{"binding.verify.expect.onn", `names "onn"`, "use one of off, on"}},
		{"expect bool into a float register", `{name: p, kind: do, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 1,
  verify: {table: input, address: 2, data_type: float32, expect: {true: 1, false: 0}}}}`,
			[]string{"binding.verify.data_type", "float32 point cannot be an int"}},
		{"bad tolerance", `{name: p, kind: do, data_type: float, binding: {type: modbus, bus: plc, table: holding, address: 1, data_type: float32,
  verify: {table: input, address: 2, tolerance: -1}}}`,
			[]string{"m.yml:2:49", "binding.verify.tolerance", "≥ 0", "fix: write the accepted"}},
		{"tolerance on bool", `{name: p, kind: do, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 1,
  verify: {table: discrete, address: 2, tolerance: 1}}}`,
			[]string{"binding.verify.tolerance", "float and int capabilities, not bool"}},
		{"float verified by a coil", `{name: p, kind: do, data_type: float, binding: {type: modbus, bus: plc, table: holding, address: 1, data_type: float32,
  verify: {table: coil, address: 2}}}`,
			[]string{"m.yml:2:11", "binding.verify.data_type", "bool point cannot be a float capability", "fix: verify a float capability with a point that can show its value"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := CheckBinding(TypeTCP, capFrom(t, c.src))
			mustContain(t, err, c.want...)
		})
	}
}

// The verify point's defaults: the binding's unit (RTU needs one) and a
// register point's encoding.
func TestVerifyDefaults(t *testing.T) {
	c := capFrom(t, `{name: sp, kind: do, data_type: float, binding: {type: modbus, bus: plc, unit: 7, table: holding, address: 10,
  data_type: int16, scale: 0.5, byte_order: BADC, verify: {table: input, address: 20}}}`)
	s, err := parseBinding(c, TypeRTU)
	if err != nil {
		t.Fatal(err)
	}
	v := s.verify.pt
	if v.unit != 7 || v.table != tableInput || v.addr != 20 || v.codec.dt != dtInt16 || v.conv.scale != 0.5 || v.codec.order != s.codec.order {
		t.Fatalf("verify point = %+v, want unit 7 input 20 int16 scale 0.5 BADC", v)
	}
}

func verifyOK(t *testing.T, p drivers.Point, v any) drivers.Verification {
	t.Helper()
	vr, ok := p.(drivers.Verifier)
	if !ok {
		t.Fatalf("%T is not a drivers.Verifier", p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := vr.Verify(ctx, v)
	if err != nil {
		t.Fatalf("Verify(%v): %v", v, err)
	}
	return r
}

// A coil command verified by a discrete input, a setpoint by another
// register (float32 and a scaled int16), against the simonvetter peer
// mirroring the commands; a stuck status is a mismatch.
func TestVerifyPointAgainstPeer(t *testing.T) {
	srv, bank := peer(t)
	b := openTCP(t, srv.Addr, "")
	bank.AddMirror(modbustest.Mirror{Unit: 1, From: modbustest.Coils, FromAddr: 5, To: modbustest.DiscreteInputs, ToAddr: 105, N: 1})
	bank.AddMirror(modbustest.Mirror{Unit: 1, From: modbustest.Coils, FromAddr: 6, To: modbustest.DiscreteInputs, ToAddr: 106, N: 1, Invert: true})
	bank.AddMirror(modbustest.Mirror{Unit: 1, From: modbustest.HoldingRegisters, FromAddr: 10, To: modbustest.HoldingRegisters, ToAddr: 110, N: 2})
	bank.AddMirror(modbustest.Mirror{Unit: 1, From: modbustest.HoldingRegisters, FromAddr: 20, To: modbustest.InputRegisters, ToAddr: 120, N: 1})

	pump := pointOn(t, b, `{name: pump, kind: do, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 5, verify: {table: discrete, address: 105}}}`)
	fault := pointOn(t, b, `{name: run, kind: do, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 6,
  verify: {address: "reg=10107", expect: {true: false, false: true}}}}`)
	sp := pointOn(t, b, `{name: sp, kind: do, data_type: float, binding: {type: modbus, bus: plc, table: holding, address: 10, data_type: float32, verify: {table: holding, address: 110}}}`)
	sc := pointOn(t, b, `{name: sc, kind: do, data_type: float, binding: {type: modbus, bus: plc, table: holding, address: 20, data_type: int16, scale: 0.1, verify: {table: input, address: 120, tolerance: 0.2}}}`)

	for _, v := range []bool{true, false, true} {
		if err := writeCtx(pump, v); err != nil {
			t.Fatal(err)
		}
		if r := verifyOK(t, pump, v); !r.OK || r.Observed != v || r.Point != "unit 1 discrete 10106 (address 105)" {
			t.Fatalf("pump %v: %+v", v, r)
		}
		if err := writeCtx(fault, v); err != nil {
			t.Fatal(err)
		}
		if r := verifyOK(t, fault, v); !r.OK || r.Observed != !v {
			t.Fatalf("inverted %v: %+v", v, r)
		}
	}
	if err := writeCtx(sp, 0.1); err != nil {
		t.Fatal(err)
	}
	if r := verifyOK(t, sp, 0.1); !r.OK || r.Observed != float64(float32(0.1)) {
		t.Fatalf("float32 setpoint 0.1: %+v (the verify point shows float32(0.1))", r)
	}
	if err := writeCtx(sc, 21.5); err != nil {
		t.Fatal(err)
	}
	if r := verifyOK(t, sc, 21.5); !r.OK {
		t.Fatalf("scaled setpoint: %+v", r)
	}
	// The device reports the setpoint 0.1 off: within tolerance 0.2.
	bank.SetInput(1, 120, 216)
	if r := verifyOK(t, sc, 21.5); !r.OK {
		t.Fatalf("0.1 off with tolerance 0.2: %+v", r)
	}
	bank.SetInput(1, 120, 300)
	if r := verifyOK(t, sc, 21.5); r.OK || r.Observed != 30.0 {
		t.Fatalf("30 for 21.5: %+v, want a mismatch", r)
	}

	// Stuck: the status no longer follows the command.
	bank.StopMirrors()
	if err := writeCtx(pump, false); err != nil {
		t.Fatal(err)
	}
	if r := verifyOK(t, pump, false); r.OK || r.Observed != true || r.Expected != false {
		t.Fatalf("stuck status: %+v, want observed true, expected false, not OK", r)
	}
	if bank.Coil(1, 5) || !bank.Discrete(1, 105) {
		t.Fatal("want the coil written false and the input left true")
	}
	if !strings.Contains(verifyOK(t, pump, false).Point, "discrete 10106 (address 105)") {
		t.Fatal("Point does not name the verify point")
	}
}

// A point without verify is not a Verifier: the node reads it back itself.
func TestNoVerifyNoVerifier(t *testing.T) {
	srv, _ := peer(t)
	b := openTCP(t, srv.Addr, "")
	p := pointOn(t, b, `{name: pump, kind: do, data_type: bool, binding: {type: modbus, bus: plc, table: coil, address: 5}}`)
	if _, ok := p.(drivers.Verifier); ok {
		t.Fatal("a point without verify implements drivers.Verifier")
	}
}

// FuzzVerifyBinding: any verify mapping is accepted or refused with
// positioned errors, never a panic.
func FuzzVerifyBinding(f *testing.F) {
	for _, s := range []string{
		`{table: discrete, address: 105}`,
		`{address: "reg=10107", expect: {true: false, false: true}}`,
		`{table: input, address: 2, data_type: uint16, expect: {true: 3, false: 0}}`,
		`{table: holding, address: 110, data_type: float32, byte_order: CDAB, tolerance: 0.5}`,
		`{table: holding, address: 3, data_type: bit, bit: 4}`,
		`{unit: 300, table: coil, address: 65535}`,
		`[1, 2]`, `~`, `{expect: [true]}`, `{address: {a: 1}}`,
	} {
		for _, dt := range []string{"bool", "float", "int", "enum"} {
			f.Add(dt, s)
		}
	}
	f.Fuzz(func(t *testing.T, dt, verify string) {
		binding := "{type: modbus, bus: plc, table: holding, address: 1, data_type: uint16, verify: " + verify + "}"
		if dt == "bool" {
			binding = "{type: modbus, bus: plc, table: coil, address: 1, verify: " + verify + "}"
		}
		src := "{name: p, kind: do, data_type: " + dt + ", enum_values: [a, b], binding: " + binding + "}"
		var doc yaml.Node
		if yaml.Unmarshal([]byte(src), &doc) != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
			return
		}
		c := capFrom(t, src)
		for _, kind := range []string{TypeTCP, TypeRTU} {
			err := CheckBinding(kind, c)
			if err == nil {
				continue
			}
			errs, ok := err.(manifest.Errors)
			if !ok {
				t.Fatalf("%s: %T %v, want manifest.Errors", src, err, err)
			}
			for _, e := range errs {
				if e.Pos.File != testFile || e.Pos.Line == 0 || e.Field == "" || e.Fix == "" {
					t.Fatalf("%s: error without position, field or fix: %+v", src, e)
				}
			}
		}
	})
}
