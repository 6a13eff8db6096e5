// Package alarms raises and clears the alarms the manifest declares per
// capability (capabilities[].alarms) from the node's observation stream:
// high and low thresholds with hysteresis, a quality the operator watches
// for, and a capability that has not been read for stale_s. A condition
// raises only after it has held for for_ms (noise raises nothing) and a
// threshold clears only past its hysteresis (no flapping).
//
// The engine reads no device: it consumes the stream, and the do_ path
// never waits for it. Raised and cleared events go to the listeners
// (audit, metrics, MCP resource updates); Active lists what is raised now.
package alarms

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// Kinds of alarm.
const (
	KindHigh    = "high"
	KindLow     = "low"
	KindQuality = "quality"
	KindStale   = "stale"
)

// Event is an alarm raised or cleared.
type Event struct {
	Capability string    `json:"capability"` // the tool, read_… or do_…
	Kind       string    `json:"kind"`
	State      string    `json:"state"` // raised | cleared
	At         time.Time `json:"at"`
	Value      any       `json:"value,omitempty"`
	Message    string    `json:"message"`
}

// Active is an alarm raised now.
type Active struct {
	Capability string    `json:"capability"`
	Kind       string    `json:"kind"`
	Since      time.Time `json:"since"`
	Value      any       `json:"value,omitempty"`
	Message    string    `json:"message"`
	// AckedBy and AckedAt name who acknowledged this raise of the alarm
	// (Acknowledge); a raise after a clear starts unacknowledged.
	AckedBy string    `json:"acknowledged_by,omitempty"`
	AckedAt time.Time `json:"acknowledged_at,omitzero"`
}

// ack is an operator's acknowledgement of one raise of an alarm: it counts
// only while the alarm raised at since is the one active.
type ack struct {
	since time.Time
	by    string
	at    time.Time
}

// ErrNotActive is returned when acknowledging an alarm that is not raised.
var ErrNotActive = errors.New("the alarm is not raised (it cleared, or no such alarm is declared)")

// Engine evaluates the alarms of one node.
type Engine struct {
	caps  map[string]*capAlarms // by capability name
	tick  time.Duration
	sub   *node.Subscription
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
	mu    sync.Mutex
	lsnrs []func(Event)
	// emitMu makes finding events and telling the listeners one step, so
	// listeners see the events in the order they happened (the engine's
	// goroutine and Reload both emit).
	emitMu sync.Mutex

	safeTools  map[string]bool // do_ tools with a safe state (safe.go)
	safeActive map[safeKey]*safeAlarm

	acks map[safeKey]ack // by tool and kind (under mu)
}

type capAlarms struct {
	c        *manifest.Capability
	a        *manifest.Alarms
	lastRead time.Time // last observation with a fresh value
	conds    map[string]*cond
}

type cond struct {
	since   time.Time // the condition holds since (zero: it does not)
	active  bool
	raised  time.Time
	value   any
	message string
}

// New builds the engine for the manifest's declared alarms. With none
// declared it has nothing to evaluate, but it exists: a manifest reload
// may declare some (Reload).
func New(m *manifest.Manifest) *Engine {
	e := &Engine{caps: map[string]*capAlarms{}, tick: time.Second, stop: make(chan struct{}), done: make(chan struct{}),
		safeTools: safeTools(m), safeActive: map[safeKey]*safeAlarm{}}
	for _, c := range m.Capabilities {
		if c.Alarms == nil {
			continue
		}
		e.caps[c.Name] = newCapAlarms(c)
	}
	return e
}

func newCapAlarms(c *manifest.Capability) *capAlarms {
	ca := &capAlarms{c: c, a: c.Alarms, conds: map[string]*cond{}}
	for _, k := range kindsOf(c.Alarms) {
		ca.conds[k] = &cond{}
	}
	return ca
}

