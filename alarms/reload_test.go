package alarms_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// TestEngineReload: a reload keeps the state of an unchanged alarm, clears
// a raised alarm it redefines or removes (saying why), and evaluates the
// new definition from then on.
func TestEngineReload(t *testing.T) {
	parse := func(alarm string) *manifest.Manifest {
		src := strings.Replace(plant, "alarms: {high: 50, hysteresis: 5, for_ms: 3000, quality: [stale, error], stale_s: 5}", alarm, 1)
		m, err := manifest.Parse("a.yml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := parse("alarms: {high: 50}")
	e := alarms.New(m)
	var got []string
	e.OnEvent(func(ev alarms.Event) { got = append(got, ev.Kind+" "+ev.State+": "+ev.Message) })
	observe := func(m *manifest.Manifest, v float64) []alarms.Event {
		return e.Observe(node.Observed{Cap: m.Capability("heater_power_zone_a"), At: time.Now(),
			Obs: promcp.Observation{Value: v, Quality: promcp.QualityGood}})
	}
	if evs := observe(m, 60); len(evs) != 1 || evs[0].State != "raised" {
		t.Fatalf("60 above 50: %v", evs)
	}
	e.Reload(parse("alarms: {high: 50}")) // the same alarm, parsed again
	if !e.IsActive("read_heater_power_zone_a", "high") || len(got) != 0 {
		t.Errorf("an unchanged alarm lost its state: active=%v events %v", e.IsActive("read_heater_power_zone_a", "high"), got)
	}
	m2 := parse("alarms: {high: 70}")
	e.Reload(m2)
	if e.IsActive("read_heater_power_zone_a", "high") || fmt.Sprint(got) != "[high cleared: the manifest reload changed this alarm]" {
		t.Errorf("a redefined alarm: active=%v events %v", e.IsActive("read_heater_power_zone_a", "high"), got)
	}
	if evs := observe(m2, 60); len(evs) != 0 {
		t.Errorf("60 under the new limit 70: %v", evs)
	}
	if evs := observe(m2, 80); len(evs) != 1 {
		t.Errorf("80 above the new limit 70: %v", evs)
	}
	got = nil
	m3 := parse("deadband: 1")
	e.Reload(m3)
	if len(e.Active()) != 0 || fmt.Sprint(got) != "[high cleared: the manifest reload removed this alarm]" {
		t.Errorf("removed: active %v, events %v", e.Active(), got)
	}
	if evs := observe(m3, 90); len(evs) != 0 {
		t.Errorf("an alarm the reload removed: %v", evs)
	}
}
