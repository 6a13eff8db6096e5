package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/physd/physd/policy"
)

// mcpRemote is the stdio-to-HTTP bridge Claude Desktop needs for a server
// it does not start itself (its config file has no url entries), pinned.
const mcpRemote = "mcp-remote@0.15.1"

// Client kinds and where each keeps its MCP configuration.
var clientKinds = map[string]string{
	"claude-desktop": "claude_desktop_config.json (macOS: ~/Library/Application Support/Claude/, Windows: %APPDATA%\\Claude\\, Linux: ~/.config/Claude/); merge the entry into mcpServers, then quit and restart Claude Desktop",
	"vscode":         ".vscode/mcp.json in the workspace (or the user mcp.json: command palette, \"MCP: Open User Configuration\"); merge servers and inputs",
	"cursor":         ".cursor/mcp.json in the project or ~/.cursor/mcp.json; merge the entry into mcpServers",
}

// clientConfig is what `physd client-config` was asked for.
type clientConfig struct {
	client, transport, name string
	// stdio: the client starts physd itself.
	binary, manifest, policy, role string
	// state is the stdio physd's own state directory: never the one a
	// daemon on this machine uses, whose database lock would make the
	// client's physd exit at start (seen only in the client's MCP log).
	state string
	// http: the client connects to a running physd.
	url     string
	noToken bool
}

func cmdClientConfig(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("physd client-config", flag.ContinueOnError)
	var cc clientConfig
	manifestPath := fs.String("manifest", "", "physmcp.manifest.yml of the physd the client uses (required; names the server)")
	fs.StringVar(&cc.client, "client", "claude-desktop", "claude-desktop, vscode or cursor")
	fs.StringVar(&cc.transport, "transport", "stdio", "stdio: the client starts its own physd (a laptop, the simulator); http: the client connects to a running physd (a gateway)")
	fs.StringVar(&cc.name, "name", "", "the server's name in the client (default: the manifest's device.id)")
	fs.StringVar(&cc.binary, "binary", "", "stdio: the physd binary the client starts (default: this one, or physd on $PATH)")
	fs.StringVar(&cc.policy, "policy", "", "stdio: the physmcp.policy.yml that physd enforces")
	fs.StringVar(&cc.role, "stdio-role", "none", "stdio: the role of the client: none, viewer, operator, supervisor or admin")
	fs.StringVar(&cc.state, "state", "", "stdio: the state directory of the physd the client starts (default $XDG_STATE_HOME/physd-<client>/<device id>, else ~/.local/state/physd-<client>/<device id>: its own, so it runs beside a physd run on the same manifest)")
	fs.StringVar(&cc.url, "url", "http://127.0.0.1:8080/mcp", "http: the MCP endpoint (keep physd on loopback and tunnel: ssh -L 8080:127.0.0.1:8080 pi@gateway)")
	fs.BoolVar(&cc.noToken, "no-token", false, "http: send no bearer token (a physd without --auth-token-file and policy tokens)")
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if *manifestPath == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: physd client-config --manifest FILE [--client claude-desktop|vscode|cursor] [--transport stdio|http] [flags]; physd client-config -h lists the flags")
		return 2
	}
	m, err := loadManifest("--manifest", *manifestPath)
	if err != nil {
		fmt.Fprintln(stderr, prefixed("physd client-config", err))
		return 1
	}
	if cc.name == "" {
		cc.name = m.Device.ID
	}
	if cc.manifest, err = filepath.Abs(*manifestPath); err != nil {
		fmt.Fprintln(stderr, "physd client-config:", err)
		return 1
	}
	if cc.policy != "" {
		if _, _, err := loadPolicy(cc.policy, m); err != nil {
			fmt.Fprintln(stderr, prefixed("physd client-config", err))
			return 1
		}
		cc.policy, _ = filepath.Abs(cc.policy)
	}
	if cc.transport == "stdio" {
		if cc.state, err = clientStateDir(cc.state, cc.client, m.Device.ID); err != nil {
			fmt.Fprintln(stderr, "physd client-config:", err)
			return 2
		}
	}
	if cc.transport == "stdio" && cc.binary == "" {
		var note string
		cc.binary, note = defaultBinary()
		if note != "" {
			fmt.Fprintln(stderr, "note:", note)
		}
	}
	out, err := cc.render()
	if err != nil {
		fmt.Fprintln(stderr, "physd client-config:", err)
		return 2
	}
	_, _ = stdout.Write(out)
	fmt.Fprintf(stderr, "paste into %s\n", clientKinds[cc.client])
	if cc.transport == "stdio" {
		fmt.Fprintf(stderr, "the physd it starts keeps its ledger and audit trail in %s, its own: it runs beside a physd run on the default state directory\n", cc.state)
	}
	return 0
}

