package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func meshNode(t *testing.T, n, ip, state string) *daemon {
	t.Helper()
	return meshNodeWith(t, repoPath("examples/mesh-3node/node_"+n+".yml"), ip, state)
}

// meshNodeWith runs one gateway of the three-gateway site on its own
// manifest.
func meshNodeWith(t *testing.T, manifest, ip, state string) *daemon {
	t.Helper()
	return meshNodeWithArgs(t, manifest, ip, state)
}

// meshNodeWithArgs is meshNodeWith with more physd run flags.
func meshNodeWithArgs(t *testing.T, manifest, ip, state string, extra ...string) *daemon {
	t.Helper()
	args := append([]string{"run", "--manifest", manifest, "--state", state, "--http", ip + ":0", "--sim-control"}, extra...)
	d := &daemon{cmd: exec.Command(physdBin, args...), state: state, stderr: &syncBuffer{}, done: make(chan error, 1)}
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() { d.stop(t) })
	d.addr = d.stderr.logValue(t, "listening", "addr")
	d.stderr.logValue(t, "mesh joined", "node")
	return d
}

// canDo asks a can_do and returns the report.
func canDo(t *testing.T, cs *mcp.ClientSession, tags ...string) map[string]any {
	t.Helper()
	return structured(t, call(t, cs, "can_do", map[string]any{"intent": map[string]any{"semantic_tags": tags, "action": "set", "value": 40}}))
}

func sources(rep map[string]any, key string) map[string]string {
	out := map[string]string{}
	list, _ := rep[key].([]any)
	for _, x := range list {
		e := x.(map[string]any)
		out[fmt.Sprint(e["capability"])] = fmt.Sprint(e["source"], "/", e["permission"])
	}
	return out
}

