package daemon

import (
	"net"
	"strings"
	"testing"

	"github.com/physd/physd/discovery"
	"github.com/physd/physd/manifest"
)

// TestCheckMDNS: mDNS off checks nothing; on lo a loopback mesh address
// (127.0.0.2 included) is fine; on an interface that does not carry the
// mesh's address physd refuses to start, naming the interface, the
// address and its key.
func TestCheckMDNS(t *testing.T) {
	m, err := manifest.Load("../examples/mesh-3node/node_b.yml") // bind 127.0.0.3
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckMDNS("", m); err != nil {
		t.Errorf("mDNS off: %v", err)
	}
	if err := CheckMDNS("lo", m); err != nil {
		t.Errorf("lo with the mesh on 127.0.0.3: %v", err)
	}
	var other string
	all, _ := net.Interfaces()
	for _, ifi := range all {
		if _, _, err := discovery.Interface(ifi.Name); err == nil && ifi.Flags&net.FlagLoopback == 0 {
			other = ifi.Name
			break
		}
	}
	if other == "" {
		t.Skip("no non-loopback interface with IPv4 here")
	}
	err = CheckMDNS(other, m)
	want := "physd run: --mdns-interface " + other + ": " + other + " does not carry the mesh address 127.0.0.3 (network.mesh.bind), so gateways that find this one on " + other + " could not join its mesh; fix: bind the mesh to an address of " + other
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("mesh on 127.0.0.3, mDNS on %s:\n got: %v\nwant: %s…", other, err, want)
	}
}