// render builds the client's configuration as indented JSON.
func (cc clientConfig) render() ([]byte, error) {
	if _, ok := clientKinds[cc.client]; !ok {
		return nil, fmt.Errorf("--client %q: use claude-desktop, vscode or cursor", cc.client)
	}
	var server map[string]any
	var inputs []any
	switch cc.transport {
	case "stdio":
		if policy.RoleLevel(cc.role) < 0 {
			return nil, fmt.Errorf("--stdio-role %q: use none, viewer, operator, supervisor or admin", cc.role)
		}
		args := []string{"run", "--manifest", cc.manifest, "--stdio", "--state", cc.state}
		if cc.policy != "" {
			args = append(args, "--policy", cc.policy)
		}
		if cc.role != "none" {
			args = append(args, "--stdio-role", cc.role)
		}
		server = map[string]any{"command": cc.binary, "args": args}
		if cc.client == "vscode" {
			server["type"] = "stdio"
		}
	case "http":
		u, err := url.Parse(cc.url)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("--url %q: give the MCP endpoint, e.g. http://127.0.0.1:8080/mcp", cc.url)
		}
		server, inputs = cc.httpServer(u)
	default:
		return nil, fmt.Errorf("--transport %q: use stdio or http", cc.transport)
	}
	doc := map[string]any{"mcpServers": map[string]any{cc.name: server}}
	if cc.client == "vscode" {
		doc = map[string]any{"servers": map[string]any{cc.name: server}}
		if inputs != nil {
			doc["inputs"] = inputs
		}
	}
	// Not HTML-escaped: the user reads and edits "<paste the token here>".
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	err := enc.Encode(doc)
	return b.Bytes(), err
}

// tokenInput is the VS Code input that prompts for the bearer token once
// and keeps it in VS Code's secret storage, out of mcp.json.
const tokenInput = "physd-token"

// httpServer is the entry for a running physd at u, sending the bearer
// token the way each client keeps secrets out of its config file.
func (cc clientConfig) httpServer(u *url.URL) (map[string]any, []any) {
	switch cc.client {
	case "vscode":
		s := map[string]any{"type": "http", "url": u.String()}
		if cc.noToken {
			return s, nil
		}
		s["headers"] = map[string]string{"Authorization": "Bearer ${input:" + tokenInput + "}"}
		return s, []any{map[string]any{"type": "promptString", "id": tokenInput, "description": "physd bearer token (" + cc.name + ")", "password": true}}
	case "cursor":
		s := map[string]any{"url": u.String()}
		if !cc.noToken {
			s["headers"] = map[string]string{"Authorization": "Bearer ${env:PHYSD_TOKEN}"}
		}
		return s, nil
	}
	// Claude Desktop starts only local commands: mcp-remote (Node) bridges
	// stdio to physd's HTTP endpoint. It expands ${PHYSD_AUTH_HEADER} from
	// its environment; the header has no space after the colon because
	// some clients split arguments on spaces.
	args := []string{"-y", mcpRemote, u.String()}
	if u.Scheme == "http" && !isLoopbackHost(u.Hostname()) {
		args = append(args, "--allow-http")
	}
	s := map[string]any{"command": "npx", "args": args}
	if !cc.noToken {
		s["args"] = append(args, "--header", "Authorization:${PHYSD_AUTH_HEADER}")
		s["env"] = map[string]string{"PHYSD_AUTH_HEADER": "Bearer <paste the token here>"}
	}
	return s, nil
}

// clientStateDir is the state directory of the physd a client starts:
// the one given, else physd-<client>/<device id> beside physd run's own
// default (physd/<device id>), so each client keeps its own ledger and
// audit trail and a daemon on the same manifest keeps the one it locks.
// The path is absolute: a client starts physd from a directory of its
// own choosing.
func clientStateDir(given, client, deviceID string) (string, error) {
	if given != "" {
		return filepath.Abs(given)
	}
	base := os.Getenv("XDG_STATE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", errors.New("no state directory for the physd the client starts: $HOME and $XDG_STATE_HOME are unset; fix: pass --state DIR (a directory that survives a reboot)")
		}
		base = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(base, "physd-"+client, deviceID), nil
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// defaultBinary is the physd a client should start: this binary, unless it
// is a `go run` build that disappears when go run ends; then physd on
// $PATH, or plain "physd" with a note on how to install it.
func defaultBinary() (path, note string) {
	if exe, err := os.Executable(); err == nil {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		if !strings.Contains(exe, string(filepath.Separator)+"go-build") {
			return exe, ""
		}
	}
	if p, err := exec.LookPath("physd"); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return abs, ""
		}
	}
	return "physd", "this physd was started by go run and vanishes when it exits; install one " +
		"(go build -o ~/.local/bin/physd ./cmd/physd, or the Debian package) and pass --binary with its full path"
}
