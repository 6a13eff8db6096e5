package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/gate"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/mesh"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/safety"
)

// reloadTimeout bounds one reload: the wait for device accesses on a bus
// whose settings changed (each bounded by its capability's timeout and
// settle time) and the reopening of that bus.
const reloadTimeout = 30 * time.Second

// reloader applies the manifest and policy files to the running daemon on
// SIGHUP, and with --watch-manifest when the manifest file changes. Both
// files are validated together, as `physd validate --policy` does; a
// manifest or policy that does not validate is rejected, logged and
// audited, and the running ones stay in force. What can change: the
// capabilities, buses, views, alarms and the policy. What needs a restart:
// device.id, network: and audit: (the ledger, the mesh identity and the
// audit trail belong to them) — such a manifest is rejected, saying so.
type reloader struct {
	f     runFlags
	n     *node.Node
	guard *safety.Guard // the policy in force, or the manifest-only guard
	// withPolicy: guard holds --policy (else the manifest's own limits).
	withPolicy bool
	al         *audit.Log
	log        *slog.Logger
	srv        *mcpserver.Server
	site       *mesh.Mesh // nil without a mesh
	// hooks follow a manifest now in force (alarms, history, MQTT
	// discovery, metrics); each must be quick.
	hooks []func(*manifest.Manifest)

	mu  sync.Mutex // one reload at a time
	sum [32]byte   // the manifest file's content in force
	// rejected is the content of the last manifest a reload rejected: the
	// watch does not try it again (a SIGHUP does).
	rejected [32]byte
}

// run reloads on SIGHUP, and every watch interval when the manifest file's
// content changed (0: no watch), until ctx ends.
func (r *reloader) run(ctx context.Context, watch time.Duration) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var tick <-chan time.Time
	if watch > 0 {
		t := time.NewTicker(watch)
		defer t.Stop()
		tick = t.C
	}
	// seen is the content the previous check read. A file watch by
	// content is robust to editors that replace the file, to bind mounts
	// and to symlink swaps (ConfigMaps), at the cost of one small read a
	// tick; a content is applied only once checks read it unchanged for a
	// whole interval, so a file being written in place (truncated, then
	// written in parts whose first part may itself be a valid manifest
	// with fewer capabilities) is not applied half-written.
	var seen [32]byte
	var seenAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			data, err := os.ReadFile(r.f.manifest)
			r.reload(ctx, "SIGHUP", data, err)
		case <-tick:
			data, err := os.ReadFile(r.f.manifest)
			sum := sha256.Sum256(data)
			if err != nil || sum != seen {
				seen, seenAt = sum, time.Now()
				continue // unreadable, or changed since the last check
			}
			if time.Since(seenAt) < watch {
				continue // not settled for a whole interval yet
			}
			r.mu.Lock()
			known := sum == r.sum || sum == r.rejected
			r.mu.Unlock()
			if !known {
				r.reload(ctx, "manifest file changed", data, nil)
			}
		}
	}
}

// reload validates data, the manifest file's content (readErr: it could
// not be read), with the policy file, and puts them in force. It returns
// the error that rejected them (nil when applied).
func (r *reloader) reload(ctx context.Context, trigger string, data []byte, readErr error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sum := sha256.Sum256(data)
	var res *node.ReloadResult
	err := readErr
	if err == nil {
		res, err = r.apply(ctx, sum, data)
	}
	if err != nil {
		r.rejected = sum
		r.log.Error("reload rejected; the running manifest and policy stay in force", "trigger", trigger, "manifest", r.f.manifest, "policy", r.f.policy, "err", err.Error())
		if _, aerr := r.al.Append(&audit.Record{Event: "manifest_reload_rejected", Reason: err.Error(),
			Data: map[string]any{"manifest": r.f.manifest, "policy": r.f.policy, "trigger": trigger}}); aerr != nil {
			r.log.Error("reload rejection not audited", "err", aerr.Error())
		}
		return err
	}
	r.rejected = [32]byte{}
	if res != nil {
		r.sum = sum
		r.log.Info("manifest reloaded", "trigger", trigger, "added", res.Added, "removed", res.Removed, "changed", res.Changed,
			"kept", res.Kept, "buses_opened", res.Opened, "buses_closed", res.Closed, "buses_reopened", res.Reopened)
		if _, aerr := r.al.Append(&audit.Record{Event: "manifest_reload", Data: map[string]any{"manifest": r.f.manifest, "trigger": trigger,
			"added": res.Added, "removed": res.Removed, "changed": res.Changed, "kept": res.Kept,
			"buses_opened": res.Opened, "buses_closed": res.Closed, "buses_reopened": res.Reopened}}); aerr != nil {
			r.log.Error("manifest reload not audited", "err", aerr.Error())
		}
	}
	if r.withPolicy { // the policy file is re-read by every applied reload
		r.log.Info("policy reloaded", "policy", r.f.policy, "tools", len(r.guard.Policy().Tools))
		_, _ = r.al.Append(&audit.Record{Event: "policy_reload", Data: map[string]any{"policy": r.f.policy, "trigger": trigger}})
	}
	return nil
}

