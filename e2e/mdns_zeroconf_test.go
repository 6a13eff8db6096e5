package e2e

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

// zeroconfScript browses _physmcp._tcp on 127.0.0.1 with python-zeroconf
// (an independent mDNS implementation, Debian's python3-zeroconf), prints
// each service it resolves and each one removed, and on the line "stop"
// from stdin waits for the goodbye before it exits.
const zeroconfScript = `
import sys, time
from zeroconf import Zeroconf, ServiceBrowser, ServiceListener, IPVersion
zc = Zeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
class L(ServiceListener):
    def add_service(self, zc, type_, name):
        i = zc.get_service_info(type_, name, timeout=3000)
        if i:
            p = {k.decode(): (v or b"").decode() for k, v in i.properties.items()}
            print("found", name, i.parsed_addresses()[0], i.port, p.get("id"), p.get("mcp_port"), p.get("mcp_path"), p.get("tls"), p.get("physmcp_version"), flush=True)
    def update_service(self, *a): pass
    def remove_service(self, zc, type_, name): print("removed", name, flush=True)
ServiceBrowser(zc, "_physmcp._tcp.local.", L())
sys.stdin.readline()
time.sleep(3)
zc.close()
`

// TestMDNSZeroconfInterop: python-zeroconf resolves a gateway advertised
// with --mdns-interface lo (address, SRV port, TXT) and sees it removed
// when physd stops (the goodbye). Skipped without Debian's
// python3-zeroconf (.ci/run installs it).
func TestMDNSZeroconfInterop(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import zeroconf").Run(); err != nil {
		t.Skipf("python-zeroconf is not installed (apt-get install python3-zeroconf): %v", err)
	}
	d := startHTTP(t, daemonOpts{extra: []string{"--mdns-interface", "lo"}})
	_, port, _ := strings.Cut(d.addr, ":")
	cmd := exec.Command(py, "-c", zeroconfScript)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	want := "found gw_greenhouse_001._physmcp._tcp.local. 127.0.0.1 " + port + " gw_greenhouse_001 " + port + " /mcp false 0.1"
	if !waitLine(out, want) {
		t.Fatalf("python-zeroconf did not resolve the gateway; want %q, got:\n%s", want, out.String())
	}
	d.stop(t)
	_, _ = stdin.Write([]byte("stop\n"))
	_ = cmd.Wait()
	if !strings.Contains(out.String(), "removed gw_greenhouse_001._physmcp._tcp.local.") {
		t.Errorf("python-zeroconf saw no goodbye when physd stopped:\n%s", out.String())
	}
}

// waitLine waits up to 10 s for a line of b equal to want.
func waitLine(b *syncBuffer, want string) bool {
	for range 100 {
		for _, l := range strings.Split(b.String(), "\n") {
			if l == want {
				return true
			}
		}
		sleep100ms()
	}
	return false
}

func sleep100ms() { time.Sleep(100 * time.Millisecond) }