// Reload puts the alarms of m in force (after a manifest reload), and
// emits the events it causes to the listeners before it returns. An alarm
// is identified by its capability's tool name and its kind; its
// definition is what its condition depends on: the kind's fields of
// alarms: (high or low with hysteresis and for_ms, quality with for_ms,
// stale_s) and the capability's data type and unit.
//
//   - An alarm whose definition is unchanged keeps its state: raised stays
//     raised (no new event), a pending condition keeps counting.
//   - An alarm whose definition changed starts again from not raised;
//     raised, it is cleared with an event saying that the manifest reload
//     changed it (the new definition raises it again if it holds).
//   - An alarm the new manifest no longer declares (its capability or its
//     kind removed) is cleared the same way, saying the reload removed it.
//   - A new alarm starts not raised; its stale_s counts from the reload.
func (e *Engine) Reload(m *manifest.Manifest) {
	e.emitMu.Lock()
	defer e.emitMu.Unlock()
	e.emit(e.reload(m, time.Now()))
}

func (e *Engine) reload(m *manifest.Manifest, now time.Time) []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var evs []Event
	next := map[string]*capAlarms{}
	for _, c := range m.Capabilities {
		if c.Alarms == nil {
			continue
		}
		ca := newCapAlarms(c)
		old := e.caps[c.Name]
		if old != nil && old.c.ToolName() == c.ToolName() {
			ca.lastRead = old.lastRead
			for k := range ca.conds {
				if oc := old.conds[k]; oc != nil && definition(old, k) == definition(ca, k) {
					ca.conds[k] = oc
				}
			}
		} else if e.sub != nil {
			ca.lastRead = now // stale counts from the reload, as from the start
		}
		next[c.Name] = ca
	}
	names := make([]string, 0, len(e.caps))
	for n := range e.caps {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		old := e.caps[n]
		ca := next[n]
		for _, k := range kindsOf(old.a) {
			oc := old.conds[k]
			switch {
			case ca != nil && ca.conds[k] == oc:
				// kept
			case ca != nil && ca.c.ToolName() == old.c.ToolName() && ca.conds[k] != nil:
				evs = old.clear(evs, k, now, oc.value, "the manifest reload changed this alarm")
			default:
				evs = old.clear(evs, k, now, oc.value, "the manifest reload removed this alarm")
			}
		}
	}
	e.caps = next
	return append(evs, e.reloadSafe(m, now)...)
}

// definition is what the condition of kind on ca depends on: equal
// definitions keep the condition's state across a reload.
func definition(ca *capAlarms, kind string) string {
	a, c := ca.a, ca.c
	num := func(p *float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprint(*p)
	}
	base := c.ToolName() + "|" + c.DataType + "|" + c.Unit + "|" + kind + "|"
	switch kind {
	case KindHigh:
		return base + fmt.Sprint(num(a.High), a.Hysteresis, a.ForMS)
	case KindLow:
		return base + fmt.Sprint(num(a.Low), a.Hysteresis, a.ForMS)
	case KindQuality:
		return base + fmt.Sprint(a.Quality, a.ForMS)
	case KindStale:
		return base + fmt.Sprint(a.StaleS)
	}
	return base
}

func kindsOf(a *manifest.Alarms) []string {
	var ks []string
	if a.High != nil {
		ks = append(ks, KindHigh)
	}
	if a.Low != nil {
		ks = append(ks, KindLow)
	}
	if len(a.Quality) > 0 {
		ks = append(ks, KindQuality)
	}
	if a.StaleS > 0 {
		ks = append(ks, KindStale)
	}
	return ks
}

// Declared lists every declared alarm in force as capability tool and
// kind (for metrics).
func (e *Engine) Declared() [][2]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out [][2]string
	for _, ca := range e.caps {
		for k := range ca.conds {
			out = append(out, [2]string{ca.c.ToolName(), k})
		}
	}
	for tool := range e.safeTools {
		out = append(out, [2]string{tool, KindSafeState}, [2]string{tool, KindSafeFailed})
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0]+out[i][1] < out[j][0]+out[j][1] })
	return out
}

// OnEvent adds a listener; listeners run one at a time, on the engine's
// goroutine (on Reload's for the events a reload causes), in the order of
// the events, and should be quick (the audit's fsync is).
func (e *Engine) OnEvent(f func(Event)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lsnrs = append(e.lsnrs, f)
}

