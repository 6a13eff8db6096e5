package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// addManagement gives namespace i a second link, straight to the test's
// namespace and outside the site's bridge, so the test still reaches a
// gateway whose site link is cut. It returns the gateway's address on it.
func (l *netnsLab) addManagement(i int) string {
	l.t.Helper()
	host, peer := fmt.Sprintf("pm%s%d", l.id, i), "mgmt0"
	sub := fmt.Sprintf("10.214.%s", l.subnet[len("10.213."):])
	hostIP, nsIP := fmt.Sprintf("%s.%d", sub, 4*i+1), fmt.Sprintf("%s.%d", sub, 4*i+2)
	l.run("ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", l.ns[i-1])
	l.run("ip", "addr", "add", hostIP+"/30", "dev", host)
	l.run("ip", "link", "set", host, "up")
	l.run("ip", "-n", l.ns[i-1], "addr", "add", nsIP+"/30", "dev", peer)
	l.run("ip", "-n", l.ns[i-1], "link", "set", peer, "up")
	l.t.Cleanup(func() { _ = exec.Command("ip", "link", "del", host).Run() })
	return nsIP
}

// siteLink sets the bridge end of gateway i's site link down (a pulled
// cable: every packet to and from it is lost, nobody is told) or up.
func (l *netnsLab) siteLink(i int, up bool) {
	l.t.Helper()
	state := "down"
	if up {
		state = "up"
	}
	l.run("ip", "link", "set", fmt.Sprintf("pv%s%d", l.id, i), state)
}

