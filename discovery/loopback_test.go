package discovery

import (
	"context"
	"net"
	"testing"
	"time"
)

// TestAdvertiseBrowseLoopback: a gateway advertised on lo is found by a
// browse on lo with its TXT and mesh address; after Close (goodbye) it
// no longer answers.
func TestAdvertiseBrowseLoopback(t *testing.T) {
	ifi, ips, err := Interface("lo")
	if err != nil {
		t.Skipf("no usable loopback interface: %v", err)
	}
	rec := Record{DeviceID: "gw_loop_a", PhysMCPVersion: "0.1", MCPPort: 8080, MCPPath: "/mcp", MeshPort: 7946, MeshLabel: "site"}
	a, err := Advertise(AdvertiseConfig{Interface: ifi, IPs: []net.IP{net.IPv4(127, 0, 0, 9)}, Record: rec, Port: 8080})
	if err != nil {
		t.Fatal(err)
	}
	_ = ips
	gws, err := Browse(context.Background(), ifi, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var got *Gateway
	for i := range gws {
		if gws[i].DeviceID == "gw_loop_a" {
			got = &gws[i]
		}
	}
	if got == nil {
		t.Fatalf("browse on lo did not find gw_loop_a: %+v", gws)
	}
	if got.Record != rec || got.MeshAddr() != "127.0.0.9:7946" || got.Port != 8080 {
		t.Errorf("found %+v (mesh %s), want %+v at 127.0.0.9:7946", *got, got.MeshAddr(), rec)
	}
	if a.Answers() == 0 {
		t.Errorf("the advertiser counted no answer")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	gws, err = Browse(context.Background(), ifi, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gws {
		if g.DeviceID == "gw_loop_a" {
			t.Errorf("gw_loop_a still answers after Close")
		}
	}
}

func TestLink(t *testing.T) {
	ifi, _, err := Interface("lo")
	if err != nil {
		t.Skipf("no usable loopback interface: %v", err)
	}
	l := Link(ifi)
	if len(l) != 1 || l[0].String() != "127.0.0.0/8" {
		t.Errorf("Link(lo) = %v, want [127.0.0.0/8]", l)
	}
}