// Follow starts evaluating the node's observation stream; Close stops.
// It takes the observations of capabilities that declare alarms and the
// safe-state entries (nothing else raises or clears an alarm), with room
// for a poll round of them: a plant of 10 000 points with a few hundred
// alarms hands the engine those few hundred.
func (e *Engine) Follow(n *node.Node) {
	room := node.DefaultSubscriptionBuffer
	for _, c := range n.Manifest().Capabilities {
		if c.Alarms != nil {
			room++
		}
	}
	sub := n.SubscribeWhere(room, func(o node.Observed) bool {
		return o.Safe != nil || o.Cap != nil && o.Cap.Alarms != nil
	})
	now := time.Now()
	e.mu.Lock()
	e.sub = sub
	for _, ca := range e.caps {
		ca.lastRead = now // stale counts from the start
	}
	seeded := e.seedSafe(n)
	e.mu.Unlock()
	e.emitMu.Lock()
	e.emit(seeded)
	e.emitMu.Unlock()
	go e.run()
}

func (e *Engine) run() {
	defer close(e.done)
	t := time.NewTicker(e.tick)
	defer t.Stop()
	for {
		select {
		case o := <-e.sub.C:
			e.emitMu.Lock()
			e.emit(e.Observe(o))
			e.emitMu.Unlock()
		case <-t.C:
			e.emitMu.Lock()
			e.emit(e.Tick(time.Now()))
			e.emitMu.Unlock()
		case <-e.sub.Done():
			return
		case <-e.stop:
			return
		}
	}
}

// Close stops the engine.
func (e *Engine) Close() {
	e.once.Do(func() {
		close(e.stop)
		if e.sub != nil {
			<-e.done
			e.sub.Close()
		}
	})
}

func (e *Engine) emit(evs []Event) {
	if len(evs) == 0 {
		return
	}
	e.mu.Lock()
	ls := append([]func(Event){}, e.lsnrs...)
	e.mu.Unlock()
	for _, ev := range evs {
		for _, f := range ls {
			f(ev)
		}
	}
}

// Observe evaluates one observation and returns the events it causes.
func (e *Engine) Observe(o node.Observed) []Event {
	if o.Cap == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if o.Safe != nil {
		at := o.At
		if at.IsZero() {
			at = time.Now()
		}
		return e.observeSafe(o.Safe, at)
	}
	ca := e.caps[o.Cap.Name]
	if ca == nil {
		return nil
	}
	at := o.At
	if at.IsZero() {
		at = time.Now()
	}
	fresh := o.Obs.Quality == promcp.QualityGood || o.Obs.Quality == promcp.QualityDegraded
	var evs []Event
	if fresh {
		ca.lastRead = at
		if c := ca.conds[KindStale]; c != nil {
			c.since = time.Time{}
			evs = ca.clear(evs, KindStale, at, o.Obs.Value, "read again")
		}
	}
	if v, ok := manifest.Number(o.Obs.Value); ok && fresh {
		if h := ca.a.High; h != nil {
			evs = ca.threshold(evs, KindHigh, at, v, v > *h, v <= *h-ca.a.Hysteresis,
				fmt.Sprintf("%g %s, above the high limit %g", v, ca.c.Unit, *h), fmt.Sprintf("back to %g %s, at or below %g", v, ca.c.Unit, *h-ca.a.Hysteresis))
		}
		if l := ca.a.Low; l != nil {
			evs = ca.threshold(evs, KindLow, at, v, v < *l, v >= *l+ca.a.Hysteresis,
				fmt.Sprintf("%g %s, below the low limit %g", v, ca.c.Unit, *l), fmt.Sprintf("back to %g %s, at or above %g", v, ca.c.Unit, *l+ca.a.Hysteresis))
		}
	}
	if len(ca.a.Quality) > 0 {
		bad := false
		for _, q := range ca.a.Quality {
			bad = bad || string(o.Obs.Quality) == q
		}
		msg := "quality " + string(o.Obs.Quality)
		if o.Obs.Reason != "" {
			msg += ": " + o.Obs.Reason
		}
		evs = ca.threshold(evs, KindQuality, at, o.Obs.Value, bad, !bad, msg, "quality "+string(o.Obs.Quality))
	}
	return evs
}

