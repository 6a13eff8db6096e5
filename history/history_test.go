package history_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/audit"
	_ "github.com/physd/physd/drivers/sim" // registers sim
	"github.com/physd/physd/history"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

const plant = `physmcp_version: "0.1"
device: {id: hist_node, type: greenhouse_controller, location: {zone: zone_a}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  plant:
    type: sim
    zones:
      zone_a: {ambient_c: 12, initial_c: 18}
capabilities:
  - name: heater_zone_a
    kind: do
    description: Heater power in zone A.
    binding: {type: sim, bus: plant, point: zone_a.heater}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [heater]
  - name: heater_power_zone_a
    kind: read
    description: Heater power in zone A as the controller reports it.
    binding: {type: sim, bus: plant, point: zone_a.heater}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [heater, power]
    poll_ms: 1000
`

type rig struct {
	m   *manifest.Manifest
	n   *node.Node
	st  *store.Store
	al  *audit.Log
	dir string
}

func openNode(t *testing.T, dir string) *rig {
	t.Helper()
	m, err := manifest.Parse("h.yml", []byte(plant))
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(filepath.Join(dir, "audit"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
	if err != nil {
		t.Fatal(err)
	}
	return &rig{m: m, n: n, st: st, al: al, dir: dir}
}

func (r *rig) close() {
	r.n.Close(context.Background())
	r.al.Close()
	r.st.Close()
}

func (r *rig) set(t *testing.T, v float64, key string) {
	t.Helper()
	raw, _ := json.Marshal(v)
	body, err := r.n.Do(context.Background(), node.DoRequest{Tool: "do_heater_zone_a", Value: raw, IdempotencyKey: key, Caller: node.Caller{ID: "t"}})
	if err != nil || !json.Valid(body) {
		t.Fatalf("do: %v %s", err, body)
	}
}

func f(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// TestKnownSignalBucketsSurviveRestart: a polled point set to known values
// gives 1-minute buckets with the right min, max, mean, count and last;
// 2-minute steps combine them; after a restart (node and history closed
// and reopened on the same state directory) the buckets are all there,
// and a bucket the restart cut in two is whole.
func TestKnownSignalBucketsSurviveRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		r := openNode(t, dir)
		path := filepath.Join(dir, history.FileName)
		h, err := history.Open(path, r.m, history.Config{})
		if err != nil {
			t.Fatal(err)
		}
		h.Follow(r.n)
		t0 := time.Now() // synctest's epoch: 2000-01-01 00:00:00 UTC, a whole minute
		// Polls at t0+1s, +2s …; minute 0 has polls 1..59, minute 1 60..119.
		r.set(t, 10, "a")
		time.Sleep(30500 * time.Millisecond)
		r.set(t, 50, "b") // polls 31..59 read 50
		time.Sleep(59 * time.Second)
		r.set(t, 20, "c")            // at 89.5 s: polls 90..119 read 20; 60..89 read 50
		time.Sleep(40 * time.Second) // to 129.5 s; minute 2 polls 120..129 read 20
		synctest.Wait()

		want := []struct {
			min, max, mean, last float64
			count                uint32
		}{
			{10, 50, (30*10 + 29*50) / 59.0, 50, 59},
			{20, 50, (30*50 + 30*20) / 60.0, 20, 60},
			{20, 20, 20, 20, 10},
		}
		check := func(when string, h *history.History) {
			t.Helper()
			s, err := h.Query("heater_power_zone_a", t0, t0.Add(3*time.Minute), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Buckets) != len(want) {
				t.Fatalf("%s: %d buckets, want %d: %+v", when, len(s.Buckets), len(want), s.Buckets)
			}
			for i, w := range want {
				b := s.Buckets[i]
				if !b.Start.Equal(t0.Add(time.Duration(i)*time.Minute)) || f(b.Min) != w.min || f(b.Max) != w.max ||
					math.Abs(f(b.Mean)-w.mean) > 1e-9 || f(b.Last) != w.last || b.Count != w.count || b.GoodShare != 1 {
					t.Errorf("%s: minute %d = {start %v min %v max %v mean %v last %v count %d good %v}, want %+v", when, i,
						b.Start, f(b.Min), f(b.Max), f(b.Mean), f(b.Last), b.Count, b.GoodShare, w)
				}
			}
			s2, err := h.Query("heater_power_zone_a", t0, t0.Add(4*time.Minute), 2*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if len(s2.Buckets) != 2 || f(s2.Buckets[0].Min) != 10 || f(s2.Buckets[0].Max) != 50 || s2.Buckets[0].Count != 119 ||
				math.Abs(f(s2.Buckets[0].Mean)-(30*10+59*50+30*20)/119.0) > 1e-9 {
				t.Errorf("%s: 2-minute steps = %+v", when, s2.Buckets)
			}
		}
		check("before restart (in memory)", h)
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
		r.close()

		r = openNode(t, dir)
		defer r.close()
		h, err = history.Open(path, r.m, history.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		check("after restart", h)
		// Minute 2 continues after the restart: its first 10 polls and
		// the next ones make one bucket.
		h.Follow(r.n)
		time.Sleep(20 * time.Second) // polls at 130.5 … 149.5 s (the new node's ticker)
		synctest.Wait()
		s, err := h.Query("heater_power_zone_a", t0.Add(2*time.Minute), t0.Add(3*time.Minute), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Buckets) != 1 || s.Buckets[0].Count != 30 {
			t.Fatalf("minute 2 across the restart: %+v, want 30 observations", s.Buckets)
		}
	})
}

// TestDayWithinSizeBound: a day of 1 s observations of four capabilities
// keeps the file within MaxBytes at every flush, keeps the newest buckets
// and drops the oldest; nothing is dropped from the stream.
func TestDayWithinSizeBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		text := plant
		for i := range 3 {
			text += fmt.Sprintf(`  - name: t%d
    kind: read
    description: A temperature.
    binding: {type: sim, bus: plant, point: zone_a.temperature}
    data_type: float
    semantic_tags: [temperature]
`, i)
		}
		m, err := manifest.Parse("h.yml", []byte(text))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), history.FileName)
		const bound = 256 << 10
		h, err := history.Open(path, m, history.Config{MaxBytes: bound})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		var caps []*manifest.Capability
		for _, c := range m.Capabilities {
			if c.Kind == manifest.KindRead {
				caps = append(caps, c)
			}
		}
		t0 := time.Now()
		largest := int64(0)
		for sec := 0; sec < 86400; sec++ {
			at := t0.Add(time.Duration(sec) * time.Second)
			for _, c := range caps {
				h.Record(node.Observed{Cap: c, At: at, Obs: promcp.Observation{Quality: promcp.QualityGood, Value: float64(sec % 600)}})
			}
			if sec%60 == 59 {
				time.Sleep(time.Minute)
				largest = max(largest, flushWithin(t, h, path, bound))
			}
		}
		s, err := h.Query("t0", t0, t0.Add(24*time.Hour), 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		first, last := s.Buckets[0], s.Buckets[len(s.Buckets)-1]
		if !last.Start.Equal(t0.Add(24*time.Hour-10*time.Minute)) || f(last.Max) != 599 || first.Start.Equal(t0) {
			t.Fatalf("kept %v … %v: want the newest kept and the oldest dropped", first.Start, last.Start)
		}
		t.Logf("a day of 1 s observations of %d capabilities: largest file %d bytes (bound %d); oldest bucket kept %v", len(caps), largest, bound, first.Start.Sub(t0))
	})
}

