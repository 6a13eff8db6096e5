package interlock_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/physd/physd/interlock"
	"github.com/physd/physd/promcp"
)

func f(v float64) *float64 { return &v }

func good(v any) interlock.Reading {
	return interlock.Reading{Known: true, Value: v, Quality: promcp.QualityGood, Age: 10 * time.Millisecond}
}

// TestJudge: each kind on good, unknown and stale readings, at known and
// unknown output values.
func TestJudge(t *testing.T) {
	perm := &interlock.Rule{Name: "p", Kind: interlock.Permissive, Outputs: []string{"do_v"}, AppliesAbove: f(0),
		Cond: interlock.Condition{Read: "read_tank", Above: f(10)}, MaxAge: time.Second}
	bound := &interlock.Rule{Name: "i", Kind: interlock.Interlock, Outputs: []string{"do_h"}, Max: f(20),
		Cond: interlock.Condition{Read: "read_vent", Above: f(80)}, MaxAge: time.Second}
	trip := &interlock.Rule{Name: "t", Kind: interlock.Trip, Outputs: []string{"do_h"},
		Cond: interlock.Condition{Read: "read_temp", Above: f(35)}, MaxAge: time.Second}
	stale := interlock.Reading{Known: true, Value: 50.0, Quality: promcp.QualityStale, Age: 10 * time.Millisecond}
	old := interlock.Reading{Known: true, Value: 50.0, Quality: promcp.QualityGood, Age: 2 * time.Second}
	out := func(tool string, v any) interlock.Output {
		return interlock.Output{Tool: tool, Safe: 0.0, Value: v, Known: v != nil}
	}
	for _, c := range []struct {
		name   string
		r      *interlock.Rule
		out    interlock.Output
		read   interlock.Reading
		broken bool
	}{
		{"permissive holds", perm, out("do_v", 50.0), good(20.0), false},
		{"permissive fails", perm, out("do_v", 50.0), good(5.0), true},
		{"permissive at the boundary", perm, out("do_v", 50.0), good(10.0), true},
		{"permissive: safe value needs nothing", perm, out("do_v", 0.0), good(5.0), false},
		{"permissive: stale reading", perm, out("do_v", 50.0), stale, true},
		{"permissive: old reading", perm, out("do_v", 50.0), old, true},
		{"permissive: never read", perm, out("do_v", 50.0), interlock.Reading{}, true},
		{"permissive: unknown output", perm, out("do_v", nil), good(5.0), true},
		{"interlock inactive", bound, out("do_h", 60.0), good(50.0), false},
		{"interlock active, within", bound, out("do_h", 20.0), good(90.0), false},
		{"interlock active, beyond", bound, out("do_h", 21.0), good(90.0), true},
		{"interlock: stale reading counts as active", bound, out("do_h", 60.0), stale, true},
		{"interlock: stale reading, within", bound, out("do_h", 10.0), stale, false},
		{"trip inactive", trip, out("do_h", 60.0), good(20.0), false},
		{"trip active", trip, out("do_h", 1.0), good(40.0), true},
		{"trip active at safe", trip, out("do_h", 0.0), good(40.0), false},
		{"trip: error reading", trip, out("do_h", 5.0), interlock.Reading{Error: "timeout"}, true},
	} {
		v := c.r.Judge(c.out, c.read)
		if (v != nil) != c.broken {
			t.Errorf("%s: Judge = %v; want broken %v", c.name, v, c.broken)
		}
		if v != nil && v.Reason() == "" {
			t.Errorf("%s: no reason", c.name)
		}
	}
}

// benchSet is n interlocks on one output, all reading one capability.
func benchSet(n int) *interlock.Set {
	rules := make([]*interlock.Rule, n)
	for i := range rules {
		rules[i] = &interlock.Rule{Name: fmt.Sprint("r", i), Kind: interlock.Interlock, Outputs: []string{"do_h"}, Max: f(float64(50 + i%50)),
			Cond: interlock.Condition{Read: "read_vent", Above: f(80)}, MaxAge: time.Second}
	}
	return interlock.NewSet(rules)
}

// BenchmarkCheck100: one do_ judged against 100 interlocks (all pass).
func BenchmarkCheck100(b *testing.B) {
	s := benchSet(100)
	rd := good(90.0)
	read := func(string, time.Duration) interlock.Reading { return rd }
	out := interlock.Output{Tool: "do_h", Safe: 0.0, Value: 40.0, Known: true}
	b.ReportAllocs()
	for b.Loop() {
		if s.Check(out, read, nil) != nil {
			b.Fatal("broken")
		}
	}
}

// BenchmarkObservation100: one observation of the shared reading judged
// against the 100 rules that read it.
func BenchmarkObservation100(b *testing.B) {
	s := benchSet(100)
	rd := good(90.0)
	out := interlock.Output{Tool: "do_h", Safe: 0.0, Value: 40.0, Known: true}
	b.ReportAllocs()
	for b.Loop() {
		for _, r := range s.Reading("read_vent") {
			if r.Judge(out, rd) != nil {
				b.Fatal("broken")
			}
		}
	}
}