// apply does the work of reload. res is nil when the manifest is the one
// in force (a policy-only reload).
func (r *reloader) apply(ctx context.Context, sum [32]byte, data []byte) (res *node.ReloadResult, err error) {
	old := r.n.Manifest()
	m := old
	// A bus whose reopening ran out of time is reopened by the next
	// reload, of the same file too (what the error advised).
	if sum != r.sum || len(r.n.Reopening()) > 0 {
		// The bytes read once: what is validated is what is applied.
		if m, err = parseManifest(r.f.manifest, data); err != nil {
			return nil, err
		}
		if err := restartOnly(old, m); err != nil {
			return nil, err
		}
		if r.f.view != "" && m.View(r.f.view) == nil {
			return nil, fmt.Errorf("--view %q: the new manifest no longer declares this view; fix: keep the view, or restart physd with another --view", r.f.view)
		}
	}
	var pol *policy.Policy
	var g *gate.Gate
	if r.withPolicy {
		if pol, g, err = loadPolicy(r.f.policy, m); err != nil {
			return nil, err
		}
		for _, w := range policyWarnings(pol, g) {
			r.log.Warn("policy", "warning", w)
		}
	} else if pol, err = policy.ManifestOnly(m); err != nil {
		return nil, fmt.Errorf("the manifest's limits: %w", err)
	}
	if m == old {
		r.guard.Reload(pol, g)
	} else {
		// The new rules go in force just before the new binding (a call
		// decided between the two is judged by the new policy on the old
		// binding, and one whose capability the reload redefines never
		// actuates: node.CodeManifestReloaded), and only when the manifest
		// could be bound: a rejected manifest leaves the policy that was.
		rctx, cancel := context.WithTimeout(ctx, reloadTimeout)
		defer cancel()
		prevPol, prevGate := r.guard.Policy(), r.guard.Gate()
		rr, err := r.n.ReloadWith(rctx, m, func() { r.guard.Reload(pol, g) })
		if err != nil && r.n.Manifest() == old {
			// Not applied, or put back (a reopened bus could not bind
			// it): the rules in force before go back with it.
			r.guard.Reload(prevPol, prevGate)
			return nil, err
		}
		if err != nil {
			r.log.Error("manifest reload: applied with an error", "err", err.Error())
		}
		res = &rr
		if r.site != nil {
			if err := r.site.UpdateCatalog(mesh.CatalogFromManifest(m)); err != nil {
				r.log.Error("the mesh catalog was not updated; peers see the previous capabilities until the next reload", "err", err.Error())
			}
		}
		for _, h := range r.hooks {
			h(m)
		}
	}
	r.srv.ManifestReloaded()
	return res, nil
}

// restartOnly refuses a manifest whose device id, network or audit
// section changed: they are read once, at start.
func restartOnly(old, m *manifest.Manifest) error {
	var changed []string
	if old.Device.ID != m.Device.ID {
		changed = append(changed, fmt.Sprintf("device.id (%q → %q)", old.Device.ID, m.Device.ID))
	}
	if !sameJSON(old.Network, m.Network) {
		changed = append(changed, "network: (protocols, ports, mesh)")
	}
	if !sameJSON(old.Audit, m.Audit) {
		changed = append(changed, "audit:")
	}
	if len(changed) == 0 {
		return nil
	}
	return fmt.Errorf("%s: a reload cannot change %s; fix: restart physd to apply them (or undo them in the file)", m.Path, strings.Join(changed, ", "))
}

func sameJSON(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}
