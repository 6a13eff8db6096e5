package daemon

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/metrics"
)

// TestHistoryRetentionWarning: at start, a --history-max-mb that keeps
// less than --history-max-age of the recorded capabilities is logged
// once, with how long it keeps and the --history-max-mb that keeps the
// whole age (which, given, is not warned about); a bound that keeps the
// age is not.
func TestHistoryRetentionWarning(t *testing.T) {
	var sb strings.Builder
	sb.WriteString("physmcp_version: \"0.1\"\ndevice: {id: d, type: plant, location: {zone: z}}\nnetwork: {protocols: [{type: ip}], mesh: {enabled: false}}\nbuses: {plant: {type: sim}}\ncapabilities:\n")
	for i := range 500 {
		fmt.Fprintf(&sb, "  - {name: p%04d, kind: read, description: d, binding: {type: sim, bus: plant, point: zone_a.temperature}, data_type: float, semantic_tags: [t]}\n", i)
	}
	m, err := manifest.Parse("m.yml", []byte(sb.String()))
	if err != nil {
		t.Fatal(err)
	}
	n := openTestNode(t, m)
	start := func(maxMB int) string {
		t.Helper()
		var out bytes.Buffer
		h, err := openHistory(Config{StateDir: t.TempDir(), HistoryMaxMB: maxMB, HistoryMaxAge: 7 * 24 * time.Hour}, n, metrics.New(), slog.New(slog.NewTextHandler(&out, nil)))
		if err != nil {
			t.Fatal(err)
		}
		h.Close()
		return out.String()
	}
	log := start(16)
	var keeps string
	var need int
	if i := strings.Index(log, "keeps about "); i < 0 || strings.Count(log, "level=WARN") != 1 {
		t.Fatalf("--history-max-mb 16, 500 capabilities, a week: log %q, want one warning", log)
	} else if _, err := fmt.Sscanf(log[i:], "keeps about %s of each of the 500 capabilities", &keeps); err != nil {
		t.Fatalf("log %q: %v", log, err)
	}
	if i := strings.Index(log, "; --history-max-mb "); i < 0 {
		t.Fatalf("log %q names no --history-max-mb for the whole age", log)
	} else if _, err := fmt.Sscanf(log[i:], "; --history-max-mb %d keeps all of it", &need); err != nil {
		t.Fatalf("log %q: %v", log, err)
	}
	d, err := time.ParseDuration(keeps)
	// A bucket of a 5-letter name is 81 bytes in a leaf, more than 82
	// with the page's header and branches: 16 MiB keeps 6 to 6.5 hours of
	// 500 capabilities, and a week, 5 040 000 buckets, needs 390 to 410
	// MiB.
	if err != nil || d < 6*time.Hour || d > 6*time.Hour+30*time.Minute || need < 390 || need > 410 {
		t.Fatalf("warning %q: keeps %v, %d MiB for the week; want 6 to 6.5 h and 390 to 410 MiB", log, d, need)
	}
	if log := start(need); strings.Contains(log, "level=WARN") {
		t.Errorf("--history-max-mb %d, the figure the warning gave: %q", need, log)
	}
}
