// Package e2e drives the built physd binary through its public surface:
// MCP over HTTP and stdio with the official go-sdk client in both protocol
// eras, the CLI, and plain HTTP.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var physdBin string

// e2eParallel is the number of tests marked t.Parallel that run at once
// when -test.parallel is not given (see TestMain).
const e2eParallel = 8

func TestMain(m *testing.M) {
	// Go runs at most GOMAXPROCS parallel tests by default: 2 on a 2-core
	// machine. These tests spend nearly all their time waiting on the physd
	// processes they start (device delays, timeouts, audit and log polls),
	// not on this process's CPU, so the default leaves the machine mostly
	// idle. Raise the limit unless -test.parallel (go test -parallel) was
	// given, which is then obeyed as is.
	//
	// A test that starts its own physd on ephemeral ports with its own
	// t.TempDir state calls t.Parallel. Go runs every serial test before
	// any parallel one, never beside it, so these stay serial (no
	// t.Parallel): tests that use t.Setenv; the mesh tests (the
	// mesh-3node example and mesh_scale bind fixed addresses and port
	// 7946); network namespaces; mDNS (UDP 5353, multicast); Chromium;
	// the watchdog and latency measurements (watchdog, mqtt); and tests
	// whose checks race the clock (a wall-clock bound, or a fixed sleep
	// that must fall inside a device step or before a poll).
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		if err := flag.Set("test.parallel", fmt.Sprint(e2eParallel)); err != nil {
			panic(err)
		}
	}
	dir, err := os.MkdirTemp("", "physd-e2e-")
	if err != nil {
		panic(err)
	}
	physdBin = filepath.Join(dir, "physd")
	build := exec.Command("go", "build", "-race", "-o", physdBin, "github.com/physd/physd/cmd/physd")
	if runtime.GOOS != "linux" || os.Getenv("PHYSD_E2E_NORACE") != "" {
		build = exec.Command("go", "build", "-o", physdBin, "github.com/physd/physd/cmd/physd")
	}
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building physd:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func repoPath(rel string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", rel)
}

var greenhouse = repoPath("examples/greenhouse/physmcp.manifest.yml")

