package opcua

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/server"
	"github.com/gopcua/opcua/ua"

	"github.com/physd/physd/drivers"
)

// gopcuaServer runs gopcua's own server in process, a second server
// implementation, with the namespace urn:gopcua:plant holding data; it
// returns the namespace and the endpoint. It publishes less than the
// specification asks (no UserAccessLevel, no TranslateBrowsePathsToNodeIds,
// no TransferSubscriptions, no deadband filters).
func gopcuaServer(t *testing.T, data map[string]any) (*server.MapNamespace, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s := server.New(server.EnableSecurity("None", ua.MessageSecurityModeNone), server.EnableAuthMode(ua.UserTokenTypeAnonymous),
		server.EndPoint("127.0.0.1", port))
	plant := server.NewMapNamespace(s, "urn:gopcua:plant")
	for k, v := range data {
		plant.Data[k] = v
	}
	root, _ := s.Namespace(0)
	root.Objects().AddRef(plant.Objects(), id.HasComponent, true)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return plant, fmt.Sprintf("opc.tcp://127.0.0.1:%d", port)
}

// TestGopcuaServerWrite: a server without TranslateBrowsePathsToNodeIds
// (it answers BadServiceUnsupported) still takes numeric writes: the
// EURange is looked for by Browse, and the refused service neither fails
// the write nor drops the session.
func TestGopcuaServerWrite(t *testing.T) {
	plant, ep := gopcuaServer(t, map[string]any{"Flow": 12.5, "Level": int16(3)})
	b, p := openAll(t, mustParse(t, "{type: opcua, endpoint: '"+ep+"', connect_timeout_ms: 5000, reconnect_backoff_ms: 200}",
		doCap("flow", "float", "{type: opcua, bus: plc, node: 'nsu=urn:gopcua:plant;s=Flow'}")+
			doCap("level", "int", "{type: opcua, bus: plc, node: 'nsu=urn:gopcua:plant;s=Level', ua_type: Int16}")))
	if err := p["flow"].Write(ctx(t), 20.0); err != nil {
		t.Fatalf("write on a server without TranslateBrowsePathsToNodeIds: %v", err)
	}
	if r := read(t, p["flow"]); r.Value != 20.0 || plant.GetValue("Flow") != 20.0 {
		t.Fatalf("read back %v, the server holds %v", r.Value, plant.GetValue("Flow"))
	}
	if err := p["level"].Write(ctx(t), int64(7)); err != nil {
		t.Fatalf("a second write: %v", err)
	}
	if err := b.Health(); err != nil {
		t.Fatalf("health: %v", err)
	}
}

// TestGopcuaServerIndexRangeIgnored: a server that ignores IndexRange
// (gopcua's answers a Read of element 2 with the whole array, and would
// take a write of it for the whole array) makes an indexed binding's read
// an error that names it, with a code, so the node writes nothing through
// it (it reads before every write).
func TestGopcuaServerIndexRangeIgnored(t *testing.T) {
	_, ep := gopcuaServer(t, map[string]any{"Curve": []float64{1, 2, 3, 4}})
	_, p := openAll(t, mustParse(t, "{type: opcua, endpoint: '"+ep+"', connect_timeout_ms: 5000}",
		doCap("curve2", "float", "{type: opcua, bus: plc, node: 'nsu=urn:gopcua:plant;s=Curve', index: 2}")))
	_, err := p["curve2"].Read(ctx(t))
	wantErr(t, err, "returned 4 elements for one index", "ignores IndexRange")
	if code, _, _ := drivers.CodeOf(err); code != "index_range_ignored" {
		t.Fatalf("code %q", code)
	}
}
