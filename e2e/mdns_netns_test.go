package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// netnsLab is a bridge in the test's namespace with one network
// namespace per gateway, each holding the peer end of a veth named eth0.
type netnsLab struct {
	t      *testing.T
	id     string // unique per run
	subnet string // "10.213.N"
	bridge string
	ns     []string
}

// newNetnsLab builds the bridge and n namespaces, or skips the test when
// it is not root or namespaces cannot be made here (saying why). Every
// name is unique per run and removed in t.Cleanup.
func newNetnsLab(t *testing.T, n int) *netnsLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root (this test builds a bridge, veths and namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("the ip command (iproute2) is not installed: apt-get install iproute2")
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	lab := &netnsLab{t: t, id: hex.EncodeToString(b)}
	lab.subnet = fmt.Sprintf("10.213.%d", 1+int(b[0])%250)
	lab.bridge = "pbr" + lab.id
	probe := "physd-probe-" + lab.id
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		t.Skipf("cannot create a network namespace here: %v: %s", err, out)
	}
	_ = exec.Command("ip", "netns", "del", probe).Run()

	t.Cleanup(lab.cleanup)
	lab.run("ip", "link", "add", lab.bridge, "type", "bridge", "mcast_snooping", "0")
	lab.run("ip", "addr", "add", lab.subnet+".1/24", "dev", lab.bridge)
	lab.run("ip", "link", "set", lab.bridge, "multicast", "on", "up")
	for i := 1; i <= n; i++ {
		ns := fmt.Sprintf("physd-mdns-%s-%d", lab.id, i)
		veth := fmt.Sprintf("pv%s%d", lab.id, i)
		lab.run("ip", "netns", "add", ns)
		lab.ns = append(lab.ns, ns)
		lab.run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
		lab.run("ip", "link", "set", veth, "master", lab.bridge, "multicast", "on", "up")
		lab.run("ip", "-n", ns, "addr", "add", lab.ip(i)+"/24", "dev", "eth0")
		lab.run("ip", "-n", ns, "link", "set", "eth0", "multicast", "on", "up")
		lab.run("ip", "-n", ns, "link", "set", "lo", "up")
	}
	return lab
}

func (l *netnsLab) ip(i int) string { return fmt.Sprintf("%s.%d", l.subnet, 10+i) }

func (l *netnsLab) run(args ...string) {
	l.t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		l.t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (l *netnsLab) cleanup() {
	for _, ns := range l.ns {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			l.t.Errorf("ip netns del %s: %v: %s", ns, err, out)
		}
	}
	_ = exec.Command("ip", "link", "del", l.bridge).Run() // takes the host ends of the veths with it
}

// mdnsManifest is the mesh-3node example's gateway with a network block
// that names no seed peer: the mesh on eth0's address (encrypted) and
// mDNS on eth0.
func mdnsManifest(t *testing.T, dir, node, ip string) string {
	t.Helper()
	return rewriteNetwork(t, dir, node, fmt.Sprintf(`network:
  protocols: [{type: ip, address: %s, mcp_port: 8080, role: native}]
  mesh:
    bind: %s
    label: greenhouse_site
    key_env: PHYSD_MESH_KEY
    expected_size: 3
    mdns: {interface: eth0, browse_interval_ms: 2000}
buses:`, ip, ip))
}