// syncBuffer collects a process's stderr.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logValue waits for a JSON log line with msg and returns its key.
func (b *syncBuffer) logValue(t *testing.T, msg, key string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		sc := bufio.NewScanner(strings.NewReader(b.String()))
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == msg {
				return fmt.Sprint(line[key])
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no %q log line with %q; stderr:\n%s", msg, key, b.String())
	return ""
}

// daemon is a running physd process.
type daemon struct {
	cmd    *exec.Cmd
	addr   string // HTTP address (host:port)
	state  string
	stderr *syncBuffer
	done   chan error
	// token authenticates the harness's own HTTP calls (simulator controls,
	// /status, /metrics): with a greenhouse policy, credentials are
	// required on every route but /healthz and /readyz.
	token string
}

// adminDemoToken is the greenhouse policy's admin token.
const adminDemoToken = "greenhouse-admin-demo-token"

// adminDemoTokenHash is adminDemoToken's sha256 as policies list it.
const adminDemoTokenHash = "b52aa8aa128a1e000ac3c35f0b7b16dee3a2baa5950139e03447d04d7689ea0f"

// withPolicyToken sets the harness's token when the daemon runs a policy
// that carries the greenhouse demo admin token (a token the policy does not
// know is refused, so policies without identities get none).
func (d *daemon) withPolicyToken(extra []string) {
	for i, a := range extra {
		if a == "--policy" && i+1 < len(extra) {
			if b, err := os.ReadFile(extra[i+1]); err == nil && strings.Contains(string(b), adminDemoTokenHash) {
				d.token = adminDemoToken
			}
		}
	}
}

// request sends an HTTP request to the daemon with the harness's token.
func (d *daemon) request(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, d.url(path), rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if d.token != "" {
		req.Header.Set("Authorization", "Bearer "+d.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

type daemonOpts struct {
	manifest string
	state    string
	extra    []string
}

// startHTTP runs physd with an HTTP listener on an ephemeral port and the
// simulator controls on.
func startHTTP(t *testing.T, o daemonOpts) *daemon {
	t.Helper()
	if o.manifest == "" {
		o.manifest = greenhouse
	}
	if o.state == "" {
		o.state = t.TempDir()
	}
	args := append([]string{"run", "--manifest", o.manifest, "--state", o.state, "--http", "127.0.0.1:0", "--sim-control"}, o.extra...)
	d := &daemon{cmd: exec.Command(physdBin, args...), state: o.state, stderr: &syncBuffer{}, done: make(chan error, 1)}
	d.withPolicyToken(o.extra)
	return d.serve(t)
}

// serve starts d's command and waits until it listens and is ready; it is
// stopped when the test ends.
func (d *daemon) serve(t *testing.T) *daemon {
	t.Helper()
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() { d.stop(t) })
	d.addr = d.stderr.logValue(t, "listening", "addr")
	d.stderr.logValue(t, "ready", "ready")
	return d
}

func (d *daemon) stop(t *testing.T) {
	// Whether the process was already waited for is asked of Process (the
	// goroutine that waits owns ProcessState: reading it here races).
	if err := d.cmd.Process.Signal(os.Interrupt); errors.Is(err, os.ErrProcessDone) || d.done == nil {
		return // a stdio daemon is waited for by its MCP transport
	}
	select {
	case <-d.done:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
		t.Errorf("physd did not stop on SIGINT; stderr:\n%s", d.stderr.String())
	}
}

func (d *daemon) url(path string) string { return "http://" + d.addr + path }

// connectHTTP opens an MCP client session over Streamable HTTP.
func connectHTTP(t *testing.T, d *daemon, version string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "physd-e2e", Version: "1"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: d.url("/mcp")}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect %s over HTTP: %v\nstderr:\n%s", version, err, d.stderr.String())
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// startStdio runs physd as an MCP stdio server (with an HTTP listener for
// the simulator controls) and connects to it.
func startStdio(t *testing.T, version string, o daemonOpts) (*mcp.ClientSession, *daemon) {
	t.Helper()
	return startStdioWith(t, version, o, nil)
}

// startStdioWith is startStdio with a handler for tools/list_changed.
func startStdioWith(t *testing.T, version string, o daemonOpts, listChanged func(context.Context, *mcp.ToolListChangedRequest)) (*mcp.ClientSession, *daemon) {
	t.Helper()
	if o.manifest == "" {
		o.manifest = greenhouse
	}
	if o.state == "" {
		o.state = t.TempDir()
	}
	args := append([]string{"run", "--manifest", o.manifest, "--state", o.state, "--stdio", "--http", "127.0.0.1:0", "--sim-control"}, o.extra...)
	d := &daemon{cmd: exec.Command(physdBin, args...), state: o.state, stderr: &syncBuffer{}}
	d.withPolicyToken(o.extra)
	d.cmd.Stderr = d.stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "physd-e2e", Version: "1"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}, ToolListChangedHandler: listChanged})
	cs, err := c.Connect(context.Background(), &mcp.CommandTransport{Command: d.cmd}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect %s over stdio: %v\nstderr:\n%s", version, err, d.stderr.String())
	}
	t.Cleanup(func() { cs.Close() })
	d.addr = d.stderr.logValue(t, "listening", "addr")
	return cs, d
}

// call invokes a tool and returns the result; it fails the test on a
// protocol error.
func call(t *testing.T, cs *mcp.ClientSession, name string, args any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s(%v): %v", name, args, err)
	}
	return res
}

// structured returns a successful result's structured content as a map.
func structured(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool error: %s", text(res))
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// simState is GET /sim/plant/.
type simState struct {
	Signals map[string]float64 `json:"signals"`
	Stats   struct {
		Points map[string]struct {
			Reads  uint64 `json:"reads"`
			Writes uint64 `json:"writes"`
		} `json:"points"`
	} `json:"stats"`
}

func (s simState) writes(point string) uint64 { return s.Stats.Points[point].Writes }

func (d *daemon) sim(t *testing.T) simState {
	t.Helper()
	_, body := d.request(t, "GET", "/sim/plant/", "")
	var s simState
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatalf("sim state: %v: %s", err, body)
	}
	return s
}

func (d *daemon) fault(t *testing.T, point, mode string) {
	t.Helper()
	body := fmt.Sprintf(`{"point":%q,"mode":%q}`, point, mode)
	if code, b := d.request(t, "POST", "/sim/plant/fault", body); code != http.StatusOK {
		t.Fatalf("fault %s %s: %d %s", point, mode, code, b)
	}
}

func postJSON(t *testing.T, url, body string) int {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