// flushWithin flushes h and fails the test unless its file at path is
// within bound, as on disk and as Stats reports it; it returns the size.
func flushWithin(t *testing.T, h *history.History, path string, bound int64) int64 {
	t.Helper()
	h.Flush()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > bound {
		t.Fatalf("at %v: file %d bytes > bound %d", time.Now().UTC(), fi.Size(), bound)
	}
	if st := h.Stats(); st.LastError != nil || st.FileBytes != fi.Size() {
		t.Fatalf("at %v: stats %+v, file %d bytes", time.Now().UTC(), st, fi.Size())
	}
	return fi.Size()
}

// TestQueryErrors: a bad step or window names the parameter and the fix.
func TestQueryErrors(t *testing.T) {
	m, _ := manifest.Parse("h.yml", []byte(plant))
	h, err := history.Open(filepath.Join(t.TempDir(), history.FileName), m, history.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	now := time.Now()
	for _, tc := range []struct {
		name         string
		since, until time.Time
		step         time.Duration
		want         string
	}{
		{"heater_power_zone_a", now.Add(-time.Hour), now, 90 * time.Second, "step: 1m30s is not a multiple of the history's resolution 1m0s; fix: use step=1m0s"},
		{"heater_power_zone_a", now, now.Add(-time.Hour), time.Minute, "since: must be before until"},
		{"heater_power_zone_a", now.Add(-30 * 24 * time.Hour), now, time.Minute, "more than 2000 in one answer; fix: use a step of at least 22m0s"},
		{"nope", now.Add(-time.Hour), now, time.Minute, `no history of "nope"`},
	} {
		_, err := h.Query(tc.name, tc.since, tc.until, tc.step)
		if err == nil || !contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestReloadChangesRecordedCapabilities: a capability a reload adds is
// recorded from then on and its buckets reach the file; one a reload
// removes is no longer recorded nor served, but its stored buckets stay
// until retention drops them, and are served again if a reload declares
// it again.
func TestReloadChangesRecordedCapabilities(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		without, err := manifest.Parse("h.yml", []byte(plant))
		if err != nil {
			t.Fatal(err)
		}
		with, err := manifest.Parse("h.yml", []byte(plant+`  - name: soil_moisture
    kind: read
    description: Soil moisture.
    binding: {type: sim, bus: plant, point: zone_a.temperature}
    data_type: float
    unit: percent
    semantic_tags: [moisture]
`))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), history.FileName)
		h, err := history.Open(path, without, history.Config{MaxAge: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		soil := with.Capability("soil_moisture")
		t0 := time.Now()
		obs := func(min int, v float64) {
			h.Record(node.Observed{Cap: soil, At: t0.Add(time.Duration(min) * time.Minute), Obs: promcp.Observation{Quality: promcp.QualityGood, Value: v}})
		}
		buckets := func(h *history.History) ([]history.Bucket, error) {
			s, err := h.Query("soil_moisture", t0, t0.Add(2*time.Hour), time.Minute)
			if err != nil {
				return nil, err
			}
			return s.Buckets, nil
		}
		obs(0, 30)
		if _, err := buckets(h); err == nil {
			t.Fatal("a capability the manifest does not declare has history")
		}

		h.Reload(with)
		obs(1, 31)
		obs(2, 32)
		time.Sleep(3 * time.Minute)
		h.Flush()
		if b, err := buckets(h); err != nil || len(b) != 2 || f(b[0].Last) != 31 || f(b[1].Last) != 32 {
			t.Fatalf("after the reload that added it: %+v, %v; want minutes 1 and 2", b, err)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}
		if h, err = history.Open(path, with, history.Config{MaxAge: time.Hour}); err != nil {
			t.Fatal(err)
		}
		defer func() { h.Close() }()
		if b, err := buckets(h); err != nil || len(b) != 2 {
			t.Fatalf("after a restart: %+v, %v; want the 2 buckets the flush wrote", b, err)
		}

		h.Reload(without)
		obs(3, 33)
		if _, err := buckets(h); err == nil {
			t.Fatal("a capability the reload removed is still served")
		}
		h.Reload(with)
		if b, err := buckets(h); err != nil || len(b) != 2 {
			t.Fatalf("declared again: %+v, %v; want the 2 stored buckets back (and nothing recorded meanwhile)", b, err)
		}

		// Removed again, then retention (MaxAge 1 h) drops its buckets.
		h.Reload(without)
		time.Sleep(2 * time.Hour)
		h.Flush()
		h.Reload(with)
		if b, err := buckets(h); err != nil || len(b) != 0 {
			t.Fatalf("after retention: %+v, %v; want none", b, err)
		}
	})
}

// TestSealed: a bucket is handed out by Sealed once it is final on disk:
// when a later bucket started, or when it ended SealGrace before a flush;
// an observation stamped inside a sealed bucket that arrives late counts
// in the next one, never changing what was handed out; after a restart
// the buckets an earlier run wrote that ended SealGrace ago are final.
func TestSealed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, err := manifest.Parse("h.yml", []byte(plant))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), history.FileName)
		h, err := history.Open(path, m, history.Config{})
		if err != nil {
			t.Fatal(err)
		}
		c := m.Capability("heater_power_zone_a")
		t0 := time.Now() // a whole minute
		obs := func(at time.Duration, v float64) {
			h.Record(node.Observed{Cap: c, At: t0.Add(at), Obs: promcp.Observation{Quality: promcp.QualityGood, Value: v}})
		}
		starts := func(after int64) []int64 {
			t.Helper()
			got, err := h.Sealed(c.Name, after, 100)
			if err != nil {
				t.Fatal(err)
			}
			var out []int64
			for _, s := range got {
				out = append(out, (s.Start-t0.Unix())/60)
			}
			return out
		}
		flushed := 0
		h.OnFlush(func() { flushed++ })
		obs(10*time.Second, 1)
		obs(70*time.Second, 2)
		obs(130*time.Second, 3)
		time.Sleep(150 * time.Second)
		if got := starts(0); len(got) != 0 {
			t.Fatalf("before any flush: %v", got)
		}
		h.Flush()
		if got := fmt.Sprint(starts(t0.Unix() - 1)); got != "[0 1]" || flushed != 1 {
			t.Fatalf("after the flush at 2:30: minutes %s (flushes %d), want [0 1]: minute 2 is still open", got, flushed)
		}
		time.Sleep(30*time.Second + history.SealGrace) // 3:05: minute 2 ended SealGrace ago
		h.Flush()
		if got := fmt.Sprint(starts(t0.Unix() + 60)); got != "[2]" {
			t.Fatalf("after the flush at 3:05: minutes after 1: %s, want [2]", got)
		}
		obs(150*time.Second, 100) // late: stamped in minute 2
		time.Sleep(time.Minute)
		h.Flush()
		all, _ := h.Sealed(c.Name, 0, 100)
		if len(all) != 4 || all[2].Count != 1 || all[2].Max != 3 || all[3].Start != t0.Unix()+180 || all[3].Max != 100 {
			t.Fatalf("sealed after the late observation: %+v; want minute 2 untouched and the late value in minute 3", all)
		}
		if err := h.Close(); err != nil {
			t.Fatal(err)
		}

		// A restart: what is on disk and ended SealGrace ago is final.
		h, err = history.Open(path, m, history.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if got := fmt.Sprint(starts(0)); got != "[0 1 2 3]" {
			t.Fatalf("after a restart: %s", got)
		}
		obs(200*time.Second, 7) // stamped in sealed minute 3
		time.Sleep(2 * time.Minute)
		h.Flush()
		all, _ = h.Sealed(c.Name, 0, 100)
		if len(all) != 5 || all[3].Max != 100 || all[3].Count != 1 || all[4].Max != 7 {
			t.Fatalf("after a restart and an observation stamped in a sealed minute: %+v", all)
		}
		if got, _ := h.Sealed(c.Name, 0, 2); len(got) != 2 {
			t.Errorf("limit 2: %d buckets", len(got))
		}
	})
}