// rewriteNetwork writes the mesh-3node example's gateway node with its
// network: block replaced by network (which ends with "buses:").
func rewriteNetwork(t *testing.T, dir, node, network string) string {
	t.Helper()
	b, err := os.ReadFile(repoPath("examples/mesh-3node/node_" + node + ".yml"))
	if err != nil {
		t.Fatal(err)
	}
	out := regexp.MustCompile(`(?s)network:.*?\nbuses:`).ReplaceAllString(string(b), network)
	if strings.Contains(out, "seed_peers") || !strings.Contains(out, "mdns:") {
		t.Fatalf("manifest rewrite failed:\n%s", out)
	}
	p := filepath.Join(dir, "node_"+node+".yml")
	if err := os.WriteFile(p, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// startInNetns runs physd inside ns (ip netns exec replaces itself with
// physd, so signals reach physd), HTTP on ip:8080 with a token.
func startInNetns(t *testing.T, ns, ip, manifest, state string) *daemon {
	t.Helper()
	tok := filepath.Join(state, "..", filepath.Base(state)+".token")
	if err := os.WriteFile(tok, []byte(adminDemoToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"netns", "exec", ns, physdBin, "run", "--manifest", manifest, "--state", state,
		"--http", ip + ":8080", "--allow-remote", "--insecure-plain-http", "--auth-token-file", tok}
	d := &daemon{cmd: exec.Command("ip", args...), state: state, stderr: &syncBuffer{}, done: make(chan error, 1), token: adminDemoToken}
	d.cmd.Env = append(os.Environ(), "PHYSD_MESH_KEY=q8nJzZ3wXJm9k4sVw6Qz2b1Yc7Rt5Ue0Lh3Pa9Df2Gk=")
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

// meshView is the part of /status's mesh section this test reads.
type meshView struct {
	Alive      int `json:"alive"`
	Members    []struct{ Name, State string }
	Discovered []struct {
		ID       string `json:"id"`
		Addr     string `json:"addr"`
		MeshPort int    `json:"mesh_port"`
		MCPPort  int    `json:"mcp_port"`
	} `json:"mdns_discovered"`
}

func (d *daemon) meshView(t *testing.T) meshView {
	t.Helper()
	code, body := d.request(t, "GET", "/status", "")
	if code != 200 {
		t.Fatalf("/status: %d %s", code, body)
	}
	var st struct {
		Mesh meshView `json:"mesh"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("/status: %v: %s", err, body)
	}
	return st.Mesh
}

// TestMDNSMeshInNetworkNamespaces: three gateways, each in its own
// network namespace on one bridge, with mDNS on eth0 and no seed_peers,
// find each other and form one mesh: each /status shows the three
// alive, each lists the others as found by mDNS, and a can_do asked of
// one gateway is answered by the owners of the others' capabilities.
// A gateway started after the others is joined too, and a gateway that
// stops sends a goodbye.
func TestMDNSMeshInNetworkNamespaces(t *testing.T) {
	lab := newNetnsLab(t, 3)
	dir := t.TempDir()
	start := time.Now()
	var ds []*daemon
	for i, node := range []string{"a", "b"} {
		ip := lab.ip(i + 1)
		ds = append(ds, startInNetns(t, lab.ns[i], ip, mdnsManifest(t, dir, node, ip), filepath.Join(dir, "state_"+node)))
	}
	// The third starts once the first two have met: it must find them,
	// and they must learn of it, with nobody configured.
	waitMembers(t, ds, 2, 20*time.Second)
	ds = append(ds, startInNetns(t, lab.ns[2], lab.ip(3), mdnsManifest(t, dir, "c", lab.ip(3)), filepath.Join(dir, "state_c")))
	took := waitMembers(t, ds, 3, 30*time.Second)
	t.Logf("three gateways in three namespaces formed one mesh by mDNS %s after the first started (%s after the third)", time.Since(start).Round(time.Millisecond), took.Round(time.Millisecond))

	ids := []string{"gw_zone_a", "gw_zone_b", "gw_zone_c"}
	for i, d := range ds {
		v := d.meshView(t)
		var names []string
		for _, m := range v.Members {
			if m.State == "alive" {
				names = append(names, m.Name)
			}
		}
		if strings.Join(names, ",") != strings.Join(ids, ",") {
			t.Errorf("%s sees alive %v, want %v", ids[i], names, ids)
		}
		// Each lists what mDNS found: the others, never itself.
		found := map[string]string{}
		for _, g := range v.Discovered {
			found[g.ID] = fmt.Sprintf("%s mesh %d mcp %d", g.Addr, g.MeshPort, g.MCPPort)
		}
		if _, self := found[ids[i]]; self {
			t.Errorf("%s lists itself as discovered: %v", ids[i], found)
		}
		// Discovery found every gateway that was there when it browsed;
		// the first two found c, or c joined them first.
		if i == 2 {
			for j := 0; j < 2; j++ {
				if want := fmt.Sprintf("%s mesh 7946 mcp 8080", lab.ip(j+1)); found[ids[j]] != want {
					t.Errorf("gw_zone_c discovered %s as %q, want %q", ids[j], found[ids[j]], want)
				}
			}
		}
	}

	// A can_do asked of gateway A is answered by B's and C's owners.
	cs := connectAs(t, ds[0], "2026-07-28", adminDemoToken, nil)
	var rep map[string]any
	deadline := time.Now().Add(20 * time.Second)
	for {
		rep = canDo(t, cs, "ventilation")
		if len(sources(rep, "candidates")) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got := sources(rep, "candidates"); got["do_fan_zone_b"] != "gw_zone_b/allowed" || got["do_vent_zone_c"] != "gw_zone_c/allowed" {
		t.Errorf("can_do from gw_zone_a over the mDNS-formed mesh: %v", rep)
	}

	// SIGTERM: C's advertiser says goodbye as it stops.
	ds[2].stop(t)
	if !strings.Contains(ds[2].stderr.String(), "mdns: stopped advertising (goodbye sent)") {
		t.Errorf("gw_zone_c stopped without the mDNS goodbye; stderr:\n%s", tail(ds[2].stderr.String(), 30))
	}
}

// waitMembers waits until every daemon's /status shows want alive
// members and returns how long it took.
func waitMembers(t *testing.T, ds []*daemon, want int, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ok := true
		var got []int
		for _, d := range ds {
			a := d.meshView(t).Alive
			got = append(got, a)
			ok = ok && a == want
		}
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > limit {
			for _, d := range ds {
				t.Logf("stderr:\n%s", tail(d.stderr.String(), 40))
			}
			t.Fatalf("alive members per gateway %v after %v, want %d each", got, limit, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