// TestMeshAcrossProcesses runs the three-gateway example as real processes
// on 127.0.0.2-4: a can_do asked of one gateway is answered for the whole
// site; after SIGKILL of one gateway its capabilities are reported
// source_unreachable; restarted, it rejoins.
func TestMeshAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	a := meshNode(t, "a", "127.0.0.2", dir+"/a")
	b := meshNode(t, "b", "127.0.0.3", dir+"/b")
	c := meshNode(t, "c", "127.0.0.4", dir+"/c")
	cs := connectHTTP(t, a, "2026-07-28")

	var rep map[string]any
	deadline := time.Now().Add(20 * time.Second)
	for { // catalogs spread by gossip
		rep = canDo(t, cs, "ventilation")
		if len(sources(rep, "candidates")) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	got := sources(rep, "candidates")
	if got["do_fan_zone_b"] != "gw_zone_b/allowed" || got["do_vent_zone_c"] != "gw_zone_c/allowed" || rep["feasible"] != true {
		t.Fatalf("distributed can_do from gw_zone_a: %v", rep)
	}
	md := rep["metadata"].(map[string]any)
	if md["coordinator_node"] != "gw_zone_a" || md["peers_consulted"] != 2.0 || md["responses_received"] != 2.0 || md["mesh_size_estimate"] != 3.0 {
		t.Errorf("metadata: %v", md)
	}

	if code, body := get(t, a.url("/readyz")); code != 200 || !strings.Contains(body, `"name":"mesh","ok":true`) {
		t.Errorf("readyz with the mesh joined: %d %s", code, body)
	}
	// The mesh shows in metrics (memberlist's own series bridged) and /status.
	_, body := get(t, a.url("/metrics"))
	if v := metric(body, `physd_mesh_members{state="alive"}`); v != 3 {
		t.Errorf("physd_mesh_members alive = %v, want 3", v)
	}
	if metric(body, `physd_mesh_partition_state{state="healthy"}`) != 1 || !strings.Contains(body, "\nmemberlist_") {
		t.Errorf("mesh metrics missing:\n%s", body)
	}

	// Gateway A lists B's and C's tools with a source argument and routes
	// a do_ to the owner, which actuates its own plant.
	tools := listTools(t, cs)
	fan := tools["do_fan_zone_b"]
	if fan == nil || !strings.Contains(fmt.Sprint(schemaMap(t, fan.InputSchema)["required"]), "source") {
		t.Fatalf("gw_zone_a does not list do_fan_zone_b with a required source: %v", fan)
	}
	if tools["read_temperature_zone_a"] == nil || schemaMap(t, tools["read_temperature_zone_a"].InputSchema)["properties"].(map[string]any)["source"] == nil {
		t.Errorf("local tools take an optional source in a mesh")
	}
	r := structured(t, call(t, cs, "do_fan_zone_b", map[string]any{"value": 45, "idempotency_key": "routed-1", "source": "gw_zone_b"}))
	if r["status"] != "success" || r["source"] != "gw_zone_b" || r["applied_value"] != 45.0 {
		t.Errorf("routed do_: %v", r)
	}
	if w := b.sim(t).writes("zone_b.fan"); w != 1 {
		t.Errorf("gw_zone_b's plant saw %d fan writes, want 1", w)
	}
	res0, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "physmcp://mesh"})
	if err != nil || !strings.Contains(res0.Contents[0].Text, `"partition_state": "healthy"`) || !strings.Contains(res0.Contents[0].Text, "gw_zone_c") {
		t.Errorf("physmcp://mesh: %v %v", err, res0)
	}
	o := structured(t, call(t, cs, "read_temperature_zone_c", map[string]any{"source": "gw_zone_c"}))
	if o["source"] != "gw_zone_c" || o["quality"] != "good" {
		t.Errorf("routed read_: %v", o)
	}

	// SIGKILL gateway C: its vent is reported unreachable, never silently dropped.
	c.cmd.Process.Kill()
	<-c.done
	killed := time.Now()
	deadline = time.Now().Add(30 * time.Second)
	for {
		rep = canDo(t, cs, "ventilation")
		if strings.HasPrefix(sources(rep, "blocked")["do_vent_zone_c"], "gw_zone_c/source_unreachable") || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := sources(rep, "blocked")["do_vent_zone_c"]; got != "gw_zone_c/source_unreachable" {
		t.Fatalf("after SIGKILL of gw_zone_c: %v", rep)
	}
	if sources(rep, "candidates")["do_fan_zone_b"] != "gw_zone_b/allowed" || rep["feasible"] != true {
		t.Errorf("the rest of the site must stay usable: %v", rep)
	}
	// A routed call to the dead owner fails clearly and promptly.
	start := time.Now()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "read_temperature_zone_c", Arguments: map[string]any{"source": "gw_zone_c"}})
	if err == nil && !res.IsError {
		t.Errorf("routed read to a killed node: %v", text(res))
	}
	t.Logf("routed call to the killed node failed in %s", time.Since(start).Round(time.Millisecond))
	t.Logf("gw_zone_c reported source_unreachable %s after SIGKILL", time.Since(killed).Round(time.Millisecond))

	// Once the mesh declares it dead, can_do and a call to its tool give
	// one answer: the tool is still listed, and the call is a tool error
	// naming the owner and its state (never JSON-RPC "unknown tool").
	reason := func() string {
		for _, x := range canDo(t, cs, "ventilation")["blocked"].([]any) {
			if b := x.(map[string]any); b["capability"] == "do_vent_zone_c" {
				return fmt.Sprint(b["reason"])
			}
		}
		return ""
	}
	for deadline = time.Now().Add(30 * time.Second); !strings.Contains(reason(), "gw_zone_c is dead") && time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
	}
	if r := reason(); !strings.Contains(r, "gw_zone_c is dead") {
		t.Fatalf("can_do never reported gw_zone_c dead: %q", r)
	}
	res, err = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_vent_zone_c", Arguments: map[string]any{"source": "gw_zone_c", "value": 40, "idempotency_key": "dead-1"}})
	if err != nil || !res.IsError || !strings.Contains(text(res), "gw_zone_c is dead") || listTools(t, cs)["do_vent_zone_c"] == nil {
		t.Errorf("call to the dead owner's tool: err %v, result %v", err, res)
	} else {
		t.Logf("call to the dead owner's tool: %s", text(res))
	}

	// Restarted, it rejoins and answers again.
	meshNode(t, "c", "127.0.0.4", dir+"/c")
	deadline = time.Now().Add(30 * time.Second)
	for {
		rep = canDo(t, cs, "ventilation")
		if sources(rep, "candidates")["do_vent_zone_c"] == "gw_zone_c/allowed" || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if sources(rep, "candidates")["do_vent_zone_c"] != "gw_zone_c/allowed" {
		t.Errorf("gw_zone_c did not rejoin: %v", rep)
	}
}

// TestMeshToolListChanged: a stdio client of gateway A is told when the
// site's tool list changes (gateway C leaves), in both protocol eras' stdio
// sessions.
func TestMeshToolListChanged(t *testing.T) {
	dir := t.TempDir()
	meshNode(t, "b", "127.0.0.3", dir+"/b")
	c := meshNode(t, "c", "127.0.0.4", dir+"/c")
	changed := make(chan struct{}, 16)
	cmd := exec.Command(physdBin, "run", "--manifest", repoPath("examples/mesh-3node/node_a.yml"), "--state", dir+"/a", "--stdio")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	cl := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }})
	cs, err := cl.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	has := func(tool string) bool { return listTools(t, cs)[tool] != nil }
	deadline := time.Now().Add(30 * time.Second)
	for !has("do_vent_zone_c") {
		if time.Now().After(deadline) {
			t.Fatalf("gw_zone_c's tools never listed on gw_zone_a\n%s", stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	for len(changed) > 0 { // drain the announcements of the joins
		<-changed
	}
	c.stop(t) // a graceful leave
	select {
	case <-changed:
	case <-time.After(30 * time.Second):
		t.Fatal("no tools/list_changed after gw_zone_c left")
	}
	deadline = time.Now().Add(10 * time.Second)
	for has("do_vent_zone_c") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if has("do_vent_zone_c") || !has("do_fan_zone_b") {
		t.Errorf("after gw_zone_c left: vent listed=%v, fan listed=%v", has("do_vent_zone_c"), has("do_fan_zone_b"))
	}
}
