package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fanBlock is fan_zone_b's entry in the greenhouse manifest; speedBlock is
// a read capability the reloaded manifest adds in its place.
const speedBlock = `  - name: fan_speed_zone_b
    kind: read
    description: Circulation fan speed in zone B as the fan reports it (percent).
    zone: zone_b
    binding: {type: sim, bus: plant, point: zone_b.fan}
    data_type: int
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [fan, airflow, zone_b]

`

func fanBlock(t *testing.T, src string) string {
	t.Helper()
	start := strings.Index(src, "  - name: fan_zone_b\n")
	end := strings.Index(src, "  - name: vent_zone_c\n")
	if start < 0 || end < start {
		t.Fatal("the greenhouse manifest has no fan_zone_b block before vent_zone_c")
	}
	return src[start:end]
}

// auditEvents lists the audit trail's lines with the given event.
func auditEvents(t *testing.T, state, event string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, "audit", "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		// Only a line that holds the event's name can be one of its lines:
		// the others (most of a long trail) are not decoded. The waits
		// below call this every 20 ms on a trail that grows with each do_.
		if !strings.Contains(line, event) {
			continue
		}
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) == nil && r["event"] == event {
			out = append(out, r)
		}
	}
	return out
}

// TestHotReloadThroughTheBinary: the built daemon, serving a stdio client,
// takes a new manifest on SIGHUP without a restart. An added capability is
// listed and callable and the client is told (tools/list_changed); a
// capability removed while it actuates finishes its actuation, which is
// audited; a broken manifest is rejected with its file:line:col and the
// running one stays served; a reload that would change network: is refused.
func TestHotReloadThroughTheBinary(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	orig, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(path, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	changed := make(chan struct{}, 8)
	cs, d := startStdioWith(t, "2025-11-25", daemonOpts{manifest: path, extra: []string{"--stdio-role", "operator"}},
		func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} })
	hup := func() {
		t.Helper()
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	before := listed(t, cs)
	if !slices.Contains(before, "do_fan_zone_b") || slices.Contains(before, "read_fan_speed_zone_b") {
		t.Fatalf("tools before the reload: %v", before)
	}

	// An actuation of fan_zone_b in its device step (each device access
	// takes 1.5 s) when the manifest that removes it is put in force.
	d.request(t, "POST", "/sim/plant/fault", `{"point":"zone_b.fan","mode":"slow","delay_ms":1500}`)
	answer := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_fan_zone_b",
			Arguments: map[string]any{"value": 60, "idempotency_key": "reload-mid-actuation"}})
		if err != nil {
			t.Error(err)
		}
		answer <- res
	}()
	time.Sleep(700 * time.Millisecond) // reading the fan's previous value now
	next := strings.Replace(string(orig), fanBlock(t, string(orig)), speedBlock, 1)
	if err := os.WriteFile(path, []byte(next), 0o644); err != nil {
		t.Fatal(err)
	}
	hup()
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatalf("no tools/list_changed after the reload; stderr:\n%s", d.stderr.String())
	}
	// The SDK tells of each change to the list as it happens (a removal,
	// then an addition): a list taken at the first notice may be between
	// the two, and the next notice follows. Wait for the list to settle.
	after := listed(t, cs)
	for deadline := time.Now().Add(10 * time.Second); !slices.Contains(after, "read_fan_speed_zone_b") && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		after = listed(t, cs)
	}
	if slices.Contains(after, "do_fan_zone_b") || !slices.Contains(after, "read_fan_speed_zone_b") {
		t.Errorf("tools after the reload: %v", after)
	}
	res := <-answer
	if o := structured(t, res); o["status"] != "success" || o["verified"] != true {
		t.Errorf("the actuation under way when its capability was removed: %s", text(res))
	}
	d.request(t, "POST", "/sim/plant/fault", `{"point":"zone_b.fan","mode":"none"}`)
	if o := structured(t, call(t, cs, "read_fan_speed_zone_b", map[string]any{"max_age_ms": 0})); o["value"] != 60.0 || o["quality"] != "good" {
		t.Errorf("the added capability reads %v", o)
	}
	if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_fan_zone_b",
		Arguments: map[string]any{"value": 10, "idempotency_key": "after-removal"}}); err == nil && !res.IsError {
		t.Errorf("the removed tool still answers: %s", text(res))
	}
	var audited bool
	for _, r := range auditEvents(t, d.state, "do") {
		audited = audited || r["idempotency_key"] == "reload-mid-actuation" && r["status"] == "success"
	}
	reloads := auditEvents(t, d.state, "manifest_reload")
	if !audited || len(reloads) != 1 {
		t.Fatalf("audit: actuation audited %v, manifest_reload lines %v", audited, reloads)
	}
	if data, _ := reloads[0]["data"].(map[string]any); data == nil || !slices.Equal(anyStrings(data["added"]), []string{"read_fan_speed_zone_b"}) ||
		!slices.Equal(anyStrings(data["removed"]), []string{"do_fan_zone_b"}) {
		t.Errorf("manifest_reload audit line: %v", reloads[0])
	}

	// A manifest that does not validate: rejected, the running one stays.
	broken := strings.Replace(next, "    data_type: int\n    unit: percent\n    range: {min: 0, max: 100}\n    semantic_tags: [fan, airflow, zone_b]",
		"    data_type: integer\n    unit: percent\n    range: {min: 0, max: 100}\n    semantic_tags: [fan, airflow, zone_b]", 1)
	if broken == next {
		t.Fatal("could not break the manifest")
	}
	if err := os.WriteFile(path, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	hup()
	reason := waitAudit(t, d.state, "manifest_reload_rejected", 1)
	if !strings.Contains(reason, path+":") || !strings.Contains(reason, "data_type") {
		t.Errorf("the rejection does not name the file, line and field: %q", reason)
	}
	if o := structured(t, call(t, cs, "read_fan_speed_zone_b", map[string]any{})); o["quality"] != "good" {
		t.Errorf("after a rejected reload: %v", o)
	}
	if got := listed(t, cs); !slices.Equal(got, after) {
		t.Errorf("a rejected reload changed the tools: %v", got)
	}

	// network: is read once, at start.
	moved := strings.Replace(next, "address: 127.0.0.1", "address: 127.0.0.2", 1)
	if err := os.WriteFile(path, []byte(moved), 0o644); err != nil {
		t.Fatal(err)
	}
	hup()
	if reason := waitAudit(t, d.state, "manifest_reload_rejected", 2); !strings.Contains(reason, "network:") || !strings.Contains(reason, "restart physd") {
		t.Errorf("a network change: %q", reason)
	}
}

