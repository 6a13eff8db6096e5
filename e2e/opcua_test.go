package e2e

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/drivers/opcua/opcuatest"
)

// The OPC UA tests run the built binary against node-opcua
// (examples/opcua/server), an OPC UA server implementation independent of
// the gopcua client physd uses. They skip when Node and node-opcua are not
// installed (cd examples/opcua/server && npm ci; .ci/run does it).

const opcuaManifest = `physmcp_version: "0.1"
device:
  id: gw_opcua_001
  type: plc
  location: {zone: plant}
network:
  protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080, role: native}]
  mesh: {enabled: false}
buses:
  plc: {type: opcua, endpoint: "ENDPOINT", timeout_ms: 1000, connect_timeout_ms: 5000, reconnect_backoff_ms: 200BUSEXTRA}
capabilities:
  - name: temperature
    kind: read
    description: process temperature
    data_type: float
    unit: celsius
    semantic_tags: [plant]
    cache_ttl_ms: 0
    binding: {type: opcua, bus: plc, node: "ns=1;s=Temperature"}
  - name: drifting
    kind: read
    description: a value the server marks uncertain
    data_type: float
    semantic_tags: [plant]
    cache_ttl_ms: 0
    binding: {type: opcua, bus: plc, node: "ns=1;s=Drifting"}
  - name: broken
    kind: read
    description: a sensor the server reports failed
    data_type: float
    semantic_tags: [plant]
    cache_ttl_ms: 0
    binding: {type: opcua, bus: plc, node: "ns=1;s=Broken"}
  - name: setpoint
    kind: do
    description: temperature setpoint
    data_type: float
    unit: celsius
    range: {min: 0, max: 200}
    semantic_tags: [plant]
    cache_ttl_ms: 0
    binding: {type: opcua, bus: plc, node: "nsu=urn:physd:opcua-test-server;s=Setpoint"}
  - name: setpoint_now
    kind: read
    description: the setpoint the server holds
    data_type: float
    unit: celsius
    semantic_tags: [plant]
    cache_ttl_ms: 0
    binding: {type: opcua, bus: plc, node: "ns=1;s=Setpoint"}
  - name: locked
    kind: do
    description: a node the server does not let anyone write
    data_type: float
    range: {min: 0, max: 10}
    semantic_tags: [plant]
    binding: {type: opcua, bus: plc, node: "ns=1;s=Locked"}
`

func startOPCUA(t *testing.T, endpoint, busExtra string) (*daemon, *mcp.ClientSession) {
	t.Helper()
	src := strings.NewReplacer("ENDPOINT", endpoint, "BUSEXTRA", busExtra).Replace(opcuaManifest)
	p := filepath.Join(t.TempDir(), "physmcp.manifest.yml")
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startHTTP(t, daemonOpts{manifest: p})
	return d, connectHTTP(t, d, "2026-07-28")
}

func readOPCUA(t *testing.T, cs *mcp.ClientSession, name string) map[string]any {
	t.Helper()
	return structured(t, call(t, cs, "read_"+name, map[string]any{}))
}

