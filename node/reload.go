package node

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/physd/physd/manifest"
)

// CodeManifestReloaded is the code of a do_ refused because the manifest
// was reloaded between its decision and its device step (nothing actuated).
const CodeManifestReloaded = "manifest_reloaded"

// ReloadResult is what a manifest reload changed, by tool and bus name.
type ReloadResult struct {
	Added    []string `json:"added,omitempty"`
	Removed  []string `json:"removed,omitempty"`
	Changed  []string `json:"changed,omitempty"`
	Kept     int      `json:"kept"`
	Reopened []string `json:"buses_reopened,omitempty"`
	Opened   []string `json:"buses_opened,omitempty"`
	Closed   []string `json:"buses_closed,omitempty"`
}

// Empty reports whether the reload changed nothing.
func (r ReloadResult) Empty() bool {
	return len(r.Added)+len(r.Removed)+len(r.Changed)+len(r.Reopened)+len(r.Opened)+len(r.Closed) == 0
}

// Reload puts m in force without a restart. The caller has validated m
// (manifest, bindings, policy) and that its device identity is the one
// in force (daemon's restartOnly): the ledger, audit and mesh identity
// belong to it.
//
//   - A capability whose definition and bus are unchanged keeps its state;
//     a changed one starts afresh (its cache could be in the old units)
//     but keeps its actuator, so the old and new definitions never actuate
//     together; an added one waits, before its first device step, for any
//     actuation of a replaced capability on its bus to end.
//   - A call that decided under the old manifest runs its device step only
//     if its capability is still current; one already in its device step
//     finishes on the old binding, and a removed bus closes when it ends.
//   - A bus whose configuration changed is closed (when its accesses end)
//     before it is reopened with the new one: a serial line or a Modbus
//     unit never has two masters in this process. Meanwhile its
//     capabilities answer that the bus is being reopened.
//
// The ledger, rate windows and history are keyed by capability name, so
// they carry over.
func (n *Node) Reload(ctx context.Context, m *manifest.Manifest) (ReloadResult, error) {
	return n.ReloadWith(ctx, m, nil)
}

// ReloadWith is Reload that runs inForce (when not nil) once m is bound,
// just before it is put in force, and only then: the caller's rules for m
// (its policy) go in force with it, never for a manifest that could not
// be bound.
func (n *Node) ReloadWith(ctx context.Context, m *manifest.Manifest, inForce func()) (ReloadResult, error) {
	n.reloadMu.Lock()
	defer n.reloadMu.Unlock()
	n.lifeMu.Lock()
	stopping := n.closed || n.draining
	n.lifeMu.Unlock()
	if stopping {
		return ReloadResult{}, ErrShuttingDown
	}
	prev := n.bound()
	// A bus whose configuration changed is reopened after its old
	// instance closed. So is a bus this reload opens while a bus of the
	// same driver is being retired (by this reload or an earlier one whose
	// wait ran out): the same line or device may hide under another name
	// or other settings, and it never has two masters in this process.
	reopen := map[string]bool{}
	var waits []<-chan struct{}
	retiringByType := map[string][]*busRef{}
	for name, old := range prev.buses {
		if nb := m.Buses[name]; nb == nil || busSum(nb) != old.sum {
			retiringByType[old.typ] = append(retiringByType[old.typ], old)
		}
	}
	for r := range n.retiring {
		select {
		case <-r.closed:
			delete(n.retiring, r)
		default:
			retiringByType[r.typ] = append(retiringByType[r.typ], r)
		}
	}
	for name, nb := range m.Buses {
		if old := prev.buses[name]; old != nil && old.sum == busSum(nb) {
			continue // kept, open
		}
		if rs := retiringByType[nb.Type]; len(rs) > 0 {
			reopen[name] = true
			for _, r := range rs {
				waits = append(waits, r.closed)
			}
		}
	}
	next, opened, err := n.bind(ctx, m, prev, reopen)
	if err != nil {
		return ReloadResult{}, err
	}
	res := diffBindings(prev, next)
	for _, r := range opened {
		res.Opened = append(res.Opened, r.name)
	}
	if inForce != nil {
		inForce()
	}
	n.swap(prev, next)
	// Buses the new binding does not share close when their accesses end.
	for name, r := range prev.buses {
		if next.buses[name] != r {
			done := r.retire()
			select {
			case <-done:
			default:
				if n.retiring == nil {
					n.retiring = map[*busRef]bool{}
				}
				n.retiring[r] = true
			}
			if reopen[name] {
				waits = append(waits, done)
			} else {
				res.Closed = append(res.Closed, name)
			}
		}
	}
	if len(reopen) == 0 {
		return res, nil
	}
	for _, done := range waits {
		select {
		case <-done:
		case <-ctx.Done():
			return res, fmt.Errorf("the manifest is in force, but a changed bus still had a device access under way when the reload's time ran out (%w); its capabilities answer that it is being reopened until the next reload (send SIGHUP again)", ctx.Err())
		}
	}
	for r := range n.retiring {
		select {
		case <-r.closed:
			delete(n.retiring, r)
		default:
		}
	}
	final, _, err := n.bind(ctx, m, next, nil)
	if err != nil {
		// Only the open bus could judge these bindings: the manifest does
		// not bind, so the previous one goes back in force.
		if rerr := n.rollback(ctx, prev, next); rerr != nil {
			return res, fmt.Errorf("the manifest is in force, but binding the reopened buses failed (their capabilities answer error): %w; putting the previous manifest back failed too: %v", err, rerr)
		}
		return ReloadResult{}, fmt.Errorf("rejected when its reopened buses were bound, and the previous manifest is back in force: %w", err)
	}
	n.swap(next, final)
	for name := range reopen {
		if prev.buses[name] != nil {
			res.Reopened = append(res.Reopened, name)
		} else {
			res.Opened = append(res.Opened, name)
		}
	}
	slices.Sort(res.Reopened)
	slices.Sort(res.Opened)
	return res, nil
}

