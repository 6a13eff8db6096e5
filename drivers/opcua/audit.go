package opcua

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"
	"github.com/physd/physd/drivers"
)

// The audit of a server's change reports. A monitored value is served as
// current while its subscription lives, on the word of the server's
// DataChangeFilter: every status change, and every value change beyond
// the deadband, is reported. A server that breaks that word
// (python-asyncua compares each sample with the previous sample rather
// than with the value it last reported, so a slow drift is never
// reported, and drops status-only changes under a deadband filter) would
// have physd serve a stale value, or a Bad one, as good for as long as
// the subscription lives. So every auditKeepAlives keep-alive periods the
// items a live subscription vouches for are read: at most maxItemsPerCall
// of them (and the server's MaxNodesPerRead) in one Read, those suspected
// first, then those read longest ago, so a site of N items reads each every
// ceil(N/1000) audits. Reading all of 10 000 items every 5 s was a tenth of
// physd's CPU (gopcua encodes and decodes by reflection) and kept the
// server's one thread (node-opcua) busy while do_ calls waited. An item
// whose server value differs from what the server last reported (another
// status, or a value beyond the deadband), and still does, unreported,
// once any change sampled before the first read must have been published,
// is given up: the node polls it (drivers.ErrNotMonitored), and says why.

// auditKeepAlives is how many keepalive_ms apart audits are.
const auditKeepAlives = 5

// audit reads the vouched items and gives up those the server holds
// changed without reporting it. Only a lost session is an error.
func (ms *monitorSet) audit(ctx context.Context, c *opcua.Client) error {
	ms.mu.Lock()
	var its []*item
	for _, it := range ms.items {
		if it.stopped || it.gaveUp || !it.vouched || it.sub == nil || !it.sub.live || it.reported == nil {
			continue
		}
		its = append(its, it)
	}
	its = auditTurn(its, ms.readBatch)
	reads := make([]*ua.ReadValueID, 0, len(its))
	kept := its[:0]
	for _, it := range its {
		nid, err := it.p.nodeID(c)
		if err != nil {
			continue
		}
		kept = append(kept, it)
		reads = append(reads, &ua.ReadValueID{NodeID: nid, AttributeID: ua.AttributeIDValue, IndexRange: it.p.indexRange()})
	}
	its = kept
	ms.mu.Unlock()
	if len(its) == 0 {
		return nil
	}
	rctx, cancel := ms.b.call(ctx)
	res, err := c.Read(rctx, &ua.ReadRequest{NodesToRead: reads, TimestampsToReturn: ua.TimestampsToReturnNeither})
	cancel()
	if err != nil || len(res.Results) != len(its) {
		if err != nil && sessionLost(err) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ua.StatusBadTimeout) {
			return err
		}
		// Refused as a whole, or slow: no audit this time (silence is
		// the keep-alive deadline's to judge, as for Publish).
		return nil
	}
	results := res.Results
	now := time.Now()
	ms.mu.Lock()
	var ds []delivery
	for i, it := range its {
		it.audited = now
		if it.stopped || it.gaveUp || !it.vouched || it.sub == nil || !it.sub.live {
			continue
		}
		dv := results[i]
		if !it.unreported(dv) {
			it.suspect = time.Time{}
			continue
		}
		// A change sampled before the read is published within a sampling
		// interval, a publishing interval and the keep-alive deadline.
		window := max(it.sub.deadline(ms.b.spec.Timeout), it.si+it.sub.pi+ms.b.spec.Timeout)
		switch {
		case it.suspect.IsZero() || it.suspectSeq != it.seq:
			it.suspect, it.suspectSeq = now, it.seq
			if due := now.Add(window); ms.recheck.IsZero() || due.Before(ms.recheck) {
				ms.recheck = due // read again then, not at the next audit
			}
		case now.Sub(it.suspect) > window:
			it.gaveUp = true
			ms.resync = true // its subscription may be left empty
			ds = append(ds, it.next(drivers.Update{Err: &unreportedError{bus: ms.b.spec.name, what: it.p.spec.what(),
				holds: describe(it, dv), reported: describe(it, it.reported), since: now.Sub(it.suspect)}}, false))
		}
	}
	ms.mu.Unlock()
	for _, d := range ds {
		ms.log.Warn("opcua: the server did not report a change of a monitored node; the capability is polled", "err", d.u.Err)
	}
	deliverAll(ds)
	return nil
}

// auditTurn is the items an audit reads, at most budget of them: those an
// earlier audit found unreported (their recheck is due), then those read
// longest ago (never read first).
func auditTurn(its []*item, budget int) []*item {
	if len(its) <= budget {
		return its
	}
	slices.SortFunc(its, func(a, b *item) int {
		if sa, sb := !a.suspect.IsZero(), !b.suspect.IsZero(); sa != sb {
			if sa {
				return -1
			}
			return 1
		}
		return a.audited.Compare(b.audited)
	})
	return its[:budget]
}

// recheckDue reports whether an audit's suspicion is due to be checked.
func (ms *monitorSet) recheckDue() bool { return ms.takeDue(&ms.recheck) }

// unreported reports whether dv, read from the server, is a change the
// server should have reported after it.reported (mu held): another status,
// or a value beyond the deadband (any other value without one). A percent
// deadband's band needs the node's EURange: only the status is judged.
func (it *item) unreported(dv *ua.DataValue) bool {
	r := it.reported
	if dv == nil || r == nil {
		return false
	}
	if dv.Status != r.Status {
		return true
	}
	if isBad(dv.Status) {
		return false // no value to compare
	}
	a, err := it.p.decode(dv.Value)
	if err != nil {
		return false
	}
	b, err := it.p.decode(r.Value)
	if err != nil {
		return false
	}
	fa, oka := number(a)
	fb, okb := number(b)
	if !oka || !okb {
		return a != b
	}
	switch d := it.req.Deadband; {
	case d == nil || d.Value == 0:
		return fa != fb
	case d.Percent:
		return false
	default:
		return math.Abs(fa-fb) > d.Value
	}
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	}
	return 0, false
}

// describe is a DataValue as an audit message shows it.
func describe(it *item, dv *ua.DataValue) string {
	if dv == nil {
		return "nothing"
	}
	v := "no value"
	if x, err := it.p.decode(dv.Value); err == nil {
		v = fmt.Sprint(x)
	}
	return v + " (" + statusName(dv.Status) + ")"
}

// unreportedError is an item the server holds changed without reporting
// it: the node polls it instead (drivers.ErrNotMonitored).
type unreportedError struct {
	bus, what, holds, reported string
	since                      time.Duration
}

func (e *unreportedError) Error() string {
	return fmt.Sprintf("opcua %s: the server holds %s for %s but last reported %s, and has not reported the change for %v: its subscription misses changes (a deadband filter that compares samples with each other, or drops status changes); polled every poll_ms instead",
		e.bus, e.holds, e.what, e.reported, e.since.Round(time.Millisecond))
}

func (e *unreportedError) Code() string { return "server_missed_change" }

func (e *unreportedError) Fix() string {
	return "the server's DataChangeFilter is not conformant (OPC UA Part 4 §7.22.2): the capability is polled; without deadband the server may report every change, or update the server"
}

func (e *unreportedError) Unwrap() error { return drivers.ErrNotMonitored }
