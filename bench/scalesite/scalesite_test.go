package scalesite_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/bench/scalesite"
	_ "github.com/physd/physd/drivers/modbus" // modbus_tcp
	"github.com/physd/physd/drivers/modbus/modbustest"
	_ "github.com/physd/physd/drivers/opcua" // opcua
	"github.com/physd/physd/drivers/opcua/opcuatest"
	"github.com/physd/physd/internal/testrig"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/promcp"
)

// TestSiteFitsClientsAndIsObserved: the generated 10 000-point site (20
// Modbus TCP devices of 500 points, in-process peers here) lists at most
// 40 tools on its default endpoint — with instances (no mesh: physd's
// default) and with families — and every one of its points is still
// polled: each reaches the observation stream (history, alarms, MQTT and
// the fleet uplink consume it) with quality good, and its observation
// resource reads.
func TestSiteFitsClientsAndIsObserved(t *testing.T) {
	t.Parallel()
	const devices, points = 20, 500
	var addrs []string
	for range devices {
		bank := modbustest.NewBank(100 + points)
		for a := range points {
			bank.SetInput(1, uint16(100+a), uint16(100+a))
			bank.SetHolding(1, uint16(100+a), 500)
		}
		srv, err := modbustest.StartTCP("127.0.0.1:0", bank)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Stop() })
		addrs = append(addrs, srv.Addr)
	}
	checkSite(t, scalesite.Site{Addrs: addrs}, devices*points)
}

// TestOPCUASiteFitsClientsAndIsObserved: the OPC UA site — 10 000 points
// on one node-opcua server (server.js --points), each a monitored item
// with a deadband — lists at most 40 tools, and every point's first value
// comes through the subscription with quality good.
func TestOPCUASiteFitsClientsAndIsObserved(t *testing.T) {
	t.Parallel()
	var site scalesite.Site
	site.OPCUA = opcuatest.Start(t, opcuatest.Options{Points: site.ServerPoints()}).Endpoint
	checkSite(t, site, site.Capabilities())
}

// checkSite runs the generated site (caps capabilities) on a node and
// checks its default tools/list (with instances and with families), the
// observation resources, and that every read point comes round on the
// observation stream with a good value.
func checkSite(t *testing.T, site scalesite.Site, caps int) {
	t.Helper()
	devices, reads := site.Devices(), site.Reads()
	m, err := manifest.Parse("scale.yml", site.Manifest())
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Capabilities) != caps {
		t.Fatalf("%d capabilities, want %d", len(m.Capabilities), caps)
	}
	rig := testrig.OpenManifest(t, m, "", nil)
	sub := rig.Node.Subscribe(4 * caps)
	defer sub.Close()

	ctx := context.Background()
	var want []string
	for i := range devices {
		want = append(want, "read_"+scalesite.PointName(i, 0))
		if i < 5 {
			want = append(want, scalesite.SetpointTool(i))
		}
	}
	want = append(want, "can_do")
	slices.Sort(want)
	for _, families := range []bool{false, true} {
		srv := mcpserver.New(rig.Node, mcpserver.Options{Families: families, StdioRole: "admin"})
		ct, st := mcp.NewInMemoryTransports()
		ss, err := srv.MCP().Connect(ctx, st, nil)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "scale-test", Version: "1"}, nil).Connect(ctx, ct, nil)
		if err != nil {
			t.Fatal(err)
		}
		var tools []string
		for tl, err := range cs.Tools(ctx, nil) {
			if err != nil {
				t.Fatal(err)
			}
			tools = append(tools, tl.Name)
		}
		slices.Sort(tools)
		switch {
		case len(tools) > 40:
			t.Errorf("families %v: the default tools/list has %d tools, more than 40", families, len(tools))
		case !families && !slices.Equal(tools, want):
			t.Errorf("tools/list: %v, want %v", tools, want)
		case families && !slices.Equal(tools, []string{"can_do", "do_setpoint", "read_power"}):
			t.Errorf("tools/list with families: %v", tools)
		}
		if !families {
			// Every point's observation is a resource: the tools' listed,
			// the others' through the template.
			n := 0
			for _, err := range cs.Resources(ctx, nil) {
				if err != nil {
					t.Fatal(err)
				}
				n++
			}
			if n > 40 {
				t.Errorf("%d resources listed", n)
			}
			for _, name := range []string{scalesite.PointName(0, 0), scalesite.PointName(7, 321), scalesite.PointName(devices-1, reads-1)} {
				if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.ObsURIPrefix + name}); err != nil {
					t.Errorf("%s: %v", name, err)
				}
			}
		}
		cs.Close()
		ss.Wait()
	}

	// Every point comes round on the observation stream with a good value.
	seen := map[string]bool{}
	deadline := time.After(2 * time.Minute)
	for len(seen) < caps {
		select {
		case o := <-sub.C:
			if o.Cap != nil && o.Obs.Quality == promcp.QualityGood {
				seen[o.Cap.Name] = true
			}
		case <-deadline:
			t.Fatalf("%d of %d points observed with a good value (%d observations dropped)", len(seen), caps, sub.Dropped())
		}
	}
}
