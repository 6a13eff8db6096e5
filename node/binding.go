package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
)

// A binding is one manifest's capabilities bound to their buses. The node
// serves one binding at a time; a manifest reload (Reload) builds the next
// one and swaps it in, so every call sees one consistent manifest. A call
// that looked a capability up before the swap keeps its capState, and the
// device step re-checks that the capState is still current (execute), so
// an actuation either ran on the old binding to the end or never started.
type binding struct {
	m      *manifest.Manifest
	buses  map[string]*busRef
	busErr map[string]error
	caps   []*capState
	byTool map[string]*capState
	// stopPoll ends this binding's background polls (closed when the next
	// binding is in force, or by Close).
	stopPoll chan struct{}
	// retired are the device-step turns of do_ capabilities that earlier
	// bindings dropped and that may still be in a device step begun under
	// them (linkPredecessors): a chain of reloads must not forget an
	// actuation that outlived the binding in between.
	retired []retiredTurn
	// reopening are the buses this binding does not open because older
	// instances must close first (Reload opens them in the next binding).
	reopening []string
}

// retiredTurn is the actuator turn of a do_ capability no longer current.
type retiredTurn struct {
	bus  string  // its binding's bus name
	ref  *busRef // the open bus it used
	turn chan struct{}
}

// bound is the binding in force.
func (n *Node) bound() *binding { return n.cur.Load() }

// busRef is an open bus shared by the bindings that use it. A reload that
// keeps a bus's configuration keeps the open bus (and its line discipline,
// connections and health); a bus that is removed or changed is retired:
// it closes when its last device access ends, never under one.
type busRef struct {
	drivers.Bus
	name string
	typ  string // the driver (buses.<name>.type)
	sum  string // the manifest entry's configuration (busSum)

	mu      sync.Mutex
	users   int
	retired bool
	closed  chan struct{} // closed once Close has returned
	log     func(name string, err error)
}

func newBusRef(name, typ, sum string, b drivers.Bus, log func(string, error)) *busRef {
	return &busRef{Bus: b, name: name, typ: typ, sum: sum, closed: make(chan struct{}), log: log}
}

// enter starts a device access; false means the bus is closed (a reload
// retired it and it had no access under way).
func (b *busRef) enter() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.closed:
		return false
	default:
	}
	if b.retired && b.users == 0 {
		return false
	}
	b.users++
	return true
}

// leave ends a device access; the last one out of a retired bus closes it.
func (b *busRef) leave() {
	b.mu.Lock()
	b.users--
	last := b.retired && b.users == 0
	b.mu.Unlock()
	if last {
		b.close()
	}
}

// retire closes the bus once no device access is under way; the channel
// is closed when it is.
func (b *busRef) retire() <-chan struct{} {
	b.mu.Lock()
	already := b.retired
	b.retired = true
	idle := b.users == 0
	b.mu.Unlock()
	if !already && idle {
		b.close()
	}
	return b.closed
}

func (b *busRef) close() {
	if err := b.Bus.Close(); err != nil && b.log != nil {
		b.log(b.name, err)
	}
	close(b.closed)
}

// busSum is a bus entry's configuration as canonical JSON: two entries
// with the same sum open the same bus the same way.
func busSum(b *manifest.Bus) string {
	return canonical(struct {
		Type   string `json:"type"`
		Config any    `json:"config"`
	}{b.Type, nodeValue(b.Config)})
}

// capSum identifies a capability's whole definition (its binding
// parameters included): the SHA-256 of its canonical JSON, hex. Source
// positions are not part of it. A hash, not the JSON: every capability
// keeps it, and the approval digests carry it.
func capSum(c *manifest.Capability) string {
	sum := sha256.Sum256([]byte(canonical(struct {
		Cap    *manifest.Capability `json:"cap"`
		Params any                  `json:"params"`
	}{c, nodeValue(c.Binding.ParamsNode())})))
	return hex.EncodeToString(sum[:])
}

func nodeValue(n *yaml.Node) any {
	if n == nil {
		return nil
	}
	var v any
	if err := n.Decode(&v); err != nil {
		return err.Error()
	}
	return v
}

func canonical(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return "unencodable: " + err.Error()
	}
	return string(b)
}

