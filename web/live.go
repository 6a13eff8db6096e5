package web

import (
	"context"
	"sync"
	"time"

	"github.com/physd/physd/manifest"
)

// Live values. The node's cache only holds what someone read, so a
// console that showed the cache alone would say "unread" for every
// capability nobody polls. /console/live therefore reads, through the
// node's normal read path (cache TTL, single flight, the capability's
// timeout), each capability whose cached value is older than the
// console's floor — but never one the node polls itself (poll_ms keeps
// its cache fresh), and never more often than once per floor per
// capability however many consoles are open, with a doubling back-off
// for a device that fails: the console must not become the plant's
// heaviest reader.

const (
	// liveFloor is the least time between two console reads of one
	// capability (and the page's poll interval).
	liveFloor = time.Second
	// liveMaxBackoff bounds the back-off after failed reads.
	liveMaxBackoff = 30 * time.Second
	// liveReadTimeout bounds the reads of one /console/live.
	liveReadTimeout = 2 * time.Second
)

// liveReads is when each capability may next be read for the console.
type liveReads struct {
	mu      sync.Mutex
	next    map[string]time.Time
	backoff map[string]time.Duration
}

// take reserves the next console read of tool at now, or reports that
// it is not due.
func (l *liveReads) take(tool string, now time.Time, gap time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.next == nil {
		l.next, l.backoff = map[string]time.Time{}, map[string]time.Duration{}
	}
	if now.Before(l.next[tool]) {
		return false
	}
	l.next[tool] = now.Add(max(gap, l.backoff[tool]))
	return true
}

// done records the outcome of a console read: a failure doubles the gap.
func (l *liveReads) done(tool string, now time.Time, gap time.Duration, failed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !failed {
		delete(l.backoff, tool)
		return
	}
	b := min(max(2*l.backoff[tool], 2*gap), liveMaxBackoff)
	l.backoff[tool], l.next[tool] = b, now.Add(b)
}

// readGap is how often the console may read c: its cache TTL, at least
// liveFloor.
func readGap(c *manifest.Capability) time.Duration { return max(c.CacheTTL(), liveFloor) }

// staleAfter is the age past which the console shows tool's value as
// stale (amber): manifest.Capability.StaleAfter, the rule the fleet
// endpoint applies too.
func (s *Server) staleAfter(tool string) time.Duration {
	c := s.n.Manifest().Capability(manifestName(tool))
	if c == nil {
		return manifest.MinStaleAfter
	}
	return c.StaleAfter()
}

// refreshValues reads the capabilities that are due (see above), in
// parallel, bounded by liveReadTimeout.
func (s *Server) refreshValues(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, liveReadTimeout)
	defer cancel()
	now := time.Now()
	var wg sync.WaitGroup
	for _, st := range s.n.Capabilities() {
		c := s.n.Manifest().Capability(manifestName(st.Tool))
		if c == nil || c.PollInterval() > 0 {
			continue
		}
		gap := readGap(c)
		if !st.Timestamp.IsZero() && now.Sub(st.Timestamp) < gap {
			continue
		}
		if !s.live.take(st.Tool, now, gap) {
			continue
		}
		wg.Go(func() {
			o, err := s.n.Read(ctx, st.Tool, -1)
			s.live.done(st.Tool, time.Now(), gap, err != nil || o.Quality == "error")
		})
	}
	wg.Wait()
}