// waitAudit waits for the n-th audit line of event and returns its reason.
func waitAudit(t *testing.T, state, event string, n int) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if rs := auditEvents(t, state, event); len(rs) >= n {
			s, _ := rs[n-1]["reason"].(string)
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d-th %s audit line", n, event)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func anyStrings(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// TestWatchManifest: with --watch-manifest, saving the file is enough.
func TestWatchManifest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	orig, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(path, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	cs, d := startStdio(t, "2025-11-25", daemonOpts{manifest: path, extra: []string{"--watch-manifest", "100ms"}})
	// An editor's save: a new file renamed over the old one.
	next := strings.Replace(string(orig), "  - name: vent_zone_c\n", speedBlock+"  - name: vent_zone_c\n", 1)
	tmp := filepath.Join(dir, ".physmcp.manifest.yml.swp")
	if err := os.WriteFile(tmp, []byte(next), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitAudit(t, d.state, "manifest_reload", 1)
	if !slices.Contains(listed(t, cs), "read_fan_speed_zone_b") {
		t.Errorf("the saved capability is not listed: %v", listed(t, cs))
	}
	// A broken save (atomic too) is rejected once, not at every check.
	if err := os.WriteFile(tmp, []byte(strings.Replace(next, "kind: read", "kind: reed", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitAudit(t, d.state, "manifest_reload_rejected", 1)
	time.Sleep(time.Second) // ten checks
	if n := len(auditEvents(t, d.state, "manifest_reload_rejected")); n != 1 {
		t.Errorf("the same broken file was rejected %d times", n)
	}
}

// TestMeshReload: a gateway that reloads its manifest stays in the mesh,
// and the site sees its new catalog: gw_zone_a lists and routes the tool
// gw_zone_c added, and stops listing the one it removed.
func TestMeshReload(t *testing.T) {
	dir := t.TempDir()
	src, err := os.ReadFile(repoPath("examples/mesh-3node/node_c.yml"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "node_c.yml")
	if err := os.WriteFile(path, src, 0o644); err != nil {
		t.Fatal(err)
	}
	meshNode(t, "b", "127.0.0.3", dir+"/b")
	c := &daemon{cmd: exec.Command(physdBin, "run", "--manifest", path, "--state", dir+"/c", "--http", "127.0.0.4:0"),
		state: dir + "/c", stderr: &syncBuffer{}, done: make(chan error, 1)}
	c.cmd.Stderr = c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.done <- c.cmd.Wait() }()
	t.Cleanup(func() { c.stop(t) })
	c.stderr.logValue(t, "mesh joined", "node")
	cmd := exec.Command(physdBin, "run", "--manifest", repoPath("examples/mesh-3node/node_a.yml"), "--state", dir+"/a", "--stdio")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	// A 2026-07-28 client caches tools/list (ttlMs) and is told when to
	// drop it: the list_changed notification is what makes it see the
	// reload.
	changed := make(chan struct{}, 16)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }}).Connect(context.Background(),
		&mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	waitListed := func(tool string, want bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for (listTools(t, cs)[tool] != nil) != want {
			if time.Now().After(deadline) {
				t.Fatalf("gw_zone_a: %s listed should be %v\n%s\nC:\n%s", tool, want, stderr.String(), c.stderr.String())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitListed("do_vent_zone_c", true)

	vent := string(src[strings.Index(string(src), "  - name: vent_zone_c\n"):])
	next := strings.Replace(string(src), vent, `  - name: vent_position_zone_c
    kind: read
    description: Roof vent opening in zone C as the vent reports it (percent).
    zone: zone_c
    binding: {type: sim, bus: plant, point: zone_c.vent}
    data_type: int
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [vent, zone_c]
`, 1)
	if err := os.WriteFile(path, []byte(next), 0o644); err != nil {
		t.Fatal(err)
	}
	for len(changed) > 0 {
		<-changed
	}
	if err := c.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(30 * time.Second):
		t.Fatal("gw_zone_a's client was not told that the tools changed")
	}
	waitListed("read_vent_position_zone_c", true)
	waitListed("do_vent_zone_c", false)
	res := call(t, cs, "read_vent_position_zone_c", map[string]any{"source": "gw_zone_c"})
	if o := structured(t, res); o["quality"] != "good" || o["source"] != "gw_zone_c" {
		t.Errorf("routed read of the added tool: %s", text(res))
	}
	if strings.Contains(c.stderr.String(), `"mesh joined"`) && strings.Count(c.stderr.String(), `"mesh joined"`) != 1 {
		t.Errorf("gw_zone_c rejoined the mesh on reload")
	}
}