// bind binds every capability of m. Buses of prev whose configuration is
// unchanged are shared, not reopened; buses named in reopen are not
// opened at all (their capabilities answer that the bus is being
// reopened). A capability whose definition and bus are unchanged keeps its
// state (cache, observation reference, actuator); one that changed keeps
// only its actuator, so calls of the old and the new definition never
// touch the device together. opened lists the buses bind opened itself.
func (n *Node) bind(ctx context.Context, m *manifest.Manifest, prev *binding, reopen map[string]bool) (b *binding, opened []*busRef, err error) {
	b = &binding{m: m, buses: map[string]*busRef{}, busErr: map[string]error{}, byTool: map[string]*capState{}, stopPoll: make(chan struct{})}
	names := make([]string, 0, len(m.Buses))
	for name := range m.Buses {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		sum := busSum(m.Buses[name])
		if prev != nil {
			if old := prev.buses[name]; old != nil && old.sum == sum && !reopen[name] {
				b.buses[name] = old
				continue
			}
		}
		if reopen[name] {
			b.busErr[name] = fmt.Errorf("bus %q is being reopened with its new configuration after a manifest reload; retry in a moment", name)
			b.reopening = append(b.reopening, name)
			continue
		}
		bus, err := drivers.Open(ctx, m.Buses[name])
		if err != nil {
			b.busErr[name] = err
			n.log.Error("bus unavailable", "bus", name, "err", err)
			continue
		}
		ref := newBusRef(name, m.Buses[name].Type, sum, bus, n.busCloseLog)
		b.buses[name] = ref
		opened = append(opened, ref)
	}
	closeOpened := func() {
		for _, r := range opened {
			r.retire()
		}
	}
	var bindErrs []error
	for _, c := range m.Capabilities {
		tool := c.ToolName()
		var old *capState
		if prev != nil {
			old = prev.byTool[tool]
		}
		busRef := b.buses[c.Binding.Bus]
		sum := capSum(c)
		if old != nil && old.sum == sum && old.bus != nil && old.bus == busRef {
			// Unchanged, on the same open bus: the same capability.
			b.caps = append(b.caps, old)
			b.byTool[tool] = old
			continue
		}
		cs := &capState{cap: c, tool: tool, sum: sum, bound: time.Now()}
		if c.Exposed() {
			cs.vocab = vocabulary(c) // can_do matches exposed capabilities only
		}
		// Decoded once: the interlocks and leases compare with it on every
		// reading and do_.
		cs.safe, _ = SafeValue(c)
		// Only an output has a device step (a read never takes the turn):
		// a plant's thousands of readings carry no actuator. A redefined
		// output keeps its predecessor's turn.
		if c.Kind == manifest.KindDo {
			cs.act = newActuator()
			if old != nil && old.act.turn != nil {
				cs.act = old.act
			}
		}
		switch {
		case c.Binding.Bus == "":
			bindErrs = append(bindErrs, fmt.Errorf("%s: %s.bus: required; fix: name the bus this capability is wired to (one of buses:)", c.Binding.Pos, c.Binding.Field))
		case busRef == nil:
			cs.bindErr = fmt.Errorf("bus %q is unavailable: %v", c.Binding.Bus, b.busErr[c.Binding.Bus])
		default:
			p, err := busRef.Point(c)
			if err != nil {
				// A binding the driver rejects is a configuration error,
				// not a missing device.
				bindErrs = append(bindErrs, fmt.Errorf("capability %s: %w", c.Name, err))
			}
			cs.point, cs.bus = p, busRef
		}
		b.caps = append(b.caps, cs)
		b.byTool[tool] = cs
	}
	for name := range b.buses {
		var caps []*manifest.Capability
		var points []drivers.Point
		for _, cs := range b.caps {
			if cs.cap.Binding.Bus == name && cs.point != nil {
				caps, points = append(caps, cs.cap), append(points, cs.point)
			}
		}
		if err := drivers.SharedActuators(name, caps, points); err != nil {
			bindErrs = append(bindErrs, err)
		}
	}
	if len(bindErrs) > 0 {
		closeOpened()
		return nil, nil, errors.Join(bindErrs...)
	}
	if prev != nil {
		b.linkPredecessors(prev)
	}
	return b, opened, nil
}

// linkPredecessors makes every new or changed do_ capability wait, before
// its first device step, for the device steps under way on capabilities of
// earlier bindings that share its bus and did not carry over (removed,
// changed or moved): an actuation that began before a reload finishes
// before one of the new manifest touches the same bus — also when more
// reloads followed meanwhile (a capability removed by one and added back
// by the next waits for the actuation the first one left under way).
func (b *binding) linkPredecessors(prev *binding) {
	// prev is in force: its own capabilities may start a device step until
	// b is, so the ones b drops are retired unconditionally. Those retired
	// before prev are not current and never will be again: once no device
	// step holds their turn, none can start, and they are forgotten.
	for _, r := range prev.retired {
		select {
		case r.turn <- struct{}{}:
			<-r.turn
		default:
			b.retired = append(b.retired, r)
		}
	}
	for _, old := range prev.caps {
		if old.cap.Kind == manifest.KindDo && b.byTool[old.tool] != old && old.bus != nil {
			b.retired = append(b.retired, retiredTurn{bus: old.cap.Binding.Bus, ref: old.bus, turn: old.act.turn})
		}
	}
	for _, cs := range b.caps {
		if cs.cap.Kind != manifest.KindDo || prev.byTool[cs.tool] == cs {
			continue
		}
		var preds []chan struct{}
		for _, r := range b.retired {
			if r.turn == cs.act.turn {
				continue
			}
			if r.bus != cs.cap.Binding.Bus && (cs.bus == nil || r.ref != cs.bus) {
				continue
			}
			if !slices.Contains(preds, r.turn) {
				preds = append(preds, r.turn)
			}
		}
		cs.preds = preds
	}
}

// awaitPredecessors waits until no device step of a predecessor (see
// linkPredecessors) is under way. Once that held, no predecessor can start
// one (they are no longer current), so later calls skip the wait. A
// redefined capability's turn is its successor's too: the caller must not
// hold its own turn while it waits (execute), or two redefined
// capabilities waiting for each other would deadlock.
func (cs *capState) awaitPredecessors(ctx context.Context) error {
	if len(cs.preds) == 0 || cs.predsDone.Load() {
		return nil
	}
	for _, turn := range cs.preds {
		select {
		case turn <- struct{}{}:
			<-turn
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	cs.predsDone.Store(true)
	return nil
}

func (n *Node) busCloseLog(name string, err error) {
	n.log.Warn("bus close", "bus", name, "err", err)
}
