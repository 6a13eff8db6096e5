package e2e

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

	"github.com/physd/physd/discovery"
)

// mdnsSockets counts the process's UDP sockets bound to port 5353 (its
// fds matched against /proc/net/udp by inode).
func mdnsSockets(t *testing.T, pid int) int {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	b, err := os.ReadFile("/proc/net/udp")
	if err != nil {
		t.Skipf("no /proc/net/udp: %v", err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		if strings.HasSuffix(f[1], ":14E9") && inodes[f[9]] { // local port 5353
			n++
		}
	}
	return n
}

// TestMDNSOffByDefault: a gateway whose manifest has no mdns: block opens
// no mDNS socket and answers no browse; the same gateway with
// --mdns-interface lo has one socket on 5353 and is found by a browse on
// lo with its MCP port in the TXT record.
func TestMDNSOffByDefault(t *testing.T) {
	if _, _, err := discovery.Interface("lo"); err != nil {
		t.Skipf("no usable loopback interface: %v", err)
	}
	off := startHTTP(t, daemonOpts{})
	if n := mdnsSockets(t, off.cmd.Process.Pid); n != 0 {
		t.Errorf("physd without mDNS configured has %d sockets on UDP 5353, want 0", n)
	}
	on := startHTTP(t, daemonOpts{extra: []string{"--mdns-interface", "lo"}})
	if n := mdnsSockets(t, on.cmd.Process.Pid); n != 1 {
		t.Errorf("physd --mdns-interface lo has %d sockets on UDP 5353, want 1", n)
	}
	_, port, _ := strings.Cut(on.addr, ":")
	gws, err := discovery.Browse(context.Background(), mustIface(t, "lo"), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, g := range gws {
		if g.DeviceID == "gw_greenhouse_001" { // other packages' tests may advertise on lo meanwhile
			found = append(found, fmt.Sprintf("%s %s:%d%s tls=%v mesh=%d", g.DeviceID, g.Addr, g.MCPPort, g.MCPPath, g.TLS, g.MeshPort))
		}
	}
	want := "gw_greenhouse_001 127.0.0.1:" + port + "/mcp tls=false mesh=0"
	if len(found) != 1 || found[0] != want {
		t.Errorf("browse on lo found %q, want %q", found, want)
	}
	on.stop(t)
	if !strings.Contains(on.stderr.String(), "mdns: stopped advertising (goodbye sent)") {
		t.Errorf("no goodbye on SIGINT; stderr:\n%s", tail(on.stderr.String(), 20))
	}
}

func mustIface(t *testing.T, name string) *net.Interface {
	t.Helper()
	ifi, _, err := discovery.Interface(name)
	if err != nil {
		t.Fatal(err)
	}
	return ifi
}

// TestMDNSInterfaceErrors: an interface this host does not have stops
// physd run before it starts, naming where it was set and the fix.
func TestMDNSInterfaceErrors(t *testing.T) {
	run := func(args ...string) (int, string) {
		cmd := exec.Command(physdBin, append([]string{"run", "--state", t.TempDir()}, args...)...)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return code, string(out)
	}
	code, out := run("--manifest", greenhouse, "--mdns-interface", "nosuch0")
	if code != 1 || !strings.HasPrefix(out, `physd run: --mdns-interface nosuch0: this host has no interface "nosuch0" (it has: `) ||
		!strings.Contains(out, "; fix: name an interface of this host") {
		t.Errorf("--mdns-interface nosuch0: exit %d\n%s", code, out)
	}
	b, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	src := strings.Replace(string(b), "  mesh:\n", "  mesh:\n    mdns: {interface: nosuch0}\n", 1)
	if src == string(b) {
		t.Fatal("greenhouse manifest has no mesh: block to extend")
	}
	p := filepath.Join(t.TempDir(), "m.yml")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	line := strings.Count(src[:strings.Index(src, "mdns:")], "\n") + 1
	code, out = run("--manifest", p)
	if want := p + ":" + strconv.Itoa(line) + ":23: network.mesh.mdns.interface: this host has no interface \"nosuch0\""; code != 1 || !strings.HasPrefix(out, want) {
		t.Errorf("manifest interface nosuch0: exit %d\n%s\nwant prefix %s", code, out, want)
	}
}

// TestMDNSMeshOnLoopback: the three example gateways on 127.0.0.62–64 with
// their seed_peers removed and mDNS on its default interface (lo) form
// one mesh on one host, no root needed.
func TestMDNSMeshOnLoopback(t *testing.T) {
	if _, _, err := discovery.Interface("lo"); err != nil {
		t.Skipf("no usable loopback interface: %v", err)
	}
	dir := t.TempDir()
	var ds []*daemon
	for i, node := range []string{"a", "b", "c"} {
		ip := fmt.Sprintf("127.0.0.%d", 62+i) // not the example's .2–.4, which other mesh tests use
		p := rewriteNetwork(t, dir, node, fmt.Sprintf(`network:
  protocols: [{type: ip, address: %s, mcp_port: 8080, role: native}]
  mesh:
    bind: %s
    label: greenhouse_site_lo
    mdns: {browse_interval_ms: 2000}
buses:`, ip, ip))
		ds = append(ds, startHTTP(t, daemonOpts{manifest: p, extra: []string{"--http", ip + ":0"}}))
	}
	took := waitMembers(t, ds, 3, 30*time.Second)
	t.Logf("three gateways on lo formed one mesh by mDNS %s after the last was ready", took.Round(time.Millisecond))
}
