package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/physd/physd/drivers/modbus/modbustest"
	"github.com/physd/physd/manifest"
)

// rolePolicy lets every do_ through the gate and requires ROLE.
const rolePolicy = `physmcp_policy_version: "0.1"
defaults:
  require_permission: ROLE
gate:
  fail_closed: deny
  l0:
    allow:
      - {name: every_do, tool: "do_*"}
  l1: {enabled: false}
`

// TestRejectedReloadKeepsThePolicyInForce: a manifest that passes
// validation but cannot be bound (two do_ capabilities writing one Modbus
// register, which only the open bus detects) is rejected together with
// the policy saved beside it — the policy in force stays the one that was,
// not the new file's (which would let a role run what it may not).
func TestRejectedReloadKeepsThePolicyInForce(t *testing.T) {
	bank := modbustest.NewBank(100)
	srv, err := modbustest.StartTCP("127.0.0.1:0", bank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	dir := t.TempDir()
	valve := doCap("valve", "int", `{type: modbus, bus: plc, table: holding, address: 1, data_type: uint16}`, "    range: {min: 0, max: 100}\n")
	manifestOf := func(caps ...string) string {
		return strings.NewReplacer("ADDR", srv.Addr, "BUSEXTRA", "", "CAPS", strings.Join(caps, "")).Replace(modbusManifest)
	}
	mpath, ppath := filepath.Join(dir, "physmcp.manifest.yml"), filepath.Join(dir, "physmcp.policy.yml")
	write := func(path, s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(mpath, manifestOf(valve))
	write(ppath, strings.Replace(rolePolicy, "ROLE", "supervisor", 1))
	cs, d := startStdio(t, "2025-11-25", daemonOpts{manifest: mpath, extra: []string{"--policy", ppath, "--stdio-role", "operator"}})
	if o := structured(t, call(t, cs, "do_valve", map[string]any{"value": 10, "idempotency_key": "before"})); o["status"] != "failed" || o["permission"] != "permission_insufficient" {
		t.Fatalf("an operator before the reload: %v", o)
	}
	// The new files: a second capability on the valve's register, and a
	// policy that lets role none actuate.
	write(mpath, manifestOf(valve, doCap("valve_alias", "int", `{type: modbus, bus: plc, table: holding, address: 1, data_type: uint16}`, "    range: {min: 0, max: 100}\n")))
	write(ppath, strings.Replace(rolePolicy, "ROLE", "none", 1))
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if reason := waitAudit(t, d.state, "manifest_reload_rejected", 1); !strings.Contains(reason, "both write") {
		t.Fatalf("rejection: %q", reason)
	}
	o := structured(t, call(t, cs, "do_valve", map[string]any{"value": 20, "idempotency_key": "after"}))
	if o["status"] != "failed" || o["permission"] != "permission_insufficient" {
		t.Errorf("after a rejected reload an operator runs do_valve (the rejected policy is in force): %v", o)
	}
	if v := bank.Holding(1, 1, 1)[0]; v != 0 {
		t.Errorf("the valve register holds %d", v)
	}
}

// TestWatchManifestNeverAppliesAHalfWrittenFile: with --watch-manifest, a
// file rewritten in place (truncated, then written; or written in two
// parts whose first part is itself a valid manifest with fewer
// capabilities) is never applied half-written: only a content that stayed
// the same from one check to the next is. Here every intermediate state
// lasts 60 ms against a 250 ms watch, twenty times over, and the file ends
// as it began: nothing may be reloaded or rejected. A broken file that
// stays is rejected (and audited) once, not at every check.
func TestWatchManifestNeverAppliesAHalfWrittenFile(t *testing.T) {
	orig, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	// The greenhouse with its capabilities last (as most manifests are):
	// a prefix cut at a capability drops capabilities and still validates.
	src := string(orig)
	tail := src[strings.Index(src, "\naudit:\n")+1:]
	head := src[:strings.Index(src, "\naudit:\n")+1]
	capsAt := strings.Index(head, "\ncapabilities:\n") + 1
	full := head[:capsAt] + tail + "\n" + head[capsAt:]
	half := full[:strings.LastIndex(full, "\n  - name: heater_zone_c\n")+1]
	if _, err := manifest.Parse("half.yml", []byte(half)); err != nil {
		t.Fatalf("the half file must validate for this test: %v", err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(path, []byte(full), 0o644); err != nil {
		t.Fatal(err)
	}
	_, d := startStdio(t, "2025-11-25", daemonOpts{manifest: path, extra: []string{"--watch-manifest", "250ms"}})
	for i := range 20 {
		if i%2 == 0 {
			// An editor's in-place save: truncate, then write.
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(path, []byte(half), 0o644); err != nil {
			t.Fatal(err)
		}
		time.Sleep(60 * time.Millisecond)
		if err := os.WriteFile(path, []byte(full), 0o644); err != nil {
			t.Fatal(err)
		}
		time.Sleep(157 * time.Millisecond) // not a multiple of the watch: the checks fall anywhere in the cycle
	}
	time.Sleep(600 * time.Millisecond) // two more checks of the final file
	if rs := auditEvents(t, d.state, "manifest_reload"); len(rs) > 0 {
		t.Errorf("a half-written file was applied %d times; first: %v", len(rs), rs[0]["data"])
	}
	if rs := auditEvents(t, d.state, "manifest_reload_rejected"); len(rs) > 0 {
		t.Errorf("a file being written was rejected %d times; first: %v", len(rs), rs[0]["reason"])
	}
	// A broken file left in place is rejected once, not at every check.
	if err := os.WriteFile(path, []byte(strings.Replace(full, "data_type: int\n", "data_type: integer\n", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitAudit(t, d.state, "manifest_reload_rejected", 1)
	time.Sleep(1500 * time.Millisecond)
	if rs := auditEvents(t, d.state, "manifest_reload_rejected"); len(rs) != 1 {
		t.Errorf("a broken file left in place for six checks was rejected %d times", len(rs))
	}
}
