package i2c

import (
	"bytes"
	"strings"
	"testing"

	"github.com/physd/physd/manifest"
)

func TestBindingErrors(t *testing.T) {
	for _, tc := range []struct {
		name, cap string
		want      []string // substrings of the error
	}{
		{"no register or command", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x48}`),
			[]string{"rpi.yml:12:14: capabilities[0].binding: an i2c binding needs register, command or profile"}},
		{"8-bit address", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x90, register: 0}`),
			[]string{"binding.address: 0x90 is an 8-bit (shifted) address; use the 7-bit address 0x48"}},
		{"reserved address", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x00, register: 0}`),
			[]string{"outside the 7-bit device range"}},
		{"no address", readCap("c", "float", `{type: i2c, bus: i2c1, register: 0}`),
			[]string{"binding.address: required: the device's 7-bit I²C address"}},
		{"garbage address", readCap("c", "float", `{type: i2c, bus: i2c1, address: "0x48:reg"}`),
			[]string{`part 2 "reg" of "0x48:reg" is not key=value`}},
		{"both", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0, command: 0x2400, read_bytes: 6}`),
			[]string{"rpi.yml:12:74: capabilities[0].binding.command: a binding has either register"}},
		{"width", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0, width: 12}`),
			[]string{"rpi.yml:12:72: capabilities[0].binding.width: width 12 is not supported; fix: use width: 8, 16, 24 or 32"}},
		{"byte order", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0, byte_order: middle}`),
			[]string{`byte_order "middle"; fix: use byte_order: big`}},
		{"unknown key", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x48, regster: 0}`),
			[]string{"rpi.yml:12:52: capabilities[0].binding.regster: unknown key", `did you mean "register"`}},
		{"key twice", readCap("c", "float", `{type: i2c, bus: i2c1, address: "0x48:reg=0x00", register: 1}`),
			[]string{`register is set both in the address string "0x48:reg=0x00" and as a binding key`}},
		{"bad value in address", readCap("c", "float", `{type: i2c, bus: i2c1, address: "0x48:reg=zero"}`),
			[]string{"capabilities[0].binding.address.register: expected a non-negative integer"}},
		{"register out of range", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0x100}`),
			[]string{"binding.register: integer 256 is out of range"}},
		{"scale zero", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0, scale: 0}`),
			[]string{"binding.scale: scale must not be 0"}},
		{"scale garbage", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0, scale: 1/x}`),
			[]string{"binding.scale", `invalid number "1/x"`}},
		{"bool with scale", readCap("c", "bool", `{type: i2c, bus: i2c1, address: 0x48, register: 0, scale: 2}`),
			[]string{"data_type bool reads raw != 0"}},
		{"string", readCap("c", "string", `{type: i2c, bus: i2c1, address: 0x48, register: 0}`),
			[]string{"capabilities[0].data_type: data_type \"string\" is not supported by the i2c driver"}},
		{"gpio binding on i2c bus", readCap("c", "bool", `{type: gpio, bus: i2c1, address: 0x48, register: 0}`),
			[]string{`binding.type: binding type "gpio" on an i2c bus`}},
		{"command keys on a register", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0, crc: sht3x}`),
			[]string{"binding.crc: crc applies to command-style reads"}},
		{"no read_bytes", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x44, command: 0x2400}`),
			[]string{"binding.read_bytes: required for a command-style read"}},
		{"read_bytes not whole words", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x44, command: 0x2400, read_bytes: 4, crc: sht3x}`),
			[]string{"read_bytes 4 is not a whole number of 3-byte words"}},
		{"field outside frame", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x44, command: 0x2400, read_bytes: 6, crc: sht3x, field: 2}`),
			[]string{"field 2 is outside the frame's 2 words; fix: use field: 0..1"}},
		{"width on command", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x44, command: 0x2400, read_bytes: 2, width: 16}`),
			[]string{"binding.width: command frames are 16-bit big-endian words"}},
		{"command_bytes too small", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x44, command: 0x2400, command_bytes: 1, read_bytes: 2}`),
			[]string{"command 0x2400 needs 2..4 bytes, got 1"}},
		{"do on command", doCap("c", "float", `{type: i2c, bus: i2c1, address: 0x44, command: 0x2400, read_bytes: 6}`, ""),
			[]string{"command-style points are read-only"}},
		{"wait longer than timeout", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x44, command: 0x2400, wait_ms: 50, read_bytes: 6}`) + "    timeout_ms: 40\n",
			[]string{"capabilities[0].timeout_ms: timeout_ms 40 leaves no time to read after wait_ms 50"}},
		{"wait too long", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x44, command: 0x2400, wait_ms: 60000, read_bytes: 6}`) + "    timeout_ms: 100000\n",
			[]string{"wait_ms 60000 is outside 0..10000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := parse(t, "{type: i2c, bus: x}", tc.cap)
			c := m.Capabilities[0]
			err := CheckBinding(c)
			if err == nil {
				t.Fatal("CheckBinding accepted the binding")
			}
			if _, ok := err.(manifest.Errors); !ok {
				t.Errorf("err is %T, want manifest.Errors", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestBindingForms(t *testing.T) {
	// The address string and the structured keys give the same spec.
	for _, pair := range [][2]string{
		{`{type: i2c, bus: i2c1, address: "0x48:reg=0x00:width=16:signed=true:order=little:scale=0.5:offset=-1"}`,
			`{type: i2c, bus: i2c1, address: 0x48, register: 0x00, width: 16, signed: true, byte_order: little, scale: 0.5, offset: -1}`},
		{`{type: i2c, bus: i2c1, address: "0x44:cmd=0x2400:wait_ms=15:read_bytes=6:crc=sht3x:field=1:scale=100/65535"}`,
			`{type: i2c, bus: i2c1, address: 0x44, command: 0x2400, wait_ms: 15, read_bytes: 6, crc: sht3x, field: 1, scale: 100/65535}`},
		{`{type: i2c, bus: i2c1, address: "72:reg=5"}`, `{type: i2c, bus: i2c1, address: 0x48, register: 0x05, width: 8}`},
	} {
		m := parse(t, "{type: i2c, bus: x}", readCap("a", "float", pair[0])+readCap("b", "float", pair[1]))
		a, err := parseBinding(m.Capabilities[0])
		if err != nil {
			t.Fatalf("%s: %v", pair[0], err)
		}
		b, err := parseBinding(m.Capabilities[1])
		if err != nil {
			t.Fatalf("%s: %v", pair[1], err)
		}
		if a.addr != b.addr || a.format != b.format || a.reg != b.reg || a.isReg != b.isReg || !bytes.Equal(a.command, b.command) ||
			a.wait != b.wait || a.readBytes != b.readBytes || a.crc != b.crc || a.field != b.field {
			t.Errorf("%s\n gives %+v\n%s\n gives %+v", pair[0], *a, pair[1], *b)
		}
	}
	m := parse(t, "{type: i2c, bus: x}", readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x44, command: 0x24, command_bytes: 2, read_bytes: 3, crc: sht3x}`))
	s, err := parseBinding(m.Capabilities[0])
	if err != nil || !bytes.Equal(s.command, []byte{0x00, 0x24}) {
		t.Fatalf("command_bytes 2: % X, %v", s.command, err)
	}
}

func TestBusConfigErrors(t *testing.T) {
	for cfg, want := range map[string]string{
		"{type: i2c}":                        "rpi.yml:5:3: buses.i2c1.bus: required: which I²C bus",
		"{type: i2c, bus: 1, speed: 400000}": "buses.i2c1.speed",
		"{type: i2c, bus: 1, down_after: 0}": "buses.i2c1.down_after: down_after 0 is outside 1..1000",
	} {
		m := parse(t, cfg, readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0}`))
		_, err := Open(t.Context(), m.Buses["i2c1"])
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", cfg, err, want)
		}
	}
}
