package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestGoldenErrors pins the text an operator reads for each bad input
// (node_exporter-style golden files): every problem once, at its own line,
// with a fix, and nothing invented by an earlier problem.
func TestGoldenErrors(t *testing.T) {
	gh := testdata("errors", "greenhouse.manifest.yml")
	validate := func(policy string) []string {
		return []string{"validate", "--policy", testdata("errors", policy), gh}
	}
	cases := []struct {
		name string
		args []string
	}{
		// A string in an integer field: one error each, never an extra,
		// location-less "0 is out of range".
		{"validate_policy_int_string", validate("policy_int_string.yml")},
		// A misspelt zone: one error at the timezone line, and no
		// "unknown time window" for the rules that name the window.
		{"validate_policy_timezone", validate("policy_timezone.yml")},
		{"validate_policy_timezone_case", validate("policy_timezone_case.yml")},
		// An unquoted version is a number, refused as the manifest's is.
		{"validate_policy_version", validate("policy_version.yml")},
		// A range_guard reaching past the capability's range.
		{"validate_policy_range_guard", validate("policy_range_guard.yml")},
		// defaults and rate problems at their lines, with one fix each.
		{"validate_policy_defaults", validate("policy_defaults.yml")},
		// max_change and two-person approval rules at their lines.
		{"validate_policy_guards", validate("policy_guards.yml")},
		// A bus type without a driver points at its type: line.
		{"validate_bus_type", []string{"validate", testdata("errors", "manifest_bus_type.yml")}},
		// run prints what validate prints, as text, before any JSON log.
		{"run_bus_type", []string{"run", "--manifest", testdata("errors", "manifest_bus_type.yml"), "--state", "unused"}},
		{"run_manifest_problems", []string{"run", "--manifest", testdata("errors", "manifest_problems.yml"), "--state", "unused"}},
		{"run_policy_timezone", []string{"run", "--manifest", gh, "--policy", testdata("errors", "policy_timezone.yml"), "--state", "unused"}},
		{"run_no_manifest", []string{"run"}},
		// views: each bad selector at its line; a good file lists its
		// views, warns about one that selects nothing here; run --view
		// names the declared views.
		{"validate_views", []string{"validate", testdata("errors", "manifest_views.yml")}},
		// families: members that one tool cannot type, two in one zone, a
		// family named like a capability, a bad name.
		{"validate_families", []string{"validate", testdata("errors", "manifest_families.yml")}},
		{"validate_views_ok", []string{"validate", testdata("errors", "manifest_views_ok.yml")}},
		// A default tool list longer than MCP clients take: the warning
		// names the fixes (families, views, expose); with defaults:
		// {expose: false} the points are observed and the list is short.
		{"validate_many_tools", []string{"validate", testdata("errors", "manifest_many_tools.yml")}},
		{"validate_many_unexposed", []string{"validate", testdata("errors", "manifest_many_unexposed.yml")}},
		// The Pi parts' bindings: a PWM frequency, duty mapping, initial
		// value and data type; an SPI channel and part; 1-Wire ids; I²C
		// profile points, addresses and gains. One bus per file: validate
		// reports each bus's capabilities in order.
		{"validate_pwm", []string{"validate", testdata("errors", "manifest_pwm.yml")}},
		// Two do_ capabilities on one Modbus register, found offline
		// (validate and a manifest reload never open the bus for it).
		{"validate_modbus_shared", []string{"validate", testdata("errors", "manifest_modbus_shared.yml")}},
		{"validate_spi", []string{"validate", testdata("errors", "manifest_spi.yml")}},
		{"validate_onewire", []string{"validate", testdata("errors", "manifest_onewire.yml")}},
		{"validate_i2c_profile", []string{"validate", testdata("errors", "manifest_i2c_profile.yml")}},
		// MQTT flags: a URL that is not MQTT, a CA with a plain URL, a
		// prefix with a wildcard; each names the flag and the fix.
		{"run_mqtt_url", []string{"run", "--manifest", gh, "--state", "unused", "--mqtt-url", "http://broker:1883"}},
		{"run_mqtt_ca_plain", []string{"run", "--manifest", gh, "--state", "unused", "--mqtt-url", "tcp://broker:1883", "--mqtt-ca", "ca.pem"}},
		{"run_mqtt_prefix", []string{"run", "--manifest", gh, "--state", "unused", "--mqtt-url", "tcp://broker:1883", "--mqtt-prefix", "site/#"}},
		{"run_mqtt_username_only", []string{"run", "--manifest", gh, "--state", "unused", "--mqtt-username", "gw"}},
		{"run_unknown_view", []string{"run", "--manifest", testdata("errors", "manifest_views_ok.yml"), "--stdio", "--view", "heatng", "--state", "unused"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(tc.args...)
			if tc.args[0] == "run" && hasJSONLine(stderr) {
				t.Errorf("run printed JSON log lines for a configuration error:\n%s", stderr)
			}
			checkGolden(t, tc.name+".txt", fmt.Sprintf("$ physd %s\nexit %d\n--- stdout\n%s--- stderr\n%s", strings.Join(tc.args, " "), code, stdout, stderr))
		})
	}
}

