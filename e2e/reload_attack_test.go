package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/physd/physd/drivers/modbus/modbustest"
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