// TestOPCUAReadWrite: reads with their status codes, a write verified by
// read-back, a write outside the node's EURange refused with nothing
// written, and a Bad write result answered failed with the code name.
func TestOPCUAReadWrite(t *testing.T) {
	t.Parallel() // its own server on a free port and its own daemon
	srv := opcuatest.Start(t, opcuatest.Options{})
	_, cs := startOPCUA(t, srv.Endpoint, "")

	if o := readOPCUA(t, cs, "temperature"); o["quality"] != "good" || o["unit"] != "celsius" {
		t.Fatalf("read_temperature: %v", o)
	} else if v, _ := o["value"].(float64); v < 21 || v > 22 {
		t.Fatalf("read_temperature value %v, the server holds 21.5±0.1", o["value"])
	}
	if o := readOPCUA(t, cs, "drifting"); o["quality"] != "degraded" || o["value"] != 19.75 || !strings.Contains(fmt.Sprint(o["reason"]), "UncertainLastUsableValue") {
		t.Fatalf("read_drifting (Uncertain): %v, want degraded naming UncertainLastUsableValue", o)
	}
	if o := readOPCUA(t, cs, "broken"); o["quality"] != "error" || o["value"] != nil || !strings.Contains(fmt.Sprint(o["reason"]), "BadSensorFailure") {
		t.Fatalf("read_broken (Bad): %v, want quality error naming BadSensorFailure", o)
	}

	if a := doModbus(t, cs, "do_setpoint", 42.5, "sp-1"); a.Status != "success" || !a.Verified {
		t.Fatalf("do_setpoint 42.5: %+v, want success verified", a)
	}
	if o := readOPCUA(t, cs, "setpoint_now"); o["quality"] != "good" || o["value"] != 42.5 {
		t.Fatalf("read_setpoint_now after the write: %v", o)
	}
	// 150 is inside the capability's range (0..200) but outside the
	// EURange the server publishes (0..100).
	a := doModbus(t, cs, "do_setpoint", 150.0, "sp-2")
	if a.Status != "failed" || a.Code != "outside_eu_range" || !strings.Contains(a.Reason+a.Details, "0..100") {
		t.Fatalf("do_setpoint 150: %+v, want failed outside_eu_range naming 0..100", a)
	}
	if o := readOPCUA(t, cs, "setpoint_now"); o["value"] != 42.5 {
		t.Fatalf("read_setpoint_now after the refusal: %v, want 42.5 (nothing written)", o)
	}
	a = doModbus(t, cs, "do_locked", 1.0, "lk-1")
	if a.Status != "failed" || a.Code != "BadNotWritable" {
		t.Fatalf("do_locked: %+v, want failed with code BadNotWritable", a)
	}
}

// TestOPCUAServerRestart: the server restarts and comes back with its
// initial values; while it is down no read is labelled good, and the first
// good read after it is the server's new value, never the one written
// before the restart.
func TestOPCUAServerRestart(t *testing.T) {
	t.Parallel() // its own server on a free port and its own daemon
	srv := opcuatest.Start(t, opcuatest.Options{})
	_, cs := startOPCUA(t, srv.Endpoint, "")
	if a := doModbus(t, cs, "do_setpoint", 42.0, "sp-1"); a.Status != "success" {
		t.Fatalf("do_setpoint: %+v", a)
	}
	srv.Stop()
	for i := range 5 {
		o := readOPCUA(t, cs, "setpoint_now")
		if o["quality"] == "good" {
			t.Fatalf("read %d with the server down labelled good: %v", i, o)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if a := doModbus(t, cs, "do_setpoint", 43.0, "sp-down"); a.Status != "failed" {
		t.Fatalf("do_setpoint with the server down: %+v, want failed (nothing sent)", a)
	}
	srv.Restart()
	o := firstGood(t, cs, "setpoint_now", 20*time.Second, func(o map[string]any) {
		if v, ok := o["value"]; ok && v != nil && o["quality"] != "stale" {
			t.Fatalf("a value from before the restart served as %v: %v", o["quality"], o)
		}
	})
	if o["value"] != 20.0 {
		t.Fatalf("first good read after the restart: %v, the server holds 20", o)
	}
	if a := doModbus(t, cs, "do_setpoint", 55.0, "sp-2"); a.Status != "success" || !a.Verified {
		t.Fatalf("do_setpoint after the reconnect: %+v", a)
	}
}

// TestOPCUASignAndEncrypt: a Basic256Sha256 SignAndEncrypt session with
// physd's own application certificate and a user/password identity, the
// server certificate pinned; a daemon that pins another certificate
// refuses the server and never reads from it.
func TestOPCUASignAndEncrypt(t *testing.T) {
	srv := opcuatest.Start(t, opcuatest.Options{Secure: true, User: "operator:s3cret"})
	t.Setenv("PHYSD_E2E_OPCUA_PASSWORD", "s3cret")
	dir := t.TempDir()
	cert, key := writeAppCert(t, dir)
	_, cs := startOPCUA(t, srv.Endpoint, fmt.Sprintf(`, security_policy: Basic256Sha256, security_mode: SignAndEncrypt,
    certificate: %s, private_key: %s, server_certificate: %s, username: operator, password_env: PHYSD_E2E_OPCUA_PASSWORD`,
		cert, key, srv.ServerCertificate()))
	if o := readOPCUA(t, cs, "temperature"); o["quality"] != "good" {
		t.Fatalf("read_temperature over SignAndEncrypt: %v", o)
	}
	if a := doModbus(t, cs, "do_setpoint", 12.5, "sp-1"); a.Status != "success" || !a.Verified {
		t.Fatalf("do_setpoint over SignAndEncrypt: %+v", a)
	}

	// Another server certificate pinned: refused.
	other, _ := writeAppCert(t, t.TempDir())
	_, cs2 := startOPCUA(t, srv.Endpoint, fmt.Sprintf(`, security_policy: Basic256Sha256, server_certificate: %s, username: operator, password_env: PHYSD_E2E_OPCUA_PASSWORD`, other))
	o := readOPCUA(t, cs2, "temperature")
	if o["quality"] != "error" || !strings.Contains(fmt.Sprint(o["reason"]), "is not the pinned server_certificate") {
		t.Fatalf("read_temperature with a wrong pinned certificate: %v, want error naming the pin", o)
	}
	if a := doModbus(t, cs2, "do_setpoint", 13.0, "sp-x"); a.Status != "failed" {
		t.Fatalf("do_setpoint with a wrong pinned certificate: %+v, want failed", a)
	}
}

// writeAppCert writes a self-signed OPC UA application certificate (PEM)
// and its key, as an operator would give physd.
func writeAppCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	uri, err := url.Parse("urn:physd:e2e")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "physd e2e"},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageContentCommitment | x509.KeyUsageKeyEncipherment | x509.KeyUsageDataEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{uri},
		DNSNames:              []string{host},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "physd.pem"), filepath.Join(dir, "physd.key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key))
	return certFile, keyFile
}

