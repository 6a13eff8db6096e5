package daemon

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/physd/physd/history"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
)

// openHistory opens the state directory's history.db and starts its writer
// on the node's observation stream (nil with --history-max-mb 0), and
// exports the stream's and the history's counters.
func openHistory(f Config, n *node.Node, mx *metrics.Metrics, log *slog.Logger) (*history.History, error) {
	mx.Gauge("physd_observations_dropped", "Observations a subscriber of the observation stream (history, MCP resource updates) missed because it was behind.", nil,
		func() float64 { return float64(n.ObservationsDropped()) })
	if f.HistoryMaxMB < 0 {
		return nil, fmt.Errorf("--history-max-mb %d: use a size in MiB, or 0 to turn history off", f.HistoryMaxMB)
	}
	if f.HistoryMaxMB == 0 {
		if f.Fleet == nil { // the fleet endpoint has no capability of its own to record
			log.Info("history off (--history-max-mb 0)")
		}
		return nil, nil
	}
	cfg := history.Default()
	cfg.MaxAge, cfg.MaxBytes = f.HistoryMaxAge, int64(f.HistoryMaxMB)<<20
	h, err := history.Open(filepath.Join(f.StateDir, history.FileName), n.Manifest(), cfg)
	if err != nil {
		return nil, err
	}
	h.Follow(n)
	mx.Gauge("physd_history_bytes", "Size of history.db.", nil, func() float64 { return float64(h.Stats().FileBytes) })
	mx.Gauge("physd_history_buckets", "Buckets stored in history.db (one per capability and resolution step), as of the last flush.", nil,
		func() float64 { return float64(h.Stats().Buckets) })
	mx.Gauge("physd_history_write_errors", "History flushes that failed (the buckets stay in memory until the next one succeeds).", nil,
		func() float64 { return float64(h.Stats().WriteErrors) })
	return h, nil
}
