package gate

import (
	"context"
	"testing"
)

func benchGate(b *testing.B) *Gate {
	t := actuatorTable()
	for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
		t.Allow = append(t.Allow, Rule{Name: "extra_" + n, Tool: "do_zone_" + n + "_*", Range: &RangeMatch{Arg: "value", Min: f64(0), Max: f64(100)}})
	}
	return mustGate(b, Config{L0: t})
}

// BenchmarkDecideL0 is a typical L0 allow: a numeric and a short string
// argument, matched after 4 deny rules and the shell blacklist.
func BenchmarkDecideL0(b *testing.B) {
	g := benchGate(b)
	r := Request{Tool: "do_set_fan", Args: map[string]any{"value": 42.0, "mode": "auto", "idempotency_key": "k-0001"}, DeviceID: "edge-01"}
	for b.Loop() {
		if res := g.DecideL0(r); res.Decision != Allow {
			b.Fatal(res.Reason)
		}
	}
}

// BenchmarkDecideL0Long is the worst realistic case: a 200-character
// free-text argument that passes every blacklist rule.
func BenchmarkDecideL0Long(b *testing.B) {
	g := benchGate(b)
	text := "Greenhouse north: open vent 3 to 40 percent, then wait 'ten' minutes and report the temperature. " +
		"If humidity is above 80 percent, start fan 2 at low speed. Note: do not water before 6 pm, thanks."
	r := Request{Tool: "do_set_led", Args: map[string]any{"value": true, "note": text}}
	for b.Loop() {
		if res := g.DecideL0(r); res.Decision != Allow {
			b.Fatal(res.Reason)
		}
	}
}

// BenchmarkDecideGrey is a full Decide of a grey call with L1 off.
func BenchmarkDecideGrey(b *testing.B) {
	g := benchGate(b)
	r := Request{Tool: "do_open_vent", Args: map[string]any{"value": 40}}
	ctx := context.Background()
	for b.Loop() {
		if res := g.Decide(ctx, r); res.Decision != Deny {
			b.Fatal(res.Reason)
		}
	}
}