// threshold moves one condition: holding raises it after for_ms, clearing
// (past the hysteresis) clears it; in between nothing changes.
func (ca *capAlarms) threshold(evs []Event, kind string, at time.Time, v any, holds, clears bool, raiseMsg, clearMsg string) []Event {
	c := ca.conds[kind]
	switch {
	case holds:
		if c.since.IsZero() {
			c.since = at
		}
		c.value, c.message = v, raiseMsg
		if !c.active && at.Sub(c.since) >= ca.a.For() {
			evs = ca.raise(evs, kind, at)
		}
	case clears:
		c.since = time.Time{}
		evs = ca.clear(evs, kind, at, v, clearMsg)
	default: // inside the hysteresis band: a pending raise starts over
		if !c.active {
			c.since = time.Time{}
		}
	}
	return evs
}

func (ca *capAlarms) raise(evs []Event, kind string, at time.Time) []Event {
	c := ca.conds[kind]
	c.active, c.raised = true, at
	return append(evs, Event{Capability: ca.c.ToolName(), Kind: kind, State: "raised", At: at.UTC(), Value: c.value, Message: c.message})
}

func (ca *capAlarms) clear(evs []Event, kind string, at time.Time, v any, msg string) []Event {
	c := ca.conds[kind]
	if !c.active {
		return evs
	}
	c.active = false
	return append(evs, Event{Capability: ca.c.ToolName(), Kind: kind, State: "cleared", At: at.UTC(), Value: v, Message: msg})
}

// Tick raises what has held for for_ms without a new observation, and
// stale alarms.
func (e *Engine) Tick(now time.Time) []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var evs []Event
	names := make([]string, 0, len(e.caps))
	for n := range e.caps {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ca := e.caps[n]
		for _, k := range kindsOf(ca.a) {
			c := ca.conds[k]
			if k == KindStale {
				limit := time.Duration(ca.a.StaleS) * time.Second
				if !c.active && now.Sub(ca.lastRead) > limit {
					c.value, c.message = nil, fmt.Sprintf("no fresh value for %v (stale_s %d)", now.Sub(ca.lastRead).Round(time.Second), ca.a.StaleS)
					evs = ca.raise(evs, k, now)
				}
				continue
			}
			if !c.active && !c.since.IsZero() && now.Sub(c.since) >= ca.a.For() {
				evs = ca.raise(evs, k, now)
			}
		}
	}
	return evs
}

// Active lists the alarms raised now, by capability and kind.
func (e *Engine) Active() []Active {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.active()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Capability != out[j].Capability {
			return out[i].Capability < out[j].Capability
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}

// active lists the raised alarms with their acknowledgements, unsorted
// (under e.mu).
func (e *Engine) active() []Active {
	out := []Active{}
	for _, ca := range e.caps {
		for k, c := range ca.conds {
			if c.active {
				out = append(out, Active{Capability: ca.c.ToolName(), Kind: k, Since: c.raised.UTC(), Value: c.value, Message: c.message})
			}
		}
	}
	for k, a := range e.safeActive {
		out = append(out, Active{Capability: k.tool, Kind: k.kind, Since: a.since.UTC(), Value: a.value, Message: a.message})
	}
	for i := range out {
		if a, ok := e.acks[safeKey{out[i].Capability, out[i].Kind}]; ok && a.since.Equal(out[i].Since) {
			out[i].AckedBy, out[i].AckedAt = a.by, a.at.UTC()
		}
	}
	return out
}

// Acknowledge records that by has seen the alarm of tool and kind raised
// now. It changes nothing the alarm evaluates (an acknowledged alarm stays
// raised until its condition clears) and emits no event: the caller audits
// it. An acknowledgement belongs to one raise: after a clear, the next
// raise is unacknowledged again, as an HMI's alarm list shows it.
func (e *Engine) Acknowledge(tool, kind, by string, at time.Time) (Active, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, a := range e.active() {
		if a.Capability != tool || a.Kind != kind {
			continue
		}
		if a.AckedBy != "" {
			return a, nil // the first acknowledgement stands
		}
		if e.acks == nil {
			e.acks = map[safeKey]ack{}
		}
		e.acks[safeKey{tool, kind}] = ack{since: a.Since, by: by, at: at}
		a.AckedBy, a.AckedAt = by, at.UTC()
		return a, nil
	}
	return Active{}, ErrNotActive
}

// IsActive reports whether the alarm of tool and kind is raised.
func (e *Engine) IsActive(tool, kind string) bool {
	for _, a := range e.Active() {
		if a.Capability == tool && a.Kind == kind {
			return true
		}
	}
	return false
}