func writePEM(t *testing.T, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestOPCUALostWriteReply: the write reaches the server and its reply is
// lost on the way back: the answer is partial with outcome_unknown, never
// success or failed, and a read afterwards (a new session) shows what the
// server holds.
func TestOPCUALostWriteReply(t *testing.T) {
	t.Parallel() // its own server on a free port and its own daemon
	srv := opcuatest.Start(t, opcuatest.Options{})
	px := opcuatest.StartLossProxy(t, srv)
	_, cs := startOPCUA(t, px.Endpoint, "")
	if o := readOPCUA(t, cs, "setpoint_now"); o["value"] != 20.0 {
		t.Fatalf("read_setpoint_now: %v", o)
	}
	px.Arm()
	a := doModbus(t, cs, "do_setpoint", 61.0, "sp-lost")
	if a.Status != "partial" || a.Code != "outcome_unknown" || a.Verified {
		t.Fatalf("do_setpoint with its reply lost: %+v, want partial outcome_unknown, not verified", a)
	}
	if px.Lost() != 1 {
		t.Fatalf("the proxy dropped %d replies", px.Lost())
	}
	if o := firstGood(t, cs, "setpoint_now", 10*time.Second, nil); o["value"] != 61.0 {
		t.Fatalf("read after the lost reply: %v, the server holds 61", o)
	}
}

// TestOPCUAExampleRunScript: examples/opcua/run.sh, given PHYSD, serves the
// node-opcua server and physd on the example and shows a good read, a
// verified write, an EURange refusal and a Bad status. Not parallel: the
// example uses its documented fixed ports (127.0.0.1:8080 and :4840).
func TestOPCUAExampleRunScript(t *testing.T) {
	if _, _, why := opcuatest.Dir(); why != "" {
		t.Skip("OPC UA test server unavailable: " + why)
	}
	for _, addr := range []string{"127.0.0.1:8080", "127.0.0.1:4840"} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("the example's port %s is taken: %v", addr, err)
		}
		l.Close()
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, repoPath("examples/opcua/run.sh"))
	cmd.Env = append(os.Environ(), "PHYSD="+physdBin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run.sh: %v\n%s", err, out)
	}
	for _, want := range []string{
		"'quality': 'good', 'unit': 'celsius'",
		"'status': 'success', 'applied_value': 65",
		"'verified': True",
		"'code': 'outside_eu_range'",
		"BadSensorFailure",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("run.sh output has no %q:\n%s", want, out)
		}
	}
}
