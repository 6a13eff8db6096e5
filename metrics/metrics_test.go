package metrics

import (
	"strings"
	"testing"
)

// series are the label sets of name's series in a scrape.
func series(t *testing.T, m *Metrics, name string) []string {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			var ls []string
			for _, l := range s.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			out = append(out, strings.Join(ls, ","))
		}
	}
	return out
}

// TestGaugeRegisteredTwice: a second registration of a name and labels
// (a manifest reload asking again) keeps the first, without a panic.
func TestGaugeRegisteredTwice(t *testing.T) {
	m := New()
	m.Gauge("physd_test_up", "Test.", map[string]string{"bus": "a"}, func() float64 { return 1 })
	m.Gauge("physd_test_up", "Test.", map[string]string{"bus": "a"}, func() float64 { return 2 })
	m.Gauge("physd_test_up", "Test.", map[string]string{"bus": "b"}, func() float64 { return 3 })
	if got := series(t, m, "physd_test_up"); len(got) != 2 {
		t.Fatalf("series %v, want one for bus a and one for bus b", got)
	}
}

// TestGaugeSetFollowsItsList: a GaugeSet's series are those its list
// gives at each scrape: added and removed without registering again.
func TestGaugeSetFollowsItsList(t *testing.T) {
	m := New()
	buses := []string{"a"}
	for range 2 {
		m.GaugeSet("physd_test_bus_up", "Test.", []string{"bus"}, func(emit func(float64, ...string)) {
			for _, b := range buses {
				emit(1, b)
			}
		})
	}
	if got := series(t, m, "physd_test_bus_up"); len(got) != 1 || got[0] != "bus=a" {
		t.Fatalf("series %v, want bus a", got)
	}
	buses = []string{"b", "c"}
	if got := series(t, m, "physd_test_bus_up"); len(got) != 2 || got[0] != "bus=b" || got[1] != "bus=c" {
		t.Fatalf("series %v, want buses b and c", got)
	}
}
