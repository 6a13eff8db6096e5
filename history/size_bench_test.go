package history_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/history"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// storageWritten is what this process has had written to storage so far
// (write_bytes of /proc/self/io: the pages bbolt wrote and synced, as the
// kernel accounts them to the process; 0 where it is not available).
func storageWritten(b *testing.B) int64 {
	raw, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatalf("/proc/self/io: %v", err)
			}
			return n
		}
	}
	return 0
}

// BenchmarkStoredBytes measures what history.db holds per stored bucket
// (the file's size over the buckets in it) for a site of 2 000
// capabilities, an hour of 1-minute buckets flushed as the daemon does
// (once a minute), and then a day under a size bound (retention pruning
// the oldest): bytes/bucket, bytes/point/day at the default 1-minute
// resolution, and the storage bytes a flush writes. It is the figure
// behind "history" in docs/performance.md: the file never grows past
// --history-max-mb.
//
//	go test -run '^$' -bench StoredBytes -benchtime 1x ./history
func BenchmarkStoredBytes(b *testing.B) {
	const caps = 2000
	m := siteOf(b, caps)
	for b.Loop() {
		for _, run := range []struct {
			name    string
			minutes int
			bound   int64
		}{{"unbounded hour", 60, 1 << 30}, {"bounded day", 1440, 64 << 20}} {
			path := filepath.Join(b.TempDir(), history.FileName)
			h, err := history.Open(path, m, history.Config{MaxBytes: run.bound, MaxAge: 30 * 24 * time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			// Stamped from the next minute on: buckets before Open are
			// sealed (a restart never rewrites them), and a bucket
			// whose time has not come yet is written as it grows.
			t0 := time.Now().Truncate(time.Minute).Add(time.Minute)
			written0 := storageWritten(b)
			for min := range run.minutes {
				for s := 0; s < 60; s += 10 {
					at := t0.Add(time.Duration(min)*time.Minute + time.Duration(s)*time.Second)
					for i, c := range m.Capabilities {
						h.Record(node.Observed{Cap: c, At: at, Obs: promcp.Observation{Quality: promcp.QualityGood, Value: float64(i + min + s)}})
					}
				}
				h.Flush()
			}
			h.Flush()
			perFlush := float64(storageWritten(b)-written0) / float64(run.minutes+1)
			keeps, forMaxAge := h.Retention()
			if err := h.Close(); err != nil {
				b.Fatal(err)
			}
			buckets := h.Stats().Buckets // the last minute too, which Close wrote
			fi, err := os.Stat(path)
			if err != nil {
				b.Fatal(err)
			}
			per := float64(fi.Size()) / float64(buckets)
			b.Logf("%s: %d capabilities, %d buckets stored, file %.1f MiB (bound %d MiB): %.0f bytes/bucket, %.0f KiB/point/day at 1-minute buckets; each keeps %.0f min; storage writes %.0f KiB/flush (%.0f MiB/day)",
				run.name, caps, buckets, float64(fi.Size())/(1<<20), run.bound>>20, per, per*1440/1024, float64(buckets)/caps, perFlush/1024, perFlush*1440/(1<<20))
			b.Logf("%s: Retention figures the bound keeps %v of each, and %.0f MiB keeps MaxAge (30 days)", run.name, keeps, float64(forMaxAge)/(1<<20))
			if run.minutes == 60 {
				b.ReportMetric(per, "bytes/bucket")
			} else {
				b.ReportMetric(float64(buckets)/caps, "minutes-kept/64MiB")
				b.ReportMetric(perFlush, "written-bytes/flush")
			}
		}
	}
}
