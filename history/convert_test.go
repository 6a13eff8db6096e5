package history_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/history"
	"github.com/physd/physd/manifest"
)

// goneSensor is the capability testdata/history-v1.db holds that the
// plant manifest does not declare.
const goneSensor = `  - name: gone_sensor
    kind: read
    description: A sensor a later manifest removes.
    binding: {type: sim, bus: plant, point: zone_a.temperature}
    data_type: int
    semantic_tags: [temperature]
`

// v1File is a copy of testdata/history-v1.db in a fresh directory.
func v1File(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("testdata/history-v1.db")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), history.FileName)
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestConvertEarlierLayout: testdata/history-v1.db was written by the
// earlier layout (a bbolt bucket per capability; history at 459483b),
// with the plant manifest plus gone_sensor, in a synctest bubble from its
// epoch (2000-01-01 00:00 UTC): for 30 minutes, capability i (in
// manifest order) observed i*1000 + minute*10 + s/10 at seconds s = 0,
// 10 … 50, the one at 50 s stale in every third minute; a flush every
// minute, then Close. Open converts it (a leftover of an interrupted
// conversion beside it is replaced): every bucket is served as before,
// Sealed hands them all out in order, the capability the manifest no
// longer declares keeps its buckets and is served again once declared,
// and a second Open finds nothing to convert.
func TestConvertEarlierLayout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, err := manifest.Parse("h.yml", []byte(plant))
		if err != nil {
			t.Fatal(err)
		}
		withGone, err := manifest.Parse("h.yml", []byte(plant+goneSensor))
		if err != nil {
			t.Fatal(err)
		}
		path := v1File(t)
		if err := os.WriteFile(path+".convert", []byte("half a file"), 0o600); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now() // the fixture's epoch
		time.Sleep(40 * time.Minute)

		check := func(when string, h *history.History, names ...string) {
			t.Helper()
			for _, name := range names {
				idx := map[string]int{"heater_zone_a": 0, "heater_power_zone_a": 1, "gone_sensor": 2}[name] // in the fixture's manifest
				s, err := h.Query(name, t0, t0.Add(time.Hour), time.Minute)
				if err != nil {
					t.Fatalf("%s: %s: %v", when, name, err)
				}
				if len(s.Buckets) != 30 {
					t.Fatalf("%s: %s: %d buckets, want 30", when, name, len(s.Buckets))
				}
				sealed, err := h.Sealed(name, 0, 100)
				if err != nil || len(sealed) != 30 {
					t.Fatalf("%s: %s: Sealed gave %d buckets (%v), want 30", when, name, len(sealed), err)
				}
				for min, b := range s.Buckets {
					base := float64(idx*1000 + min*10)
					wantMax, wantMean, wantGood := base+5, base+2.5, 1.0
					if min%3 == 0 {
						wantMax, wantMean, wantGood = base+4, base+2, 5.0/6
					}
					if !b.Start.Equal(t0.Add(time.Duration(min)*time.Minute)) || b.Count != 6 || f(b.Min) != base || f(b.Max) != wantMax ||
						f(b.Mean) != wantMean || f(b.Last) != wantMax || b.GoodShare != wantGood {
						t.Errorf("%s: %s minute %d = {start %v count %d min %v max %v mean %v last %v good %v}, want count 6 min %v max %v mean %v good %v",
							when, name, min, b.Start, b.Count, f(b.Min), f(b.Max), f(b.Mean), f(b.Last), b.GoodShare, base, wantMax, wantMean, wantGood)
					}
					if sealed[min].Start != b.Start.Unix() || sealed[min].Count != 6 {
						t.Errorf("%s: %s: sealed %d = %+v, want minute %d", when, name, min, sealed[min], min)
					}
				}
			}
		}

		h, err := history.Open(path, m, history.Config{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(path + ".convert"); !os.IsNotExist(err) {
			t.Errorf("the conversion's file is left beside history.db: %v", err)
		}
		if n := h.Stats().Buckets; n != 90 {
			t.Errorf("converted: %d buckets stored, want 90 (3 capabilities × 30 minutes)", n)
		}
		check("converted", h, "heater_zone_a", "heater_power_zone_a")
		if _, err := h.Query("gone_sensor", t0, t0.Add(time.Hour), time.Minute); err == nil {
			t.Error("gone_sensor, which the manifest does not declare, is served")
		}
		h.Reload(withGone)
		check("declared again", h, "gone_sensor")
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}

		h, err = history.Open(path, withGone, history.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		check("opened again", h, "heater_zone_a", "heater_power_zone_a", "gone_sensor")
	})
}

// TestConvertDropsOnlyWhatMaxAgeDrops: a conversion under a MaxAge that
// covers the fixture's last 10 minutes keeps exactly those.
func TestConvertDropsOnlyWhatMaxAgeDrops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, err := manifest.Parse("h.yml", []byte(plant))
		if err != nil {
			t.Fatal(err)
		}
		path := v1File(t)
		t0 := time.Now()
		time.Sleep(40 * time.Minute)
		h, err := history.Open(path, m, history.Config{MaxAge: 20 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		s, err := h.Query("heater_power_zone_a", t0, t0.Add(time.Hour), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Buckets) != 10 || !s.Buckets[0].Start.Equal(t0.Add(20*time.Minute)) {
			t.Fatalf("kept %d buckets from %v, want 10 from minute 20", len(s.Buckets), fmt.Sprint(s.Buckets[0].Start))
		}
		if n := h.Stats().Buckets; n != 30 {
			t.Errorf("%d buckets stored, want 30 (3 capabilities × 10 minutes)", n)
		}
	})
}
