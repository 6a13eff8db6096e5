package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// quickstartCommands are the physd command lines of the README's
// quickstart section (its sh blocks), continuations joined, comments
// dropped, "go run ./cmd/physd" replaced by the argument list after it.
func quickstartCommands(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile(repoPath("README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Quickstart")
	if !ok {
		t.Fatal("README.md has no Quickstart section")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var cmds [][]string
	inSh, line := false, ""
	sc := bufio.NewScanner(strings.NewReader(sec))
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "```sh"):
			inSh = true
			continue
		case strings.HasPrefix(l, "```"):
			inSh = false
			continue
		case !inSh:
			continue
		}
		if i := strings.Index(l, " #"); i >= 0 {
			l = l[:i]
		}
		line += strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(l), "\\")) + " "
		if strings.HasSuffix(strings.TrimSpace(l), "\\") {
			continue
		}
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "go run ./cmd/physd "); ok {
			cmds = append(cmds, strings.Fields(rest))
		}
		line = ""
	}
	return cmds
}

// TestQuickstartAsWritten follows the README's quickstart literally: the
// walkthrough daemon of step 1 on a fresh home, then step 4's
// client-config for a stdio client, and the entry it prints — command,
// args and env exactly — started as the client starts it while the
// daemon still runs, moving the vent. The only change to the README's
// commands: "go run ./cmd/physd" is the prebuilt binary, and the daemon
// listens on a free port instead of 8080 (tests run in parallel).
func TestQuickstartAsWritten(t *testing.T) {
	t.Parallel()
	var daemonArgs, configArgs []string
	for _, c := range quickstartCommands(t) {
		switch {
		case c[0] == "run" && daemonArgs == nil:
			daemonArgs = c
		case c[0] == "client-config" && !strings.Contains(strings.Join(c, " "), "--transport http"):
			configArgs = c
		}
	}
	if daemonArgs == nil || configArgs == nil {
		t.Fatalf("the quickstart should show physd run and a stdio client-config; found %v / %v", daemonArgs, configArgs)
	}

	home := t.TempDir()
	env := append(os.Environ(), "HOME="+home, "XDG_STATE_HOME="+filepath.Join(home, ".local", "state"),
		"XDG_CONFIG_HOME="+filepath.Join(home, ".config"), "XDG_CACHE_HOME="+filepath.Join(home, ".cache"), "STATE_DIRECTORY=")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// Step 1: the walkthrough daemon, on its default state directory.
	d := &daemon{cmd: exec.CommandContext(ctx, physdBin, append(daemonArgs, "--http", "127.0.0.1:0")...), stderr: &syncBuffer{}, done: make(chan error, 1)}
	d.cmd.Dir, d.cmd.Env, d.cmd.Stderr = repoPath("."), env, d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() { d.stop(t) })
	d.addr = d.stderr.logValue(t, "listening", "addr")
	if state := d.stderr.logValue(t, "ready", "state"); state != filepath.Join(home, ".local", "state", "physd", "gw_greenhouse_001") {
		t.Fatalf("the walkthrough daemon's state is %s, want the README's ~/.local/state/physd/gw_greenhouse_001", state)
	}

	// Step 4: client-config as written; its entry exactly.
	cc := exec.CommandContext(ctx, physdBin, configArgs...)
	cc.Dir, cc.Env = repoPath("."), env
	out, err := cc.Output()
	if err != nil {
		t.Fatalf("physd %s: %v", strings.Join(configArgs, " "), err)
	}
	var cfg struct {
		MCPServers map[string]struct {
			Command string            `json:"command"`
			Args    []string          `json:"args"`
			Env     map[string]string `json:"env"`
		} `json:"mcpServers"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil || len(cfg.MCPServers) != 1 {
		t.Fatalf("client-config printed %s (%v); want one mcpServers entry", out, err)
	}
	for _, s := range cfg.MCPServers {
		client := exec.CommandContext(ctx, s.Command, s.Args...)
		client.Env = env
		for k, v := range s.Env {
			client.Env = append(client.Env, k+"="+v)
		}
		clientErr := &syncBuffer{}
		client.Stderr = clientErr
		c := mcp.NewClient(&mcp.Implementation{Name: "quickstart", Version: "1"}, nil)
		cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: client}, nil)
		if err != nil {
			t.Fatalf("the client's physd (%s %q) did not start beside the walkthrough daemon: %v\n%s", s.Command, s.Args, err, clientErr.String())
		}
		defer cs.Close()
		r := structured(t, call(t, cs, "do_vent_zone_c", map[string]any{"value": 20, "idempotency_key": "quickstart-agent-1"}))
		if r["status"] != "success" || r["applied_value"] != float64(20) {
			t.Errorf("do_vent_zone_c over the client's stdio: %v\n%s", r, clientErr.String())
		}
	}
	if resp, err := http.Get(d.url("/readyz")); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("the walkthrough daemon is no longer ready beside the client's physd: %v", err)
	} else {
		resp.Body.Close()
	}
}
