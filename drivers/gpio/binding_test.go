package gpio

import (
	"strings"
	"testing"

	"github.com/physd/physd/manifest"
)

func TestBindingErrors(t *testing.T) {
	for _, tc := range []struct {
		name, cap string
		want      string
	}{
		{"no pin", readCap("c", "bool", `{type: gpio, bus: gpio, pull: up}`),
			"rpi.yml:12:14: capabilities[0].binding.pin: required: which GPIO line"},
		{"do on input", doCap("c", `{type: gpio, bus: gpio, pin: GPIO17, direction: in}`),
			"rpi.yml:12:62: capabilities[0].binding.direction: a do capability drives the pin, so it must be an output"},
		{"bad direction", readCap("c", "bool", `{type: gpio, bus: gpio, pin: GPIO17, direction: sideways}`),
			`direction "sideways"; fix: use direction: in or direction: out`},
		{"pull on output", doCap("c", `{type: gpio, bus: gpio, pin: GPIO17, pull: up}`),
			"binding.pull: pull applies to inputs"},
		{"bad pull", readCap("c", "bool", `{type: gpio, bus: gpio, pin: GPIO17, pull: sideways}`),
			`pull "sideways"; fix: use pull: up, down or none`},
		{"initial on input", readCap("c", "bool", `{type: gpio, bus: gpio, pin: GPIO17, initial: high}`),
			"binding.initial: initial applies to outputs"},
		{"bad initial", doCap("c", `{type: gpio, bus: gpio, pin: GPIO17, initial: maybe}`),
			`initial "maybe"`},
		{"counter on output", doCap("c", `{type: gpio, bus: gpio, pin: GPIO17, edge_count: {edge: rising}}`),
			"binding.edge_count: edge counting needs an input"},
		{"bad edge", readCap("c", "int", `{type: gpio, bus: gpio, pin: GPIO17, edge_count: {edge: up}}`),
			`rpi.yml:12:70: capabilities[0].binding.edge_count.edge: edge "up"`},
		{"debounce range", readCap("c", "int", `{type: gpio, bus: gpio, pin: GPIO17, edge_count: {debounce_ms: -1}}`),
			"debounce_ms -1 is outside 0..10000"},
		{"counter needs int", readCap("c", "bool", `{type: gpio, bus: gpio, pin: GPIO17, edge_count: {}}`),
			`capabilities[0].data_type: an edge counter reads a count, not data_type "bool"`},
		{"level needs bool", readCap("c", "float", `{type: gpio, bus: gpio, pin: GPIO17}`),
			`a GPIO level is data_type bool, not "float"`},
		{"unknown key", readCap("c", "bool", `{type: gpio, bus: gpio, pin: GPIO17, pul: up}`),
			`binding.pul: unknown key "pul"; fix: did you mean "pull"?`},
		{"unsupported mode", readCap("c", "bool", `{type: gpio, bus: gpio, address: "pin=14:mode=pwm"}`),
			`mode "pwm" is not supported by the gpio driver`},
		{"address and key", readCap("c", "bool", `{type: gpio, bus: gpio, address: "pin=14", pin: GPIO14}`),
			`pin is set both in the address string "pin=14" and as a binding key`},
		{"bad address", readCap("c", "bool", `{type: gpio, bus: gpio, address: "pin=14:pull"}`),
			`part 2 "pull" of "pin=14:pull" is not key=value`},
		{"bad value in address", readCap("c", "bool", `{type: gpio, bus: gpio, address: "pin=14:active_low=yes please"}`),
			"binding.address.active_low: expected true or false"},
		{"i2c binding on gpio bus", readCap("c", "bool", `{type: i2c, bus: gpio, pin: GPIO17}`),
			`binding.type: binding type "i2c" on a gpio bus`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckBinding(parse(t, tc.cap).Capabilities[0])
			if err == nil {
				t.Fatal("CheckBinding accepted the binding")
			}
			if _, ok := err.(manifest.Errors); !ok {
				t.Errorf("err is %T, want manifest.Errors", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error does not contain %q:\n%v", tc.want, err)
			}
		})
	}
}

func TestBindingForms(t *testing.T) {
	for _, pair := range [][2]string{
		{`{type: gpio, bus: gpio, address: "pin=14:mode=digital"}`, `{type: gpio, bus: gpio, pin: "14", direction: in}`},
		{`{type: gpio, bus: gpio, address: "GPIO22:edge=falling:debounce_ms=5:pull=up"}`,
			`{type: gpio, bus: gpio, pin: GPIO22, pull: up, edge_count: {edge: falling, debounce_ms: 5}}`},
		{`{type: gpio, bus: gpio, address: "pin=22:mode=counter"}`, `{type: gpio, bus: gpio, pin: 22, edge_count: {edge: rising}}`},
		{`{type: gpio, bus: gpio, address: "pin=27:active_low=true:pull=float"}`, `{type: gpio, bus: gpio, pin: 27, active_low: true, pull: none}`},
	} {
		dt := "bool"
		if strings.Contains(pair[1], "edge_count") {
			dt = "int"
		}
		m := parse(t, readCap("a", dt, pair[0])+readCap("b", dt, pair[1]))
		a, err := parseBinding(m.Capabilities[0])
		if err != nil {
			t.Fatalf("%s: %v", pair[0], err)
		}
		b, err := parseBinding(m.Capabilities[1])
		if err != nil {
			t.Fatalf("%s: %v", pair[1], err)
		}
		same := a.pin == b.pin && a.counting == b.counting && a.elec.out == b.elec.out && a.elec.activeLow == b.elec.activeLow &&
			a.elec.pull == b.elec.pull && (a.elec.counter == nil) == (b.elec.counter == nil) &&
			(a.elec.counter == nil || *a.elec.counter == *b.elec.counter)
		if !same {
			t.Errorf("%s\n gives %+v\n%s\n gives %+v", pair[0], *a, pair[1], *b)
		}
	}
}

func TestBusConfigIsStrict(t *testing.T) {
	m := parseBus(t, "{type: gpio, chip: 0}", readCap("c", "bool", `{type: gpio, bus: gpio, pin: GPIO17}`))
	if _, err := Open(t.Context(), m.Buses["gpio"]); err == nil || !strings.Contains(err.Error(), `rpi.yml:5:22: buses.gpio.chip: unknown key "chip"`) {
		t.Fatalf("a stray bus key: %v", err)
	}
}
