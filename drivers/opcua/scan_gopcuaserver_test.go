package opcua

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/server"
	"github.com/gopcua/opcua/ua"

	"github.com/physd/physd/drivers"
)

// TestScanGopcuaServer: a second server implementation, gopcua's own
// (in process), which publishes less than the specification asks: no
// UserAccessLevel, DataType Int32 for values it sends as Int64, a
// BaseDataType for a DateTime. The skeleton still validates and every
// capability in it reads.
func TestScanGopcuaServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s := server.New(server.EnableSecurity("None", ua.MessageSecurityModeNone), server.EnableAuthMode(ua.UserTokenTypeAnonymous),
		server.EndPoint("127.0.0.1", port))
	plant := server.NewMapNamespace(s, "urn:gopcua:plant")
	plant.Data["Flow"] = 12.5
	plant.Data["Count"] = 42 // DataType Int32, sent as Int64
	plant.Data["Mode"] = "auto"
	plant.Data["Running"] = true
	plant.Data["Since"] = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // DataType BaseDataType
	root, _ := s.Namespace(0)
	root.Objects().AddRef(plant.Objects(), id.HasComponent, true)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })

	rep := scan(t, scanOpts(fmt.Sprintf("opc.tcp://127.0.0.1:%d", port)))
	m, skel := skeletonManifest(t, rep, t.TempDir())
	for _, part := range []string{
		`binding: {type: opcua, bus: plc, node: "nsu=urn:gopcua:plant;s=Count", ua_type: Int64}`,
		"# note: the server declares DataType Int32 but sent an Int64 at scan time",
		"# note: the server publishes no UserAccessLevel: its AccessLevel is taken for this identity's",
		"# not bound: urn:gopcua:plant/Since (nsu=urn:gopcua:plant;s=Since): DataType BaseDataType is abstract",
	} {
		if !strings.Contains(string(skel), part) {
			t.Errorf("the skeleton lacks %q", part)
		}
	}
	if len(m.Capabilities) != 4 {
		t.Errorf("%d capabilities, want Flow, Count, Mode and Running:\n%s", len(m.Capabilities), skel)
	}
	db, err := drivers.Open(t.Context(), m.Buses["plc"])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	want := map[string]any{"urn_gopcua_plant_flow": 12.5, "urn_gopcua_plant_count": int64(42), "urn_gopcua_plant_mode": "auto", "urn_gopcua_plant_running": true}
	for _, c := range m.Capabilities {
		p, err := db.Point(c)
		if err != nil {
			t.Fatal(err)
		}
		if r, err := p.Read(ctx(t)); err != nil || r.Value != want[c.Name] {
			t.Errorf("%s: %v %v, want %v", c.Name, r.Value, err, want[c.Name])
		}
	}
}
