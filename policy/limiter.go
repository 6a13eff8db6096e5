package policy

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/physd/physd/promcp"
)

// StateStore persists rate and cooldown history (the bbolt store).
type StateStore interface {
	Get(bucket, key string) ([]byte, error)
}

// StateBucket is the store bucket of the rate and cooldown history.
const StateBucket = "policy_state"

// Limiter keeps each tool's actuation history for rate and cooldown rules.
//
// A real call takes a slot with Reserve: the check and the record are one
// step under one lock, before any slow step (quorum, the L1 gate, the
// device), so N concurrent callers can never all pass a limit of 2. A slot
// counts against the limits from the moment it is reserved. The node then
// either Begins it (it is persisted in the same commit as the ledger's
// pending entry, before the device is touched) or Releases it (nothing
// touched the device: the slot is given back, and if it had been
// persisted the history is rewritten without it). After a restart only
// begun slots count.
type Limiter struct {
	mu    sync.Mutex
	store StateStore
	hist  map[string]*history
}

type history struct {
	slots []*slot // oldest first
}

type slot struct {
	at    int64 // unix nanos
	begun bool
}

// persisted is the stored form: begun slots' times, oldest first.
type persisted struct {
	Times []int64 `json:"times"`
}

// NewLimiter loads nothing up front; each tool's history is read on first use.
func NewLimiter(s StateStore) *Limiter { return &Limiter{store: s, hist: map[string]*history{}} }

// get returns a tool's history, loading it from the store on first use.
// Called with l.mu held.
func (l *Limiter) get(tool string) *history {
	h := l.hist[tool]
	if h != nil {
		return h
	}
	h = &history{}
	if l.store != nil {
		var p persisted
		if b, err := l.store.Get(StateBucket, tool); err == nil && b != nil && json.Unmarshal(b, &p) == nil {
			for _, t := range p.Times {
				h.slots = append(h.slots, &slot{at: t, begun: true})
			}
		}
	}
	l.hist[tool] = h
	return h
}

// keep is how much history a tool's rules need.
func keep(tp *ToolPolicy) (time.Duration, int) {
	d, n := tp.Cooldown, 1
	for _, r := range tp.Rates {
		d, n = max(d, r.Per), max(n, r.Count)
	}
	return d, n
}

// trim drops begun slots no rule can see any more; slots still in flight
// stay until they are begun or released. Called with l.mu held.
func (h *history) trim(tp *ToolPolicy, now time.Time) {
	d, n := keep(tp)
	cut := now.Add(-d).UnixNano()
	kept := make([]*slot, 0, len(h.slots))
	for i, s := range h.slots {
		// The newest slot stays for the cooldown even when it is old; at
		// most the largest count + 1 stay for the rates.
		if !s.begun || i == len(h.slots)-1 || (s.at >= cut && len(h.slots)-i <= n+1) {
			kept = append(kept, s)
		}
	}
	h.slots = kept
}

// limitCheck is the rate and cooldown verdict at now.
type limitCheck struct {
	denied   *Outcome
	validFor time.Duration
	rate     *RateState
}

// RateState is the tightest rate rule's state, for can_do (PhysMCP
// rate_limit{max, current_window_remaining}).
type RateState struct {
	Max       int           `json:"max"`
	Remaining int           `json:"current_window_remaining"`
	Per       time.Duration `json:"-"`
}

