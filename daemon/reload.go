package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
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
	d *Daemon
	// steps apply a prepared change in order (reloadSteps).
	steps []reloadStep

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
			if r.d.cfg.ManifestPath == "" {
				// The fleet endpoint: its manifest is built, not read;
				// SIGHUP re-reads the policy.
				r.reload(ctx, "SIGHUP", nil, nil)
				continue
			}
			data, err := os.ReadFile(r.d.cfg.ManifestPath)
			r.reload(ctx, "SIGHUP", data, err)
		case <-tick:
			data, err := os.ReadFile(r.d.cfg.ManifestPath)
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
		r.d.log.Error("reload rejected; the running manifest and policy stay in force", "trigger", trigger, "manifest", r.d.cfg.ManifestPath, "policy", r.d.cfg.PolicyPath, "err", err.Error())
		if _, aerr := r.d.al.Append(&audit.Record{Event: "manifest_reload_rejected", Reason: err.Error(),
			Data: map[string]any{"manifest": r.d.cfg.ManifestPath, "policy": r.d.cfg.PolicyPath, "trigger": trigger}}); aerr != nil {
			r.d.log.Error("reload rejection not audited", "err", aerr.Error())
		}
		return err
	}
	r.rejected = [32]byte{}
	if res != nil {
		r.sum = sum
		r.d.log.Info("manifest reloaded", "trigger", trigger, "added", res.Added, "removed", res.Removed, "changed", res.Changed,
			"kept", res.Kept, "buses_opened", res.Opened, "buses_closed", res.Closed, "buses_reopened", res.Reopened)
		if _, aerr := r.d.al.Append(&audit.Record{Event: "manifest_reload", Data: map[string]any{"manifest": r.d.cfg.ManifestPath, "trigger": trigger,
			"added": res.Added, "removed": res.Removed, "changed": res.Changed, "kept": res.Kept,
			"buses_opened": res.Opened, "buses_closed": res.Closed, "buses_reopened": res.Reopened}}); aerr != nil {
			r.d.log.Error("manifest reload not audited", "err", aerr.Error())
		}
	}
	if r.d.guard != nil { // the policy file is re-read by every applied reload
		r.d.log.Info("policy reloaded", "policy", r.d.cfg.PolicyPath, "tools", len(r.d.inForce.Policy().Tools))
		_, _ = r.d.al.Append(&audit.Record{Event: "policy_reload", Data: map[string]any{"policy": r.d.cfg.PolicyPath, "trigger": trigger}})
	}
	return nil
}

// apply prepares the change (parse, restart-only fields, policy) and
// runs it as one transaction over the reload steps. res is nil when the
// manifest is the one in force (a policy-only reload).
func (r *reloader) apply(ctx context.Context, sum [32]byte, data []byte) (*node.ReloadResult, error) {
	c, err := r.prepare(sum, data)
	if err != nil {
		return nil, err
	}
	if err := transact(ctx, r.steps, c); err != nil {
		return nil, err
	}
	return c.res, nil
}

// prepare reads the change: the manifest (only when its content changed,
// or a bus is still to be reopened) and the policy for it.
func (r *reloader) prepare(sum [32]byte, data []byte) (*change, error) {
	f := r.d.cfg
	c := &change{old: r.d.n.Manifest()}
	c.m = c.old
	// A bus whose reopening ran out of time is reopened by the next
	// reload, of the same file too (what the error advised).
	if f.ManifestPath != "" && (sum != r.sum || len(r.d.n.Reopening()) > 0) {
		// The bytes read once: what is validated is what is applied.
		m, err := ParseManifest(f.ManifestPath, data)
		if err != nil {
			return nil, err
		}
		if err := restartOnly(c.old, m); err != nil {
			return nil, err
		}
		if f.View != "" && m.View(f.View) == nil {
			return nil, fmt.Errorf("--view %q: the new manifest no longer declares this view; fix: keep the view, or restart physd with another --view", f.View)
		}
		c.m = m
	}
	var err error
	if r.d.guard != nil {
		if c.pol, c.g, err = LoadPolicy(f.PolicyPath, c.m, f.Version); err != nil {
			return nil, err
		}
		r.d.warnPolicy(c.pol, c.g)
	} else if c.pol, err = policy.ManifestOnly(c.m); err != nil {
		return nil, fmt.Errorf("the manifest's limits: %w", err)
	}
	return c, nil
}

// restartOnly refuses a manifest whose device id, network or audit
// section changed: they are read once, at start. It is the one check of
// the device id (the node's ledger, the audit trail and the mesh identity
// belong to it); node.Reload trusts its caller for it.
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

// startReload reloads on SIGHUP and, with --watch-manifest, when the
// manifest file changes, until the daemon's context ends.
func (d *Daemon) startReload(ctx context.Context) error {
	d.rl = &reloader{d: d, steps: d.reloadSteps(), sum: d.cfg.ManifestSum}
	go d.rl.run(ctx, d.cfg.WatchManifest)
	return nil
}