// TestMeshPartitionInNetworkNamespaces: three gateway processes, each in
// its own network namespace on one bridge, seeded with each other, each
// with a do_ that needs a quorum of 2. gw_zone_c's site link is cut (its
// bridge port down: packets vanish, no RST, no ICMP):
//   - gw_zone_a's routed read of gw_zone_c fails, naming gw_zone_c, within
//     a bound far below the kernel's connect timeout (the dial is bounded
//     by the call's deadline);
//   - gw_zone_a (with gw_zone_b: 2 of 3) still actuates under quorum;
//   - gw_zone_c, alone, refuses its quorum actuation with nothing written,
//     and reports itself partitioned;
//   - once the link is back, the three are one mesh again and gw_zone_a
//     routes to gw_zone_c.
func TestMeshPartitionInNetworkNamespaces(t *testing.T) {
	lab := newNetnsLab(t, 3)
	dir := t.TempDir()
	nodes := []string{"a", "b", "c"}
	var seeds []string
	for i, n := range nodes {
		seeds = append(seeds, fmt.Sprintf("gw_zone_%s/%s:7946", n, lab.ip(i+1)))
	}
	var ds []*daemon
	for i, n := range nodes {
		mgmt := lab.addManagement(i + 1)
		manifest := partitionManifest(t, dir, n, lab.ip(i+1), seeds)
		ds = append(ds, startPartitionGateway(t, lab.ns[i], mgmt, manifest, quorumPolicy(t, dir, n), filepath.Join(dir, "state_"+n)))
	}
	for _, d := range ds { // each joins the others as they come up
		d.stderr.logValue(t, "ready", "ready")
	}
	waitMembers(t, ds, 3, 30*time.Second)
	a, c := connectAs(t, ds[0], "2026-07-28", adminDemoToken, nil), connectAs(t, ds[2], "2026-07-28", adminDemoToken, nil)
	deadline := time.Now().Add(30 * time.Second)
	for listTools(t, a)["read_temperature_zone_c"] == nil {
		if time.Now().After(deadline) {
			t.Fatal("gw_zone_a never listed gw_zone_c's tools")
		}
		time.Sleep(200 * time.Millisecond)
	}
	routed := func() *mcp.CallToolResult {
		res, err := a.CallTool(context.Background(), &mcp.CallToolParams{Name: "read_temperature_zone_c", Arguments: map[string]any{"source": "gw_zone_c", "max_age_ms": 0}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := routed(); res.IsError || structured(t, res)["quality"] != "good" {
		t.Fatalf("routed read before the cut: %s", text(res))
	}

	lab.siteLink(3, false)
	start := time.Now()
	res := routed()
	took := time.Since(start)
	t.Logf("routed read of the cut gateway answered in %v: %s", took.Round(time.Millisecond), text(res))
	if !res.IsError || !strings.Contains(text(res), "gw_zone_c") {
		t.Errorf("routed read of the cut gateway: %s", text(res))
	}
	if took > 5*time.Second {
		t.Errorf("the routed read waited %v for a gateway that cannot answer (request_timeout_ms is 500)", took)
	}

	// gw_zone_a and gw_zone_b are 2 of 3: the quorum holds.
	if r := structured(t, call(t, a, "do_heater_zone_a", map[string]any{"value": 20, "idempotency_key": "majority-1"})); r["status"] != "success" {
		t.Errorf("gw_zone_a with the majority: %v", r)
	}
	// gw_zone_c is alone: refused, nothing written.
	before := ds[2].sim(t).writes("zone_c.vent")
	r := structured(t, call(t, c, "do_vent_zone_c", map[string]any{"value": 40, "idempotency_key": "minority-1"}))
	if r["status"] != "failed" || !strings.Contains(fmt.Sprint(r["details"], r["code"], r["reason"]), "quorum") {
		t.Errorf("gw_zone_c alone: %v", r)
	}
	if w := ds[2].sim(t).writes("zone_c.vent") - before; w != 0 {
		t.Errorf("gw_zone_c wrote the vent %d times without a quorum", w)
	}
	deadline = time.Now().Add(30 * time.Second)
	for ps := partitionState(t, ds[2]); ps != "partitioned"; ps = partitionState(t, ds[2]) {
		if time.Now().After(deadline) {
			t.Fatalf("gw_zone_c, alone, reports partition_state %q", ps)
		}
		time.Sleep(250 * time.Millisecond)
	}

	lab.siteLink(3, true)
	healed := waitMembers(t, ds, 3, 60*time.Second)
	t.Logf("one mesh again %v after the link came back", healed.Round(time.Millisecond))
	deadline = time.Now().Add(30 * time.Second)
	for res := routed(); res.IsError; res = routed() {
		if time.Now().After(deadline) {
			t.Fatalf("gw_zone_a cannot route to gw_zone_c after the heal: %s", text(res))
		}
		time.Sleep(250 * time.Millisecond)
	}
	if r := structured(t, call(t, c, "do_vent_zone_c", map[string]any{"value": 40, "idempotency_key": "healed-1"})); r["status"] != "success" {
		t.Errorf("gw_zone_c after the heal: %v", r)
	}
}

// partitionManifest is the mesh-3node example's gateway n on ip, seeded
// with every gateway, with a request timeout of 500 ms.
func partitionManifest(t *testing.T, dir, n, ip string, seeds []string) string {
	t.Helper()
	b, err := os.ReadFile(repoPath("examples/mesh-3node/node_" + n + ".yml"))
	if err != nil {
		t.Fatal(err)
	}
	network := fmt.Sprintf(`network:
  protocols: [{type: ip, address: %s, mcp_port: 8080, role: native}]
  mesh:
    bind: %s
    label: greenhouse_site
    key_env: PHYSD_MESH_KEY
    seed_peers: [%s]
    expected_size: 3
    request_timeout_ms: 500
buses:`, ip, ip, strings.Join(seeds, ", "))
	out := regexp.MustCompile(`(?s)network:.*?\nbuses:`).ReplaceAllString(string(b), network)
	p := filepath.Join(dir, "node_"+n+".yml")
	if err := os.WriteFile(p, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// quorumPolicy lets the admin demo token run gateway n's do_ when 2 of
// the 3 gateways answer.
func quorumPolicy(t *testing.T, dir, n string) string {
	t.Helper()
	tool := map[string]string{"a": "do_heater_zone_a", "b": "do_fan_zone_b", "c": "do_vent_zone_c"}[n]
	src := fmt.Sprintf(`physmcp_policy_version: "0.1"
identity:
  tokens: [{id: site_admin, sha256: %s, role: admin}]
capabilities:
  %s:
    rules:
      - {type: quorum, min_peers: 2, on_failure: deny}
gate:
  l0:
    allow: [{name: site, tool: "do_*"}]
`, adminDemoTokenHash, tool)
	p := filepath.Join(dir, "policy_"+n+".yml")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// startPartitionGateway runs physd in ns with its mesh on the site link
// and its HTTP on every address (the test uses the management link).
func startPartitionGateway(t *testing.T, ns, mgmtIP, manifest, policy, state string) *daemon {
	t.Helper()
	tok := state + ".token"
	if err := os.WriteFile(tok, []byte(adminDemoToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"netns", "exec", ns, physdBin, "run", "--manifest", manifest, "--policy", policy, "--state", state,
		"--http", "0.0.0.0:8080", "--allow-remote", "--insecure-plain-http", "--auth-token-file", tok, "--sim-control"}
	d := &daemon{cmd: exec.Command("ip", args...), state: state, stderr: &syncBuffer{}, done: make(chan error, 1), token: adminDemoToken}
	d.cmd.Env = append(os.Environ(), "PHYSD_MESH_KEY=q8nJzZ3wXJm9k4sVw6Qz2b1Yc7Rt5Ue0Lh3Pa9Df2Gk=")
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() { d.stop(t) })
	d.addr = mgmtIP + ":8080"
	return d
}

// partitionState is the gateway's mesh partition_state from /status.
func partitionState(t *testing.T, d *daemon) string {
	t.Helper()
	code, body := d.request(t, "GET", "/status", "")
	if code != 200 {
		t.Fatalf("/status: %d %s", code, body)
	}
	m := regexp.MustCompile(`"partition_state":"([a-z_]+)"`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("/status has no partition_state: %.500s", body)
	}
	return string(m[1])
}
