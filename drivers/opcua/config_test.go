package opcua

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/drivers"
)

func TestBusDefaults(t *testing.T) {
	m := mustParse(t, "{type: opcua, endpoint: 'opc.tcp://127.0.0.1:4840/x'}", readCap("t", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Temperature'}"))
	s, err := parseBus(m.Buses["plc"])
	if err != nil {
		t.Fatal(err)
	}
	if s.Policy != PolicyNone || s.Mode != ModeNone || s.Timeout != 2*time.Second || s.ConnectTimeout != 5*time.Second || s.Reconnect != time.Second {
		t.Fatalf("defaults: %+v", s.Config)
	}
}

func TestBusErrors(t *testing.T) {
	dir := t.TempDir()
	cert := filepath.Join(dir, "c.pem")
	if err := os.WriteFile(cert, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		bus  string
		want []string
	}{
		{"{type: opcua}", []string{"plant.yml:5:", "buses.plc", "endpoint", "required", "opc.tcp://"}},
		{"{type: opcua, endpoint: 'http://x:1'}", []string{"plant.yml:5:", "not an opc.tcp:// URL"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', security_policy: Basic128}", []string{"security_policy", "Basic128", "Basic256Sha256"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', security_mode: Sign}", []string{"security_mode Sign needs a security policy"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', security_policy: Basic256Sha256}", []string{"pin", "server_certificate"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', security_policy: Basic256Sha256, security_mode: None, server_certificate: " + cert + "}", []string{"security_mode None with security_policy Basic256Sha256", "not an X.509 certificate"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', security_policy: Basic256Sha256, certificate: a.pem, server_certificate: " + cert + "}", []string{"certificate and private_key go together"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', server_certificate: s.pem}", []string{"applies to a secured bus"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', security_policy: Basic256Sha256, server_trust: []}", []string{"server_trust is empty"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', security_policy: Basic256Sha256, server_trust: [" + cert + "], server_certificate: " + cert + "}", []string{"both given"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', security_policy: Basic256Sha256, server_trust: [" + cert + "]}", []string{"server_trust", "not an X.509 certificate"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', username: op}", []string{"password_env", "never the password"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', password_env: X}", []string{"password_env without username"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', user_certificate: u.pem}", []string{"user_certificate and user_private_key go together"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', user_certificate: u.pem, user_private_key: u.key}", []string{"needs a secured channel"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', username: a, password_env: P, user_certificate: u.pem, user_private_key: u.key}", []string{"username and user_certificate both given"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', timeout_ms: 1}", []string{"timeout_ms must be between 10 and 60000"}},
		{"{type: opcua, endpoint: 'opc.tcp://h:1', endpont: x}", []string{"endpont"}},
	}
	for _, c := range cases {
		t.Run(c.bus, func(t *testing.T) {
			m := mustParse(t, c.bus, readCap("t", "float", "{type: opcua, bus: plc, node: 'i=1'}"))
			_, err := parseBus(m.Buses["plc"])
			wantErr(t, err, c.want...)
			if _, err := drivers.Open(t.Context(), m.Buses["plc"]); err == nil {
				t.Fatal("Open accepted it")
			}
		})
	}
}

func TestIdentityPassword(t *testing.T) {
	m := mustParse(t, "{type: opcua, endpoint: 'opc.tcp://h:1', username: op, password_env: PHYSD_TEST_OPCUA_PW}", readCap("t", "float", "{type: opcua, bus: plc, node: 'i=1'}"))
	s, err := parseBus(m.Buses["plc"])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.password(); err == nil {
		t.Fatal("unset password_env accepted")
	}
	t.Setenv("PHYSD_TEST_OPCUA_PW", "secret")
	if pw, err := s.password(); err != nil || pw != "secret" {
		t.Fatalf("password %q %v", pw, err)
	}
}

func TestBindingNodeForms(t *testing.T) {
	for _, c := range []struct{ node, ns, text string }{
		{"i=2258", "", "i=2258"},
		{"ns=1;s=Temperature", "", "ns=1;s=Temperature"},
		{"ns=3;g=72962B91-FA75-4AE6-8D28-B404DC7DAF63", "", "ns=3;g=72962B91-FA75-4AE6-8D28-B404DC7DAF63"},
		{"ns=2;i=1001", "", "ns=2;i=1001"},
		{"nsu=urn:physd:opcua-test-server;s=Setpoint", "urn:physd:opcua-test-server", "s=Setpoint"},
	} {
		r, err := parseNodeID(c.node)
		if err != nil {
			t.Fatalf("%s: %v", c.node, err)
		}
		if r.nsURI != c.ns || r.id.String() != c.text {
			t.Fatalf("%s: ns %q id %s", c.node, r.nsURI, r.id)
		}
	}
	for _, bad := range []string{"Temperature", "ns=x;s=a", "nsu=;s=a", "nsu=urn:a;ns=2;s=b", "ns=1;g=nothex"} {
		if _, err := parseNodeID(bad); err == nil {
			t.Fatalf("%s accepted", bad)
		}
	}
}

func TestBindingErrors(t *testing.T) {
	bus := "{type: opcua, endpoint: 'opc.tcp://h:1'}"
	cases := []struct {
		caps string
		want []string
	}{
		{readCap("t", "float", "{type: opcua, bus: plc, ua_type: Double}"), []string{"plant.yml:", "node", "required"}},
		{readCap("t", "float", "{type: opcua, bus: plc, node: Temperature}"), []string{"binding.node", "no identifier type", "ns=1;s=Temperature"}},
		{readCap("t", "float", "{type: opcua, bus: plc, address: 'i=1', node: 'i=2'}"), []string{"both as address and as node"}},
		{readCap("t", "float", "{type: opcua, bus: plc, node: 'i=1', ua_type: Decimal}"), []string{"ua_type", "Decimal", "Double"}},
		{readCap("t", "bool", "{type: opcua, bus: plc, node: 'i=1', ua_type: Double}"), []string{"data_type bool cannot be served by OPC UA Double"}},
		{readCap("t", "int", "{type: opcua, bus: plc, node: 'i=1', ua_type: Float}"), []string{"data_type int cannot be served"}},
		{readCap("t", "float", "{type: opcua, bus: plc, node: 'i=1', index: -1}"), []string{"index -1 is negative"}},
		{readCap("t", "float", "{type: opcua, bus: plc, node: 'i=1', nod: x}"), []string{"nod"}},
	}
	for _, c := range cases {
		t.Run(c.want[len(c.want)-1], func(t *testing.T) {
			m, err := parseManifest(t, bus, c.caps)
			if err == nil {
				err = CheckBinding(m.Capabilities[0])
			}
			wantErr(t, err, c.want...)
		})
	}
	// The ones that bind: an integer node behind a float capability, the
	// address form, an enum on a String node.
	m := mustParse(t, bus, readCap("a", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Level', ua_type: Int16}")+
		readCap("b", "float", "{type: opcua, bus: plc, address: 'ns=1;i=1001'}")+
		"  - name: mode\n    kind: do\n    description: d\n    data_type: enum\n    enum_values: [auto, manual]\n    semantic_tags: [t]\n    binding: {type: opcua, bus: plc, node: 'ns=1;s=Mode'}\n")
	for i := range m.Capabilities {
		if err := CheckBinding(m.Capabilities[i]); err != nil {
			t.Fatalf("%s: %v", m.Capabilities[i].Name, err)
		}
	}
}

func TestEncodeRefusals(t *testing.T) {
	b := &Bus{spec: &busSpec{name: "plc"}}
	for _, c := range []struct {
		typ  string
		v    any
		want string
	}{
		{"Int16", int64(40000), "outside Int16"},
		{"Byte", int64(-1), "outside Byte"},
		{"Int32", 2.5, "not a whole number"},
		{"Boolean", 1.0, "true or false"},
		{"Float", 1e300, "beyond a Float"},
		{"Double", "x", "takes a number"},
	} {
		typ, _ := lookupType(c.typ)
		p := &point{bus: b, spec: &pointSpec{node: nodeRef{text: "i=1"}, typ: typ, index: -1, writable: true}}
		_, _, err := p.encode(c.v)
		wantErr(t, err, c.want)
		if !errorsIs(err, drivers.ErrBadValue) {
			t.Fatalf("%v does not wrap ErrBadValue", err)
		}
	}
	typ, _ := lookupType("Float")
	p := &point{bus: b, spec: &pointSpec{typ: typ, index: -1}}
	if q, err := p.Quantize(0.1); err != nil || q != float64(float32(0.1)) {
		t.Fatalf("Quantize(0.1) = %v %v", q, err)
	}
}

func TestSharedNodeRefused(t *testing.T) {
	bus := "{type: opcua, endpoint: 'opc.tcp://h:1'}"
	m := mustParse(t, bus, doCap("a", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Setpoint'}")+
		doCap("b", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Setpoint'}")+
		doCap("c", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Curve', index: 0}")+
		doCap("d", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Curve', index: 1}")+
		doCap("e", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Curve2'}")+
		doCap("f", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Curve2', index: 3}"))
	var spans []drivers.Spanner
	for _, c := range m.Capabilities {
		sp, err := BindingSpan(c)
		if err != nil {
			t.Fatal(err)
		}
		spans = append(spans, sp)
	}
	err := drivers.SharedSpans("plc", m.Capabilities, spans)
	wantErr(t, err, "capabilities a and b both write", "capabilities e and f both write")
	if strings.Contains(err.Error(), "capabilities c and d") {
		t.Fatalf("two elements of one array refused: %v", err)
	}
}