// TestFlushAsBucketSeals: the writer flushes SealGrace after each
// minute, as the last minute is sealed: Sealed hands it out seconds
// after its end, it is written once, final, and the minute just begun
// stays in memory (queries see it) until the next flush or Close.
func TestFlushAsBucketSeals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		r := openNode(t, dir)
		defer r.close()
		h, err := history.Open(filepath.Join(dir, history.FileName), r.m, history.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		h.Follow(r.n)
		t0 := time.Now() // a whole minute
		time.Sleep(3*time.Minute + history.SealGrace + time.Second)
		synctest.Wait()
		sealed, err := h.Sealed("heater_power_zone_a", 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		var got []int64
		for _, s := range sealed {
			got = append(got, (s.Start-t0.Unix())/60)
		}
		if fmt.Sprint(got) != "[0 1 2]" {
			t.Fatalf("6 s after minute 2 ended: sealed minutes %v, want [0 1 2]", got)
		}
		if n := h.Stats().Buckets; n != 3 {
			t.Errorf("%d buckets on disk, want 3: minute 3, begun 6 s ago, stays in memory", n)
		}
		s, err := h.Query("heater_power_zone_a", t0, t0.Add(4*time.Minute), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Buckets) != 4 || s.Buckets[3].Count < 5 {
			t.Fatalf("query: %+v, want minutes 0-3, the last from memory", s.Buckets)
		}
	})
}