// rollback puts prev's manifest back in force after next (in force now)
// could not be completed: the buses prev had and next does not share are
// reopened with prev's settings once their old instances closed (never
// two masters), and the buses next opened are retired.
func (n *Node) rollback(ctx context.Context, prev, next *binding) error {
	for name, r := range prev.buses {
		if next.buses[name] != r {
			select {
			case <-r.closed:
			case <-ctx.Done():
				return fmt.Errorf("bus %s still had a device access under way: %w", name, ctx.Err())
			}
		}
	}
	back, _, err := n.bind(ctx, prev.m, next, nil)
	if err != nil {
		return err
	}
	n.swap(next, back)
	for _, r := range next.buses {
		if !slices.Contains(slices.Collect(maps.Values(back.buses)), r) {
			select {
			case <-r.retire():
			default:
				if n.retiring == nil {
					n.retiring = map[*busRef]bool{}
				}
				n.retiring[r] = true
			}
		}
	}
	return nil
}

// swap puts next in force and moves the background polls to it.
func (n *Node) swap(prev, next *binding) {
	n.cur.Store(next)
	close(prev.stopPoll)
	n.startPolls(next)
	n.reconcileFailSafe(next)
}

// diffBindings compares definitions (a capability on a reopened bus whose
// definition did not change is kept, though it is bound afresh).
func diffBindings(prev, next *binding) ReloadResult {
	var r ReloadResult
	for _, cs := range next.caps {
		old := prev.byTool[cs.tool]
		switch {
		case old == nil:
			r.Added = append(r.Added, cs.tool)
		case old.sum == cs.sum:
			r.Kept++
		default:
			r.Changed = append(r.Changed, cs.tool)
		}
	}
	for _, cs := range prev.caps {
		if next.byTool[cs.tool] == nil {
			r.Removed = append(r.Removed, cs.tool)
		}
	}
	return r
}

// Reopening lists the buses of the manifest in force that a reload
// deferred until older instances closed and has not opened yet (its wait
// ran out of time): a Reload, of the same manifest too, opens them once
// those instances closed.
func (n *Node) Reopening() []string {
	out := slices.Clone(n.bound().reopening)
	slices.Sort(out)
	return out
}

// Definition identifies the definition of tool in force (its manifest
// entry, binding included): it changes when a reload redefines the
// capability. "" for an unknown tool.
func (n *Node) Definition(tool string) string {
	if cs, ok := n.bound().byTool[tool]; ok {
		return cs.sum
	}
	return ""
}
