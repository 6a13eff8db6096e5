package opcua

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/opcua/opcuatest"
	"github.com/physd/physd/manifest"
)

// The scan tests browse node-opcua (examples/opcua/server: the folders
// Plant and Commissioning), a server implementation independent of gopcua.

// TestScan scans one test server in each of its subtests.
func TestScan(t *testing.T) {
	srv := opcuatest.Start(t, opcuatest.Options{})
	for _, c := range []struct {
		name string
		f    func(*testing.T, *opcuatest.Server)
	}{
		{"AddressSpace", testScanAddressSpace}, {"SkeletonReads", testScanSkeletonReads}, {"BrowseNext", testScanBrowseNext},
		{"Limits", testScanLimits}, {"NamespaceShift", testScanNamespaceShift},
	} {
		t.Run(c.name, func(t *testing.T) { c.f(t, srv) })
	}
}

func scanOpts(endpoint string) ScanOptions {
	o := DefaultScanOptions(endpoint)
	o.Timeout = 30 * time.Second
	return o
}

func scan(t *testing.T, o ScanOptions) *ScanReport {
	t.Helper()
	rep, err := Scan(t.Context(), o)
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	return rep
}

func variable(t *testing.T, rep *ScanReport, path string) *ScannedVariable {
	t.Helper()
	for _, v := range rep.Variables {
		if v.PathString() == path {
			return v
		}
	}
	t.Fatalf("no variable %s among %d", path, len(rep.Variables))
	return nil
}

