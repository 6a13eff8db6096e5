package opcua

import (
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/drivers"
)

// TestScanGopcuaServer: a second server implementation, gopcua's own
// (in process), which publishes less than the specification asks: no
// UserAccessLevel, DataType Int32 for values it sends as Int64, a
// BaseDataType for a DateTime. The skeleton still validates and every
// capability in it reads.
func TestScanGopcuaServer(t *testing.T) {
	_, ep := gopcuaServer(t, map[string]any{
		"Flow":    12.5,
		"Count":   42, // DataType Int32, sent as Int64
		"Mode":    "auto",
		"Running": true,
		"Since":   time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), // DataType BaseDataType
	})
	rep := scan(t, scanOpts(ep))
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
