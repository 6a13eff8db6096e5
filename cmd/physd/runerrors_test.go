package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestGoldenCommandLineErrors pins the one line each command-line and
// file mistake prints: it names the flag, file or command and says what
// to do (no bare "open …: no such file or directory", no 40-line usage).
func TestGoldenCommandLineErrors(t *testing.T) {
	gh := testdata("errors", "greenhouse.manifest.yml")
	missing := testdata("errors", "no_such_file.yml")
	cases := []struct {
		name string
		args []string
	}{
		{"run_policy_missing", []string{"run", "--manifest", gh, "--policy", missing, "--state", "unused"}},
		{"run_manifest_missing", []string{"run", "--manifest", missing}},
		{"validate_manifest_missing", []string{"validate", missing}},
		{"validate_policy_missing", []string{"validate", "--policy", missing, gh}},
		{"client_config_manifest_missing", []string{"client-config", "--manifest", missing}},
		{"run_token_file_missing", []string{"run", "--manifest", gh, "--state", "unused", "--auth-token-file", missing}},
		// An empty token file would serve without the token it asked for.
		{"run_token_file_empty", []string{"run", "--manifest", gh, "--state", "unused", "--auth-token-file", testdata("errors", "empty_token")}},
		{"run_unknown_flag", []string{"run", "--htttp", "127.0.0.1:8080", "--manifest", gh}},
		// The fleet uplink by flags: a manifest without network.fleet
		// needs both the URL and the site; two ways to authenticate.
		{"run_fleet_site_without_url", []string{"run", "--manifest", gh, "--state", "unused", "--fleet-site", "north"}},
		{"run_fleet_two_auth", []string{"run", "--manifest", gh, "--state", "unused", "--fleet-url", "nats://127.0.0.1:4222", "--fleet-site", "north", "--fleet-user", "gw", "--fleet-nkey-seed", missing}},
		{"run_fleet_bad_url", []string{"run", "--manifest", gh, "--state", "unused", "--fleet-url", "http://hub:4222", "--fleet-site", "north"}},
		{"run_bad_flag_value", []string{"run", "--shutdown-grace", "ten", "--manifest", gh}},
		{"client_config_unknown_flag", []string{"client-config", "--clinet", "vscode"}},
		{"lint_unknown_flag", []string{"lint", "--alow-do", "http://127.0.0.1:8080/mcp"}},
		{"unknown_command", []string{"rnu", "--manifest", gh}},
		{"unknown_command_flag_first", []string{"--manifest", gh}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(tc.args...)
			if hasJSONLine(stderr) {
				t.Errorf("a command-line error printed JSON log lines:\n%s", stderr)
			}
			if n := strings.Count(stderr, "\n"); n != 1 {
				t.Errorf("%d lines on stderr, want one:\n%s", n, stderr)
			}
			checkGolden(t, tc.name+".txt", fmt.Sprintf("$ physd %s\nexit %d\n--- stdout\n%s--- stderr\n%s", strings.Join(tc.args, " "), code, stdout, stderr))
		})
	}
}

// TestGoldenStartErrors pins what physd run prints when something it
// opens at start cannot be used: the port is taken, the state directory
// cannot be created, another physd holds the state database (named by
// its PID), a TLS file is missing. The JSON log line is for a collector;
// the text line (compared here) is for the person, or the MCP client's
// log, and names the flag and the fix.
func TestGoldenStartErrors(t *testing.T) {
	tmp := t.TempDir()
	gh := testdata("errors", "greenhouse.manifest.yml")

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()

	notDir := filepath.Join(tmp, "a_file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}

	held := filepath.Join(tmp, "held")
	holder := startHolder(t, gh, held)

	cases := []struct {
		name string
		args []string
	}{
		{"run_http_in_use", []string{"--http", taken.Addr().String(), "--state", filepath.Join(tmp, "s1")}},
		{"run_state_not_a_directory", []string{"--http", "127.0.0.1:0", "--state", filepath.Join(notDir, "state")}},
		{"run_state_locked", []string{"--http", "127.0.0.1:0", "--state", held}},
		{"run_tls_cert_missing", []string{"--http", "127.0.0.1:0", "--state", filepath.Join(tmp, "s2"),
			"--tls-cert", filepath.Join(tmp, "cert.pem"), "--tls-key", filepath.Join(tmp, "key.pem")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			args := append([]string{"run", "--manifest", gh}, tc.args...)
			cmd := physdCommand(ctx, args...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			text := textLines(stderr.String())
			got := fmt.Sprintf("$ physd %s\nexit %d\n--- stderr (without the JSON log)\n%s", strings.Join(args, " "), code, text)
			got = strings.NewReplacer(tmp, "$TMP", taken.Addr().String(), "$ADDR", strconv.Itoa(holder), "$PID").Replace(got)
			checkGolden(t, tc.name+".txt", got)
		})
	}
}

// startHolder runs a physd on state (its default without one) until the
// test ends and returns its PID once it holds the state database.
func startHolder(t *testing.T, manifest, state string) int {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	args := []string{"run", "--manifest", manifest, "--http", "127.0.0.1:0"}
	if state != "" {
		args = append(args, "--state", state)
	}
	cmd := physdCommand(ctx, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	lines := make(chan map[string]any, 64)
	go logLines(stderr, lines)
	waitFor(t, lines, "ready")
	go func() {
		for range lines { // keep the pipe drained
		}
	}()
	return cmd.Process.Pid
}

// textLines is stderr without its JSON log lines.
func textLines(s string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" && !strings.HasPrefix(l, "{") {
			b.WriteString(l)
		}
	}
	return b.String()
}

// TestGoldenLintUnauthorized: lint against a physd that refuses its
// token prints the server's reason and the fix, once, not the MCP
// client's bare "Unauthorized" for each protocol version.
func TestGoldenLintUnauthorized(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := physdCommand(ctx, "run", "--manifest", testdata("errors", "greenhouse.manifest.yml"), "--http", "127.0.0.1:0", "--state", t.TempDir())
	cmd.Env = append(cmd.Env, "PHYSD_AUTH_TOKEN=lint-golden-token-0123456789")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := make(chan map[string]any, 64)
	go logLines(stderr, lines)
	listening, _ := waitFor(t, lines, "listening")
	go func() {
		for range lines {
		}
	}()
	endpoint := listening["mcp"].(string)
	args := []string{"lint", "--header", "Authorization: Bearer wrong", endpoint}
	code, stdout, errOut := runCLI(args...)
	got := fmt.Sprintf("$ physd %s\nexit %d\n--- stdout\n%s--- stderr\n%s", strings.Join(args, " "), code, stdout, errOut)
	checkGolden(t, "lint_unauthorized.txt", strings.ReplaceAll(got, endpoint, "$URL"))
}