// skeletonManifest writes the skeleton to dir and parses it as validate
// does (the manifest parser, then each bus and binding through the
// driver's offline checks).
func skeletonManifest(t *testing.T, rep *ScanReport, dir string) (*manifest.Manifest, []byte) {
	t.Helper()
	skel, n := rep.Skeleton(SkeletonOptions{Dir: dir})
	if n == 0 {
		t.Fatalf("no capability in the skeleton:\n%s", skel)
	}
	file := filepath.Join(dir, "skeleton.yml")
	if err := os.WriteFile(file, skel, 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Parse(file, skel)
	if err != nil {
		t.Fatalf("the skeleton does not parse: %v\n%s", err, skel)
	}
	for _, b := range m.Buses {
		if err := CheckBus(b); err != nil {
			t.Fatalf("bus: %v", err)
		}
	}
	for _, c := range m.Capabilities {
		if err := CheckBinding(c); err != nil {
			t.Fatalf("capability %s: %v", c.Name, err)
		}
	}
	if len(m.Capabilities) != n {
		t.Fatalf("Skeleton says %d capabilities, the manifest has %d", n, len(m.Capabilities))
	}
	return m, skel
}

// testScanAddressSpace: a scan of the test server finds each node kind
// with what a manifest needs of it, and leaves the server's own nodes and
// what is beyond the depth out, saying so.
func testScanAddressSpace(t *testing.T, srv *opcuatest.Server) {
	rep := scan(t, scanOpts(srv.Endpoint))
	const nsu = "nsu=urn:physd:opcua-test-server;"

	sp := variable(t, rep, "Plant/Setpoint")
	if sp.NodeID != nsu+"s=Setpoint" || sp.DataType != "Double" || sp.TypeClass != "builtin" || !sp.Writable() || !sp.Readable() ||
		sp.EURange == nil || *sp.EURange != (EURange{0, 100}) || sp.Units == nil || uneceCode(sp.Units) != "CEL" || sp.Value != 20.0 {
		t.Errorf("Setpoint: %+v (units %+v)", sp, sp.Units)
	}
	if v := variable(t, rep, "Plant/Temperature"); v.Writable() || !v.Readable() || v.MinSamplingMS != 100 || v.EURange != nil {
		t.Errorf("Temperature: %+v", v)
	}
	if v := variable(t, rep, "Plant/Numeric"); v.NodeID != nsu+"i=1001" {
		t.Errorf("Numeric: %s", v.NodeID)
	}
	if v := variable(t, rep, "Plant/Curve"); v.ValueRank != 1 || !slices.Equal(v.ArrayDims, []uint32{4}) {
		t.Errorf("Curve: rank %d dims %v", v.ValueRank, v.ArrayDims)
	}
	if v := variable(t, rep, "Plant/Broken"); v.Status != "BadSensorFailure" {
		t.Errorf("Broken: status %q", v.Status)
	}
	for path, want := range map[string][3]string{ // DataType, TypeName, TypeClass
		"Commissioning/Line1/Cycle":   {"Double", "Duration", "builtin"},
		"Commissioning/Line1/Started": {"DateTime", "", "builtin"},
		"Commissioning/Line1/Label":   {"LocalizedText", "", "builtin"},
		"Commissioning/Line1/State":   {"Enumeration", "ServerState", "enumeration"},
		"Commissioning/Line1/Any":     {"BaseDataType", "", "abstract"},
	} {
		v := variable(t, rep, path)
		if got := [3]string{v.DataType, v.TypeName, v.TypeClass}; got != want {
			t.Errorf("%s: type %v, want %v", path, got, want)
		}
	}
	if v := variable(t, rep, "Commissioning/Line1/Valve"); !slices.Equal(v.EnumStrings, []string{"Closed", "Open", "Fault"}) {
		t.Errorf("Valve: EnumStrings %v", v.EnumStrings)
	}
	if v := variable(t, rep, "Commissioning/Line1/OperatorOnly"); v.AccessLevel != 3 || v.UserAccessLevel != 1 {
		t.Errorf("OperatorOnly: AccessLevel %d UserAccessLevel %d", v.AccessLevel, v.UserAccessLevel)
	}
	if v := variable(t, rep, "Commissioning/Line1/Hidden"); v.AccessLevel&1 != 0 {
		t.Errorf("Hidden: AccessLevel %d", v.AccessLevel)
	}
	if v := variable(t, rep, "Commissioning/Line1/Odd"); v.NodeID != "ns=1;s=Odd;Id" || !strings.Contains(v.NodeNote, "namespace index") {
		t.Errorf("Odd: %s (%s)", v.NodeID, v.NodeNote)
	}
	if len(rep.Methods) != 1 || rep.Methods[0].PathString() != "Commissioning/Line1/Reset" {
		t.Errorf("methods: %+v", rep.Methods)
	}
	if !slices.ContainsFunc(rep.NotBrowsed, func(n *ScannedNode) bool { return n.NodeID == "i=2253" }) {
		t.Errorf("the Server object was not set aside: %+v", rep.NotBrowsed)
	}
	for _, v := range rep.Variables {
		if strings.HasPrefix(v.NodeID, "i=") || strings.Contains(v.PathString(), "Bottom") {
			t.Errorf("%s (%s) should not have been reached", v.PathString(), v.NodeID)
		}
	}
	if len(rep.Limits) != 1 || !strings.Contains(rep.Limits[0], "stopped at depth 6: 1 object(s) there not browsed") {
		t.Errorf("limits: %q", rep.Limits)
	}

	// A deeper scan reaches the bottom of Deep.
	o := scanOpts(srv.Endpoint)
	o.Depth = 9
	if v := variable(t, scan(t, o), "Commissioning/Deep/L3/L4/L5/L6/L7/Bottom"); v.Value != 9.0 {
		t.Errorf("Bottom: %+v", v)
	}
}

// testScanSkeletonReads: every capability of the skeleton reads through
// the driver with the type the skeleton gave it (the server's Bad status
// aside), the EURange and unit of Setpoint are its range and unit, and
// the nodes that cannot be bound are comments that say why.
func testScanSkeletonReads(t *testing.T, srv *opcuatest.Server) {
	m, skel := skeletonManifest(t, scan(t, scanOpts(srv.Endpoint)), t.TempDir())
	caps := map[string]*manifest.Capability{}
	for _, c := range m.Capabilities {
		caps[c.Name] = c
	}
	sp := caps["plant_setpoint"]
	if sp == nil || sp.Kind != manifest.KindRead || sp.Unit != "celsius" || sp.Range == nil || *sp.Range != (manifest.Range{Min: 0, Max: 100}) {
		t.Fatalf("plant_setpoint: %+v", sp)
	}
	for name, unit := range map[string]string{"commissioning_line1_tank_level": "litre", "commissioning_line1_tank_flow": "m³/h"} {
		if c := caps[name]; c == nil || c.Unit != unit {
			t.Errorf("%s: %+v, want unit %s", name, c, unit)
		}
	}
	if c := caps["commissioning_line1_tank_count"]; c == nil || c.DataType != manifest.TypeInt || *c.Range != (manifest.Range{Min: 1, Max: 99}) {
		t.Errorf("count: %+v", c)
	}
	for _, name := range []string{"plant_curve_0", "plant_curve_3", "commissioning_line1_tank_temperature", "commissioning_line1_cycle", "commissioning_line1_any", "commissioning_line1_valve"} {
		if caps[name] == nil {
			t.Errorf("no capability %s", name)
		}
	}
	for _, part := range []string{
		"# not bound: Commissioning/Line1/Started (nsu=urn:physd:opcua-test-server;s=Commissioning.Line1.Started): DataType DateTime",
		"# not bound: Commissioning/Line1/Label", "DataType LocalizedText",
		"Commissioning/Line1/State (nsu=urn:physd:opcua-test-server;s=Commissioning.Line1.State): DataType ServerState, a subtype of Enumeration, is an enumeration",
		"Commissioning/Line1/Samples (nsu=urn:physd:opcua-test-server;s=Commissioning.Line1.Samples): an array (ValueRank 1, ArrayDimensions [32]",
		"Commissioning/Line1/Log (nsu=urn:physd:opcua-test-server;s=Commissioning.Line1.Log): an array (ValueRank 1, ArrayDimensions [0]",
		"Commissioning/Line1/Hidden (nsu=urn:physd:opcua-test-server;s=Commissioning.Line1.Hidden): not readable (AccessLevel CurrentWrite)",
		"#   Commissioning/Line1/Reset (nsu=urn:physd:opcua-test-server;s=Commissioning.Line1.Reset)",
		"kind: read   # DECIDE: do_ candidate (this identity may write it)",
		"kind: read   # the node is writable (AccessLevel CurrentWrite), but not by this identity",
		"# LIMIT: stopped at depth 6: 1 object(s) there not browsed",
	} {
		if !strings.Contains(string(skel), part) {
			t.Errorf("the skeleton lacks %q", part)
		}
	}

	db, err := drivers.Open(t.Context(), m.Buses["plc"])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	for _, c := range m.Capabilities {
		p, err := db.Point(c)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		r, err := p.Read(ctx(t))
		if c.Name == "plant_broken" {
			if code, _, _ := drivers.CodeOf(err); code != "BadSensorFailure" {
				t.Errorf("plant_broken: %v", err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		if c.Name == "plant_setpoint" && r.Value != 20.0 {
			t.Errorf("plant_setpoint reads %v", r.Value)
		}
	}
}

// testScanBrowseNext: with one reference per Browse answer, every node's
// references come through BrowseNext, and the scan finds the same nodes.
func testScanBrowseNext(t *testing.T, srv *opcuatest.Server) {
	whole := scan(t, scanOpts(srv.Endpoint))
	o := scanOpts(srv.Endpoint)
	o.MaxReferencesPerNode = 1
	paged := scan(t, o)
	ids := func(r *ScanReport) []string {
		var out []string
		for _, v := range r.Variables {
			out = append(out, v.PathString()+" "+v.NodeID)
		}
		return out
	}
	if !slices.Equal(ids(whole), ids(paged)) || len(ids(whole)) < 25 {
		t.Fatalf("one page:\n%v\none reference per page:\n%v", ids(whole), ids(paged))
	}
	if paged.Requests < whole.Requests+20 {
		t.Errorf("%d requests paged, %d whole: BrowseNext was not used", paged.Requests, whole.Requests)
	}
	if len(paged.Notes) > 0 {
		t.Errorf("notes: %q", paged.Notes)
	}
}

// testScanLimits: the depth and node limits stop the browse and say what
// they left out.
func testScanLimits(t *testing.T, srv *opcuatest.Server) {
	o := scanOpts(srv.Endpoint)
	o.Depth = 1
	rep := scan(t, o)
	if len(rep.Variables) != 0 || len(rep.Limits) != 1 || !strings.Contains(rep.Limits[0], "stopped at depth 1: 2 object(s) there not browsed") {
		t.Errorf("depth 1: %d variables, limits %q", len(rep.Variables), rep.Limits)
	}
	if skel, n := rep.Skeleton(SkeletonOptions{}); n != 0 || !strings.Contains(string(skel), "NOTHING WAS BOUND") {
		t.Errorf("an empty skeleton: %d capabilities\n%s", n, skel)
	}

	o = scanOpts(srv.Endpoint)
	o.MaxNodes = 5
	rep = scan(t, o)
	if rep.Nodes != 5 || len(rep.Limits) != 1 || !strings.Contains(rep.Limits[0], "stopped at 5 nodes (--max-nodes)") {
		t.Errorf("max-nodes 5: %d nodes, limits %q", rep.Nodes, rep.Limits)
	}

	o = scanOpts(srv.Endpoint)
	o.Root = "nsu=urn:physd:opcua-test-server;s=Commissioning.Line1.Tank"
	rep = scan(t, o)
	if rep.RootPath != "Tank" || len(rep.Variables) != 4 || rep.Variables[0].PathString() != "Level" {
		t.Errorf("root Tank: %q, %d variables", rep.RootPath, len(rep.Variables))
	}
	o.Root = "ns=1;s=NoSuchFolder"
	if _, err := Scan(t.Context(), o); !hasCode(err, "BadNodeIdUnknown") {
		t.Errorf("an unknown root: %v", err)
	}
}

func hasCode(err error, code string) bool {
	c, _, ok := drivers.CodeOf(err)
	return ok && c == code
}

// testScanNamespaceShift: the skeleton names nodes by namespace URI, so
// it reads the same nodes on a server whose namespace table has moved the
// test namespace from ns=1 to ns=2.
func testScanNamespaceShift(t *testing.T, srv *opcuatest.Server) {
	shifted := opcuatest.Start(t, opcuatest.Options{ShiftNamespace: true})
	rep := scan(t, scanOpts(srv.Endpoint))
	rep.Bus.Endpoint = shifted.Endpoint
	m, _ := skeletonManifest(t, rep, t.TempDir())
	db, err := drivers.Open(t.Context(), m.Buses["plc"])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	for _, c := range m.Capabilities {
		if c.Name != "plant_setpoint" && c.Name != "plant_numeric" {
			continue
		}
		p, _ := db.Point(c)
		if r, err := p.Read(ctx(t)); err != nil || (r.Value != 20.0 && r.Value != 7.25) {
			t.Errorf("%s on the shifted server: %v %v", c.Name, r.Value, err)
		}
	}
	// The one node written with its index (a ';' in its id) is the one
	// that moved: it says so in the skeleton.
	if v := variable(t, rep, "Commissioning/Line1/Odd"); !strings.Contains(v.NodeNote, "the index changes if the server reorders its namespace table") {
		t.Errorf("Odd: %q", v.NodeNote)
	}
}

// TestScanSecurity: a secured server's certificate is shown (SHA-256)
// until it is pinned; a pinned fingerprint is checked; a mode the server
// does not offer and an identity it does not take are refused, naming
// what it offers; a refused password names the user.
func TestScanSecurity(t *testing.T) {
	srv := opcuatest.Start(t, opcuatest.Options{Secure: true, User: "operator:s3cret"})
	pem, err := readCert(srv.ServerCertificate())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(pem)
	fp := hex.EncodeToString(sum[:])
	secure := func(extra func(*ScanOptions)) error {
		o := scanOpts(srv.Endpoint)
		o.Bus.SecurityPolicy, o.Bus.Username, o.Bus.PasswordEnv = PolicyBasic256Sha256, "operator", "PHYSD_TEST_SCAN_PW"
		o.Depth = 2
		if extra != nil {
			extra(&o)
		}
		_, err := Scan(t.Context(), o)
		return err
	}
	t.Setenv("PHYSD_TEST_SCAN_PW", "s3cret")

	err = secure(nil)
	if !hasCode(err, "server_certificate_unknown") || !strings.Contains(err.Error(), "sha256 "+fp) {
		t.Errorf("no pin: %v", err)
	}
	if _, fix, _ := drivers.CodeOf(err); !strings.Contains(fix, "server_sha256: "+fp) {
		t.Errorf("no pin, fix: %s", fix)
	}
	if err := secure(func(o *ScanOptions) { o.PinSHA256 = strings.Repeat("ab", 32) }); !hasCode(err, "server_certificate_mismatch") {
		t.Errorf("a wrong fingerprint: %v", err)
	}
	o := scanOpts(srv.Endpoint)
	o.Bus.SecurityPolicy, o.Bus.SecurityMode, o.Bus.Username, o.Bus.PasswordEnv = PolicyBasic256Sha256, ModeSign, "operator", "PHYSD_TEST_SCAN_PW"
	o.PinSHA256 = strings.ToUpper(fp[:2]) + ":" + fp[2:]
	rep := scan(t, o)
	if !slices.Equal(rep.ServerCertificate, pem) || rep.ServerSHA256 != fp || rep.Identity != "user operator" {
		t.Errorf("pinned by fingerprint: sha256 %s, identity %s", rep.ServerSHA256, rep.Identity)
	}
	if err := secure(func(o *ScanOptions) { o.Bus.ServerCertificate = srv.ServerCertificate() }); err != nil {
		t.Errorf("pinned by file: %v", err)
	}

	err = secure(func(o *ScanOptions) { o.Bus.SecurityPolicy, o.Bus.Username, o.Bus.PasswordEnv = "", "", "" })
	if !hasCode(err, "security_not_offered") || !strings.Contains(err.Error(), "it offers Basic256Sha256/Sign, Aes128_Sha256_RsaOaep/Sign, Aes256_Sha256_RsaPss/Sign, Basic256Sha256/SignAndEncrypt, Aes128_Sha256_RsaOaep/SignAndEncrypt, Aes256_Sha256_RsaPss/SignAndEncrypt") {
		t.Errorf("security None: %v", err)
	}
	err = secure(func(o *ScanOptions) {
		o.Bus.ServerCertificate, o.Bus.Username, o.Bus.PasswordEnv = srv.ServerCertificate(), "", ""
	})
	if !hasCode(err, "identity_not_offered") || !strings.Contains(err.Error(), "does not take the Anonymous identity (it takes UserName, Certificate)") {
		t.Errorf("anonymous: %v", err)
	}
	t.Setenv("PHYSD_TEST_SCAN_PW", "wrong")
	err = secure(func(o *ScanOptions) { o.Bus.ServerCertificate = srv.ServerCertificate() })
	var se *ScanError
	if !errors.As(err, &se) || se.Key != "username" || !strings.HasPrefix(se.Code(), "Bad") || !strings.Contains(se.Fix(), "password_env PHYSD_TEST_SCAN_PW") {
		t.Errorf("a wrong password: %v", err)
	}
	os.Unsetenv("PHYSD_TEST_SCAN_PW")
	if err := secure(func(o *ScanOptions) { o.Bus.ServerCertificate = srv.ServerCertificate() }); !hasCode(err, "password_missing") {
		t.Errorf("no password: %v", err)
	}
}

// TestScanOperationLimits: a server that takes two nodes per Read and
// Browse is scanned within its limits (the first Read of the limits
// themselves, three nodes, is refused and read again one by one), and
// the scan finds what it finds on a server without limits.
func TestScanOperationLimits(t *testing.T) {
	srv := opcuatest.Start(t, opcuatest.Options{OperationLimits: 2})
	rep := scan(t, scanOpts(srv.Endpoint))
	if ol := rep.OperationLimits; ol.MaxNodesPerRead != 2 || ol.MaxNodesPerBrowse != 2 {
		t.Errorf("operation limits: %+v", ol)
	}
	if len(rep.Notes) > 0 {
		t.Errorf("notes: %q", rep.Notes)
	}
	if len(rep.Variables) != 29 || variable(t, rep, "Plant/Setpoint").EURange == nil || variable(t, rep, "Commissioning/Line1/Cycle").TypeName != "Duration" {
		t.Errorf("%d variables", len(rep.Variables))
	}
	if skel, _ := rep.Skeleton(SkeletonOptions{}); !strings.Contains(string(skel), "# The server's operation limits (MaxNodesPerBrowse 2, MaxNodesPerRead 2) bounded each request.") {
		t.Errorf("the skeleton does not say the limits:\n%.1500s", skel)
	}
}

// TestScanSilentServer: a server that accepts the connection and never
// answers ends the scan within its connect timeout, as unreachable.
func TestScanSilentServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	o := scanOpts("opc.tcp://" + ln.Addr().String())
	o.Bus.ConnectTimeoutMS = 300
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a hang guard, not the bound under test
	defer cancel()
	if _, err := Scan(ctx, o); !hasCode(err, "unreachable") || ctx.Err() != nil {
		t.Fatalf("a silent server: %v (context %v)", err, ctx.Err())
	}
}

// TestScanOptionsChecked: bad options are refused before anything is
// sent, naming the option.
func TestScanOptionsChecked(t *testing.T) {
	for _, c := range []struct {
		edit func(*ScanOptions)
		want string
	}{
		{func(o *ScanOptions) { o.Depth = 0 }, "depth must be 1..64"},
		{func(o *ScanOptions) { o.MaxNodes = -1 }, "max_nodes must be"},
		{func(o *ScanOptions) { o.Timeout = time.Millisecond }, "timeout must be at least 1s"},
		{func(o *ScanOptions) { o.Root = "Objects" }, "has no identifier type"},
		{func(o *ScanOptions) { o.PinSHA256 = "abc" }, "is not a SHA-256"},
		{func(o *ScanOptions) { o.PinSHA256 = strings.Repeat("0", 64) }, "server_sha256 applies to a secured bus"},
		{func(o *ScanOptions) { o.Bus.SecurityMode = ModeSign }, "security_mode Sign needs a security policy"},
		{func(o *ScanOptions) { o.Bus.Endpoint = "http://plc:4840" }, "not an opc.tcp:// URL"},
	} {
		o := scanOpts("opc.tcp://127.0.0.1:1")
		c.edit(&o)
		if err := CheckScanOptions(o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.want, err)
		}
	}
	// A secured bus may leave the server certificate to the scan.
	o := scanOpts("opc.tcp://127.0.0.1:1")
	o.Bus.SecurityPolicy = PolicyBasic256Sha256
	if err := CheckScanOptions(o); err != nil {
		t.Errorf("a secured bus without a pin: %v", err)
	}
}
