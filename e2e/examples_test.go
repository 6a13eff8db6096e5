package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestModbusExampleRunScript: examples/modbus/run.sh, given PHYSD, starts
// that physd (not one it builds) on the example's manifest and policy, and
// over HTTP the policy's demo operator token moves the pump while the
// viewer's is refused with the role it lacks. Not parallel: the example
// uses its documented fixed ports (127.0.0.1:8080 and :5020).
func TestModbusExampleRunScript(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:8080", "127.0.0.1:5020"} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("the example's port %s is taken: %v", addr, err)
		}
		l.Close()
	}
	dir := t.TempDir()
	used := filepath.Join(dir, "used")
	wrapper := filepath.Join(dir, "physd")
	script := "#!/bin/sh\necho \"$@\" >> " + used + "\nexec " + physdBin + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, repoPath("examples/modbus/run.sh"))
	cmd.Env = append(os.Environ(), "PHYSD="+wrapper)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run.sh: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(used); err != nil || !strings.Contains(string(b), "run --manifest examples/modbus/physmcp.manifest.yml --policy examples/modbus/physmcp.policy.yml") {
		t.Errorf("run.sh did not start the PHYSD it was given (%v): %q\n%s", err, b, out)
	}
	viewer, operator, ok := strings.Cut(string(out), "== do_pump_speed 80 as the operator console:")
	if !ok || !strings.Contains(viewer, "'permission': 'permission_insufficient'") || !strings.Contains(viewer, "needs the operator role") ||
		!strings.Contains(operator, "'status': 'success'") || !strings.Contains(operator, "'verified': True") {
		t.Errorf("want the viewer refused and the operator's do_pump_speed verified:\n%s", out)
	}
}

// TestFleetExampleRunScript: examples/fleet/run.sh, given PHYSD, brings up
// the fleet endpoint with its hub embedded and the three sites of
// sites.sh, and shows the fleet's tools, a value, a can_do across the
// sites, a do_ run by north and a fleet-only token refused by north. The
// example uses its documented fixed ports (127.0.0.1:4222, :8090 to
// :8093), which no other test uses and which are not ephemeral ports:
// parallel (it skips when another process holds them).
func TestFleetExampleRunScript(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"127.0.0.1:4222", "127.0.0.1:8090", "127.0.0.1:8091", "127.0.0.1:8092", "127.0.0.1:8093"} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("the example's port %s is taken: %v", addr, err)
		}
		l.Close()
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, repoPath("examples/fleet/run.sh"))
	cmd.Env = append(os.Environ(), "PHYSD="+physdBin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run.sh: %v\n%s", err, out)
	}
	for _, want := range []string{
		"'do_heater', 'do_irrigation', 'do_vent', 'read_humidity'",
		"'quality': 'good', 'site': 'south', 'source': 'gw_greenhouse_001'",
		`"south",`, `"not_served"`,
		"{'status': 'success', 'source': 'gw_greenhouse_001', 'applied_value': 30",
		"{'status': 'failed', 'permission': 'permission_insufficient', 'code': 'unauthenticated'}",
		"('north', 'gw_greenhouse_001', 'up', ['read', 'can_do', 'do'])",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("run.sh output has no %q:\n%s", want, out)
		}
	}
}