// TestRunAndValidateAgree: run refuses a bad policy with the very lines
// validate prints.
func TestRunAndValidateAgree(t *testing.T) {
	gh, pol := testdata("errors", "greenhouse.manifest.yml"), testdata("errors", "policy_int_string.yml")
	vcode, _, verr := runCLI("validate", "--policy", pol, gh)
	rcode, _, rerr := runCLI("run", "--manifest", gh, "--policy", pol, "--state", t.TempDir())
	if vcode != 1 || rcode != 1 || verr != rerr {
		t.Errorf("validate (exit %d):\n%s\nrun (exit %d):\n%s", vcode, verr, rcode, rerr)
	}
}

// TestStateDirFallbackRefused: with $HOME unset and no state directory
// named, run refuses rather than keeping the ledger in /tmp, and names the
// fix; --state-in-tmp accepts it.
func TestStateDirFallbackRefused(t *testing.T) {
	for _, v := range []string{"HOME", "STATE_DIRECTORY", "XDG_STATE_HOME"} {
		t.Setenv(v, "")
	}
	gh := testdata("errors", "greenhouse.manifest.yml")
	code, _, stderr := runCLI("run", "--manifest", gh)
	checkGolden(t, "run_no_state_dir.txt", fmt.Sprintf("exit %d\n--- stderr\n%s", code, stderr))

	dir, err := stateDir(runFlags{stateInTmp: true}, "gw_1")
	if err != nil || !strings.HasSuffix(dir, "/physd/gw_1") {
		t.Errorf("--state-in-tmp: %q, %v", dir, err)
	}
}

func TestHelpExitsZero(t *testing.T) {
	for _, cmd := range []string{"run", "validate", "client-config"} {
		code, stdout, stderr := runCLI(cmd, "--help")
		if code != 0 || !strings.Contains(stdout, "Usage of physd "+cmd) || stderr != "" {
			t.Errorf("physd %s --help: exit %d\nstdout:\n%s\nstderr:\n%s", cmd, code, stdout, stderr)
		}
	}
	if code, _, stderr := runCLI("run", "--no-such-flag"); code != 2 || !strings.Contains(stderr, "no-such-flag") {
		t.Errorf("a bad flag: exit %d, stderr %q", code, stderr)
	}
}

// TestStoppedLine: on SIGTERM the log ends with "stopped", after the
// ledger and audit are closed.
func TestStoppedLine(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := physdCommand(ctx, "run", "--manifest", testdata("errors", "greenhouse.manifest.yml"), "--http", "127.0.0.1:0", "--state", t.TempDir())
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan map[string]any, 64)
	go logLines(stderr, lines)
	waitFor(t, lines, "ready")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var last map[string]any
	for l := range lines {
		last = l
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("physd exited with %v after SIGTERM", err)
	}
	if last["msg"] != "stopped" {
		t.Errorf("last log line = %v, want msg stopped", last)
	}
}