// check judges the rate and cooldown rules against the slots (reserved
// and begun). Called with l.mu held.
func (h *history) check(tp *ToolPolicy, now time.Time) limitCheck {
	var out limitCheck
	for _, r := range tp.Rates {
		since := now.Add(-r.Per).UnixNano()
		var in []int64
		for _, s := range h.slots {
			if s.at > since {
				in = append(in, s.at)
			}
		}
		if out.rate == nil || r.Count-len(in) < out.rate.Remaining {
			out.rate = &RateState{Max: r.Count, Remaining: max(r.Count-len(in), 0), Per: r.Per}
		}
		if len(in) >= r.Count {
			// The oldest actuation in the window leaves it first.
			retry := time.Unix(0, in[len(in)-r.Count]).Add(r.Per).Sub(now)
			out.denied = &Outcome{Permission: promcp.PermRateLimited, Rule: "rate",
				Reason:  fmt.Sprintf("%s is limited to %s (%s); retry in %s", tp.Tool, r.Text, r.Source, retry.Round(time.Millisecond)),
				Details: "limit=" + r.Text + "; source=" + r.Source + "; retry_after_ms=" + ms(retry)}
			return out
		}
		out.validFor = 10 * time.Second
	}
	if tp.Cooldown > 0 && len(h.slots) > 0 {
		last := time.Unix(0, h.slots[len(h.slots)-1].at)
		if wait := last.Add(tp.Cooldown).Sub(now); wait > 0 {
			out.denied = &Outcome{Permission: promcp.PermCooldownActive, Rule: "cooldown",
				Reason: fmt.Sprintf("%s was actuated %s ago; its cooldown is %s; retry in %s",
					tp.Tool, now.Sub(last).Round(time.Millisecond), tp.Cooldown, wait.Round(time.Millisecond)),
				Details: "cooldown_ms=" + ms(tp.Cooldown) + "; retry_after_ms=" + ms(wait)}
			return out
		}
		out.validFor = 10 * time.Second
	}
	return out
}

// probe judges without recording (the can_do dry run).
func (l *Limiter) probe(tp *ToolPolicy, now time.Time) limitCheck {
	if len(tp.Rates) == 0 && tp.Cooldown == 0 {
		return limitCheck{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.get(tp.Tool)
	h.trim(tp, now)
	return h.check(tp, now)
}

// reserve judges and, when allowed, takes a slot: one step under one lock.
func (l *Limiter) reserve(tp *ToolPolicy, now time.Time) (limitCheck, *Reservation) {
	if len(tp.Rates) == 0 && tp.Cooldown == 0 {
		return limitCheck{}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.get(tp.Tool)
	h.trim(tp, now)
	lc := h.check(tp, now)
	if lc.denied != nil {
		return lc, nil
	}
	s := &slot{at: now.UnixNano()}
	h.slots = append(h.slots, s)
	return lc, &Reservation{l: l, tool: tp.Tool, s: s}
}

// Reservation is one actuation's rate and cooldown slot.
type Reservation struct {
	l    *Limiter
	tool string
	s    *slot
}

// Begin marks the slot as taken by an actuation that may touch the device
// from now on and returns the tool's history to persist (StateBucket/key) in the same
// commit as the ledger's pending entry.
func (r *Reservation) Begin(now time.Time) (key string, value []byte) {
	if r == nil {
		return "", nil
	}
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	// The cooldown runs from the actuation, not from the decision that
	// preceded it (an L1 round trip, a quorum).
	r.s.begun, r.s.at = true, max(r.s.at, now.UnixNano())
	h := r.l.get(r.tool)
	slices.SortStableFunc(h.slots, func(a, b *slot) int { return cmp.Compare(a.at, b.at) })
	return r.tool, r.l.snapshot(r.tool)
}

// Release gives the slot back: the actuation ended without touching the
// device. When the slot had begun, it returns the history to persist
// without it; otherwise value is nil and nothing needs writing. Releasing
// twice is harmless.
func (r *Reservation) Release() (key string, value []byte) {
	if r == nil {
		return "", nil
	}
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	h := r.l.get(r.tool)
	for i, s := range h.slots {
		if s == r.s {
			h.slots = append(h.slots[:i:i], h.slots[i+1:]...)
			if s.begun {
				return r.tool, r.l.snapshot(r.tool)
			}
			break
		}
	}
	return r.tool, nil
}

// snapshot is the persisted form of a tool's begun slots. Called with
// l.mu held.
func (l *Limiter) snapshot(tool string) []byte {
	p := persisted{Times: []int64{}}
	for _, s := range l.hist[tool].slots {
		if s.begun {
			p.Times = append(p.Times, s.at)
		}
	}
	b, _ := json.Marshal(p)
	return b
}
