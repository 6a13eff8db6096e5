package history_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/history"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// siteOf is a manifest of n float read capabilities p0000 … .
func siteOf(t testing.TB, n int) *manifest.Manifest {
	t.Helper()
	var sb strings.Builder
	sb.WriteString("physmcp_version: \"0.1\"\ndevice: {id: d, type: plant, location: {zone: z}}\nnetwork: {protocols: [{type: ip}], mesh: {enabled: false}}\nbuses: {plant: {type: sim}}\ncapabilities:\n")
	for i := range n {
		fmt.Fprintf(&sb, "  - {name: p%04d, kind: read, description: d, binding: {type: sim, bus: plant, point: zone_a.temperature}, data_type: float, semantic_tags: [t]}\n", i)
	}
	m, err := manifest.Parse("s.yml", []byte(sb.String()))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestPlantWithinSizeBound: 300 capabilities observed every 20 s for 3
// hours under a 2 MiB bound (retention starts after about an hour): the
// file stays within the bound after every flush, measured on disk; every
// capability keeps the same window of newest minutes, each minute once,
// and the size bound is used rather than wasted (the kept buckets' own
// bytes fill more than half of it); a flush writes about two buckets a
// capability; Stats counts what queries return, and Sealed hands out
// each capability's buckets in order.
func TestPlantWithinSizeBound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const caps, bound, hours = 300, 2 << 20, 3
		m := siteOf(t, caps)
		path := filepath.Join(t.TempDir(), history.FileName)
		h, err := history.Open(path, m, history.Config{MaxBytes: bound})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		t0 := time.Now()
		largest := int64(0)
		for min := range hours * 60 {
			for s := 0; s < 60; s += 20 {
				at := t0.Add(time.Duration(min)*time.Minute + time.Duration(s)*time.Second)
				for i, c := range m.Capabilities {
					h.Record(node.Observed{Cap: c, At: at, Obs: promcp.Observation{Quality: promcp.QualityGood, Value: float64(i*10000 + min)}})
				}
			}
			time.Sleep(time.Minute)
			largest = max(largest, flushWithin(t, h, path, bound))
		}
		// A flush appends the newest minute and rewrites the one before
		// (written while it was open): about two buckets a capability,
		// not a page a capability as a bbolt bucket per capability was.
		if perFlush := h.Stats().Written / (hours * 60); perFlush > 2*caps*100+16*4096 {
			t.Errorf("a flush wrote %d bytes, want at most %d: two buckets of ~100 bytes a capability and a few branch pages", perFlush, 2*caps*100+16*4096)
		}
		end := t0.Add(hours * time.Hour)
		total, oldest := 0, map[time.Time]int{}
		for i, c := range m.Capabilities {
			s, err := h.Query(c.Name, t0, end, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			n := len(s.Buckets)
			if n == 0 || !s.Buckets[n-1].Start.Equal(end.Add(-time.Minute)) || f(s.Buckets[n-1].Last) != float64(i*10000+hours*60-1) {
				t.Fatalf("%s: newest bucket not kept: %d buckets", c.Name, n)
			}
			for j, b := range s.Buckets {
				if !b.Start.Equal(s.Buckets[0].Start.Add(time.Duration(j)*time.Minute)) || b.Count != 3 {
					t.Fatalf("%s: bucket %d = %v with %d observations: want consecutive minutes of 3", c.Name, j, b.Start, b.Count)
				}
			}
			total += n
			oldest[s.Buckets[0].Start]++
			sealed, err := h.Sealed(c.Name, 0, 1000)
			if err != nil || len(sealed) != n-1 || sealed[0].Start != s.Buckets[0].Start.Unix() || sealed[n-2].Start != end.Add(-2*time.Minute).Unix() {
				t.Fatalf("%s: Sealed gave %d buckets (%v), want the %d before the open one", c.Name, len(sealed), err, n-1)
			}
		}
		if len(oldest) > 2 {
			t.Errorf("the capabilities' oldest kept minutes differ by more than one: %v", oldest)
		}
		if st := h.Stats(); st.Buckets != total {
			t.Errorf("Stats counts %d buckets, the queries returned %d", st.Buckets, total)
		}
		kept := float64(total) / caps
		// A stored bucket is at least its bbolt leaf element: a 16-byte
		// header, an 8 + 5-byte key and the 52-byte record.
		if used := float64(total) * (16 + 13 + 52); used < bound/2 || kept >= hours*60 {
			t.Errorf("kept %.0f minutes a capability (%.0f bytes of records in a %d-byte bound): want more than half the bound used, and retention to have started", kept, used, bound)
		}
		t.Logf("%d capabilities, %d h at 3 observations a minute: largest file %d bytes (bound %d); each keeps %.0f minutes", caps, hours, largest, bound, kept)
	})
}
