package daemon

import (
	"context"

	"github.com/physd/physd/gate"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
)

// change is one prepared reload: the manifest in force (old), the one to
// put in force (m, old itself for a policy-only reload) and its policy.
type change struct {
	old, m *manifest.Manifest
	pol    *policy.Policy
	g      *gate.Gate
	res    *node.ReloadResult // set by the binding step (nil: policy only)
}

func (c *change) manifestChanged() bool { return c.m != c.old }

// A reloadStep applies a change to one component. undo (nil: nothing to
// undo) puts back what apply did; it is called, last step first, when
// this step or a later one fails, for every step that ran, the failing
// one included, so a step that failed half-way undoes its half.
type reloadStep struct {
	name  string
	apply func(context.Context, *change) (undo func(), err error)
}

// transact applies c step by step; on the first failure it rolls back
// the steps that ran, through their undo, and returns the error.
func transact(ctx context.Context, steps []reloadStep, c *change) error {
	var undos []func()
	for _, s := range steps {
		undo, err := s.apply(ctx, c)
		if undo != nil {
			undos = append(undos, undo)
		}
		if err != nil {
			for i := len(undos) - 1; i >= 0; i-- {
				undos[i]()
			}
			return err
		}
	}
	return nil
}

// reloadSteps are the components that take part in a reload, in this
// order: the binding (the node's manifest with the guard's policy), the
// mesh catalog, the fleet catalog, the alarm engine (alarms of removed or changed
// definitions are cleared, and their events audited, before MQTT forgets
// removed tools), the history (which capabilities are recorded), the MQTT
// publisher (discovery configs and retained topics), and last the MCP
// server's tool lists (list_changed). Only the binding can fail; the
// steps after it are quick and log their own trouble. The bus and alarm
// gauges need no step: they list the buses and alarms in force at each
// scrape (registerBusMetrics, startAlarms).
func (d *Daemon) reloadSteps() []reloadStep {
	return []reloadStep{
		{"binding", d.bindingReload},
		{"mesh", d.meshReload},
		{"fleet", d.follow(func(*manifest.Manifest) {
			if d.fsrv != nil {
				d.fsrv.Reload()
			}
		})},
		{"alarms", d.follow(func(m *manifest.Manifest) { d.alarms.Reload(m) })},
		{"history", d.follow(func(m *manifest.Manifest) {
			if d.hist != nil {
				d.hist.Reload(m)
			}
		})},
		{"mqtt", d.follow(func(m *manifest.Manifest) {
			if d.pub != nil {
				d.pub.Reload(m)
			}
		})},
		{"mcp", d.mcpReload},
	}
}

// follow is the step of a component that follows a new manifest once it
// is in force (nothing for a policy-only reload).
func (d *Daemon) follow(reload func(*manifest.Manifest)) func(context.Context, *change) (func(), error) {
	return func(_ context.Context, c *change) (func(), error) {
		if c.manifestChanged() {
			reload(c.m)
		}
		return nil, nil
	}
}

// bindingReload puts the policy in force and, when the manifest changed,
// binds the new manifest. The new rules go in force just before the new
// binding (a call decided between the two is judged by the new policy on
// the old binding, and one whose capability the reload redefines never
// actuates: node.CodeManifestReloaded), and only when the manifest could
// be bound: undo puts back the rules in force before.
func (d *Daemon) bindingReload(ctx context.Context, c *change) (func(), error) {
	g := d.inForce
	if !c.manifestChanged() {
		g.Reload(c.pol, c.g)
		return nil, nil
	}
	prevPol, prevGate := g.Policy(), g.Gate()
	undo := func() { g.Reload(prevPol, prevGate) }
	rctx, cancel := context.WithTimeout(ctx, reloadTimeout)
	defer cancel()
	rr, err := d.n.ReloadWith(rctx, c.m, func() { g.Reload(c.pol, c.g) })
	if err != nil && d.n.Manifest() == c.old {
		// Not applied, or put back (a reopened bus could not bind it).
		return undo, err
	}
	if err != nil {
		d.log.Error("manifest reload: applied with an error", "err", err.Error())
	}
	c.res = &rr
	tuneGC(c.m) // the site's size may have changed
	// Bound: nothing to undo, as the steps after this one cannot fail (a
	// manifest in force is not taken back).
	return nil, nil
}
