package daemon

import (
	"sync"
	"time"

	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
	"github.com/physd/physd/store"
)

// registerLedgerMetrics exports the idempotency ledger's size. Counting
// walks the ledger, so a scrape reuses a count up to 30 s old.
func registerLedgerMetrics(mx *metrics.Metrics, n *node.Node) {
	var (
		mu   sync.Mutex
		at   time.Time
		last store.LedgerStats
	)
	stats := func() store.LedgerStats {
		mu.Lock()
		defer mu.Unlock()
		if time.Since(at) > 30*time.Second {
			last, at = n.LedgerStats(), time.Now()
		}
		return last
	}
	mx.Gauge("physd_ledger_keys", "Completed idempotency keys held in the ledger.", nil, func() float64 { return float64(stats().Keys) })
	mx.Gauge("physd_ledger_pending", "Actuations under way (pending ledger entries).", nil, func() float64 { return float64(stats().Pending) })
	mx.Gauge("physd_ledger_bytes", "Bytes of the ledger's completed keys (records and index).", nil, func() float64 { return float64(stats().Bytes) })
	mx.Gauge("physd_state_db_file_bytes", "Size of physd.db on disk.", nil, func() float64 { return float64(stats().FileBytes) })
	mx.Gauge("physd_state_db_free_bytes", "Free pages inside physd.db (reused before the file grows; given back by compaction at start).", nil,
		func() float64 { return float64(stats().FreeBytes) })
}
