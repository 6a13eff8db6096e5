package main

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/safety"
)

// reloadOnHUP re-reads the policy on SIGHUP. A policy that does not
// validate against the running manifest is rejected and the running one
// stays in force. The manifest itself is only re-read at start: a changed
// manifest file is reported, not applied.
// reloaded runs after a new policy is in force (the MCP server tells
// clients their tool lists may have changed: roles decide what is listed).
func reloadOnHUP(ctx context.Context, f runFlags, m *manifest.Manifest, guard *safety.Guard, al *audit.Log, log *slog.Logger, reloaded func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	manifestSum := fileSum(f.manifest)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		if fileSum(f.manifest) != manifestSum {
			log.Warn("the manifest file changed on disk; it is applied only at start: restart physd to use it", "manifest", f.manifest)
		}
		pol, g, err := loadPolicy(f.policy, m)
		if err != nil {
			log.Error("policy reload rejected; the running policy stays in force", "policy", f.policy, "err", err.Error())
			_, _ = al.Append(&audit.Record{Event: "policy_reload_rejected", Reason: err.Error(), Data: map[string]any{"policy": f.policy}})
			continue
		}
		for _, w := range policyWarnings(pol, g) {
			log.Warn("policy", "warning", w)
		}
		guard.Reload(pol, g)
		reloaded()
		log.Info("policy reloaded", "policy", f.policy, "tools", len(pol.Tools))
		_, _ = al.Append(&audit.Record{Event: "policy_reload", Data: map[string]any{"policy": f.policy}})
	}
}

func fileSum(path string) [32]byte {
	b, _ := os.ReadFile(path)
	return sha256.Sum256(b)
}
