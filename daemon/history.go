package daemon

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

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
	warnHistoryRetention(h, f, log)
	h.Follow(n)
	mx.Gauge("physd_history_bytes", "Size of history.db.", nil, func() float64 { return float64(h.Stats().FileBytes) })
	mx.Gauge("physd_history_buckets", "Buckets stored in history.db (one per capability and resolution step), as of the last flush.", nil,
		func() float64 { return float64(h.Stats().Buckets) })
	mx.Gauge("physd_history_written_bytes", "Bytes the history's flushes wrote to history.db since start (its pages and a meta page each).", nil,
		func() float64 { return float64(h.Stats().Written) })
	mx.Gauge("physd_history_write_errors", "History flushes that failed (the buckets stay in memory until the next one succeeds).", nil,
		func() float64 { return float64(h.Stats().WriteErrors) })
	return h, nil
}

// warnHistoryRetention warns once, at start, when --history-max-mb keeps
// less than --history-max-age of the capabilities recorded: a plant's
// operator learns it from the log, not from a chart that ends too soon.
func warnHistoryRetention(h *history.History, f Config, log *slog.Logger) {
	keeps, need := h.Retention()
	if keeps >= h.Config().MaxAge {
		return
	}
	needMB := (need + 1<<20 - 1) >> 20
	log.Warn(fmt.Sprintf("history: --history-max-mb %d keeps about %v of each of the %d capabilities recorded, less than --history-max-age %v; --history-max-mb %d keeps all of it",
		f.HistoryMaxMB, keeps.Round(time.Minute), len(h.Recorded()), h.Config().MaxAge, needMB),
		"keeps", keeps.Round(time.Minute).String(), "history_max_mb_for_max_age", needMB)
}
