package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// server is one entry of a client's MCP configuration, as the three
// clients spell it.
type server struct {
	Type    string            `json:"type"`
	Command string            `json:"command"`
	Args    []string          `json:"args"`
	Env     map[string]string `json:"env"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
}

// clientFile is the union of the three clients' file layouts.
type clientFile struct {
	MCPServers map[string]server `json:"mcpServers"` // Claude Desktop, Cursor
	Servers    map[string]server `json:"servers"`    // VS Code
	Inputs     []struct {
		Type        string `json:"type"`
		ID          string `json:"id"`
		Description string `json:"description"`
		Password    bool   `json:"password"`
	} `json:"inputs"`
}

// clientConfigFor runs physd client-config and parses what it prints,
// failing unless it is exactly one server entry in the client's layout.
func clientConfigFor(t *testing.T, args ...string) (server, clientFile) {
	t.Helper()
	code, stdout, stderr := runCLI(append([]string{"client-config"}, args...)...)
	if code != 0 {
		t.Fatalf("client-config %v: exit %d: %s", args, code, stderr)
	}
	var f clientFile
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("client-config %v printed what is not a client config: %v\n%s", args, err, stdout)
	}
	entries := f.MCPServers
	if slices.Contains(args, "vscode") {
		entries = f.Servers
		if f.MCPServers != nil {
			t.Errorf("VS Code reads servers, not mcpServers:\n%s", stdout)
		}
	} else if f.Servers != nil || f.Inputs != nil {
		t.Errorf("%v: Claude Desktop and Cursor read mcpServers only:\n%s", args, stdout)
	}
	if len(entries) != 1 || entries["gw_greenhouse_001"].Command+entries["gw_greenhouse_001"].URL == "" {
		t.Fatalf("want one server named after device.id, got:\n%s", stdout)
	}
	// A person pastes and edits this: "<paste the token here>" must read
	// as written, not as \u003c…\u003e.
	if strings.Contains(stdout, `\u00`) {
		t.Errorf("client-config %v escapes characters a person has to read:\n%s", args, stdout)
	}
	if !strings.HasPrefix(stderr, "paste into ") {
		t.Errorf("stderr should say where the snippet goes: %q", stderr)
	}
	return entries["gw_greenhouse_001"], f
}

func listTools(t *testing.T, ctx context.Context, tr mcp.Transport) []string {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "client-config-test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer cs.Close()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	return names
}

// TestClientConfigStdio: each client's stdio entry, started exactly as the
// client would start it, is a physd serving the manifest's tools, on a
// state directory of that client's own.
func TestClientConfigStdio(t *testing.T) {
	xdg := t.TempDir()
	t.Setenv("XDG_STATE_HOME", xdg)
	manifest, _ := filepath.Abs(testdata("errors", "greenhouse.manifest.yml"))
	policy, _ := filepath.Abs(testdata("..", "..", "..", "examples", "greenhouse", "physmcp.policy.yml"))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for _, client := range []string{"claude-desktop", "vscode", "cursor"} {
		t.Run(client, func(t *testing.T) {
			s, _ := clientConfigFor(t, "--manifest", testdata("errors", "greenhouse.manifest.yml"), "--client", client,
				"--policy", policy, "--stdio-role", "operator", "--binary", os.Args[0])
			state := filepath.Join(xdg, "physd-"+client, "gw_greenhouse_001")
			want := []string{"run", "--manifest", manifest, "--stdio", "--state", state, "--policy", policy, "--stdio-role", "operator"}
			if s.Command != os.Args[0] || !slices.Equal(s.Args, want) {
				t.Fatalf("command %q %q, want %q %q", s.Command, s.Args, os.Args[0], want)
			}
			if client == "vscode" && s.Type != "stdio" {
				t.Errorf("VS Code needs type stdio, got %q", s.Type)
			}
			cmd := exec.Command(s.Command, s.Args...)
			cmd.Env = append(os.Environ(), asPhysd+"=1")
			tools := listTools(t, ctx, &mcp.CommandTransport{Command: cmd})
			if !slices.Contains(tools, "can_do") || !slices.Contains(tools, "do_heater_zone_a") || !slices.Contains(tools, "read_temperature_zone_a") {
				t.Errorf("tools = %v", tools)
			}
			if _, err := os.Stat(filepath.Join(state, "physd.db")); err != nil {
				t.Errorf("the client's physd kept no ledger in its state directory: %v", err)
			}
		})
	}
}

// TestClientConfigBesideDaemon: with a physd run on the default state
// directory (the README's walkthrough daemon), the stdio entry
// client-config prints starts a physd that serves beside it; the same
// entry on the daemon's state directory exits with the error that names
// the daemon's PID and the fix.
func TestClientConfigBesideDaemon(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	gh := testdata("errors", "greenhouse.manifest.yml")
	daemonPID := startHolder(t, gh, "") // no --state: the default
	s, _ := clientConfigFor(t, "--manifest", gh, "--binary", os.Args[0])
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.Command(s.Command, s.Args...)
	cmd.Env = append(os.Environ(), asPhysd+"=1")
	if tools := listTools(t, ctx, &mcp.CommandTransport{Command: cmd}); !slices.Contains(tools, "do_vent_zone_c") {
		t.Errorf("tools = %v", tools)
	}

	i := slices.Index(s.Args, "--state")
	if i < 0 {
		t.Fatalf("no --state in %q", s.Args)
	}
	shared := slices.Clone(s.Args)
	shared[i+1], _ = stateDir(runFlags{}, "gw_greenhouse_001")
	out, err := physdCommand(ctx, shared...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), fmt.Sprintf("locked by another physd process (PID %d,", daemonPID)) ||
		!strings.Contains(string(out), "--state DIR") {
		t.Errorf("a stdio physd on the daemon's state directory: %v\n%s", err, out)
	}
}

// bearer adds headers to every request, as a client does with the
// configured ones.
type bearer map[string]string

func (h bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestClientConfigHTTP: each client's HTTP entry, with its token
// placeholder filled the way that client fills it, is accepted by a physd
// that requires the token; without the token the same physd refuses.
func TestClientConfigHTTP(t *testing.T) {
	const token = "client-config-test-token-0123456789"
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := physdCommand(ctx, "run", "--manifest", testdata("errors", "greenhouse.manifest.yml"), "--http", "127.0.0.1:0", "--state", t.TempDir())
	cmd.Env = append(cmd.Env, "PHYSD_AUTH_TOKEN="+token)
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
		for range lines { // keep the pipe drained
		}
	}()
	endpoint := listening["mcp"].(string)

	resp, err := http.Post(endpoint, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("physd without a token answered %d, want 401 (the test would prove nothing)", resp.StatusCode)
	}

	// What each client substitutes for its placeholder.
	fill := map[string]func(string) string{
		"vscode": func(s string) string { return strings.ReplaceAll(s, "${input:physd-token}", token) },
		"cursor": func(s string) string { return strings.ReplaceAll(s, "${env:PHYSD_TOKEN}", token) },
	}
	for _, client := range []string{"vscode", "cursor", "claude-desktop"} {
		t.Run(client, func(t *testing.T) {
			s, f := clientConfigFor(t, "--manifest", testdata("errors", "greenhouse.manifest.yml"), "--client", client, "--transport", "http", "--url", endpoint)
			headers := bearer{}
			switch client {
			case "vscode":
				if s.Type != "http" || s.URL != endpoint || len(f.Inputs) != 1 || f.Inputs[0].ID != "physd-token" || !f.Inputs[0].Password {
					t.Fatalf("VS Code entry: %+v, inputs %+v", s, f.Inputs)
				}
				for k, v := range s.Headers {
					headers[k] = fill[client](v)
				}
			case "cursor":
				if s.URL != endpoint {
					t.Fatalf("Cursor entry: %+v", s)
				}
				for k, v := range s.Headers {
					headers[k] = fill[client](v)
				}
			case "claude-desktop":
				// npx runs mcp-remote, which expands ${VAR} in --header from
				// the env the entry gives it; the user pastes the token there.
				if s.Command != "npx" || !slices.Contains(s.Args, mcpRemote) || !slices.Contains(s.Args, endpoint) || slices.Contains(s.Args, "--allow-http") {
					t.Fatalf("Claude Desktop entry: %+v", s)
				}
				i := slices.Index(s.Args, "--header")
				if i < 0 || i+1 >= len(s.Args) {
					t.Fatalf("no --header in %q", s.Args)
				}
				env := map[string]string{}
				for k, v := range s.Env {
					env[k] = strings.ReplaceAll(v, "<paste the token here>", token)
				}
				k, v, _ := strings.Cut(os.Expand(s.Args[i+1], func(k string) string { return env[k] }), ":")
				headers[k] = v
			}
			if headers["Authorization"] != "Bearer "+token {
				t.Fatalf("%s sends Authorization %q", client, headers["Authorization"])
			}
			tools := listTools(t, ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: headers}, MaxRetries: -1})
			if !slices.Contains(tools, "can_do") {
				t.Errorf("tools = %v", tools)
			}
		})
	}
}

func TestClientConfigRefusesBadInput(t *testing.T) {
	gh := testdata("errors", "greenhouse.manifest.yml")
	for _, args := range [][]string{
		{"--manifest", gh, "--client", "zed"},
		{"--manifest", gh, "--transport", "sse"},
		{"--manifest", gh, "--transport", "http", "--url", "127.0.0.1:8080"},
		{"--manifest", gh, "--stdio-role", "root", "--binary", "/usr/bin/physd"},
		{},
	} {
		if code, stdout, stderr := runCLI(append([]string{"client-config"}, args...)...); code != 2 || stdout != "" || stderr == "" {
			t.Errorf("client-config %v: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
	if code, _, stderr := runCLI("client-config", "--manifest", testdata("errors", "manifest_bus_type.yml")); code != 1 || !strings.Contains(stderr, "manifest_bus_type.yml:28:11") {
		t.Errorf("a bad manifest: exit %d, %q", code, stderr)
	}
}
