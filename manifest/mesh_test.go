package manifest

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// defaultMesh is network.mesh with every default applied.
func defaultMesh(enabled bool) Mesh {
	return Mesh{
		Enabled: enabled, MaxPeers: 10, HeartbeatIntervalMS: 1000,
		Bind: "127.0.0.1", Port: 7946, Label: "physd", ExpectedSize: 1,
		RequestTimeoutMS: 500, ReconnectIntervalMS: 10000,
	}
}

// meshDoc is a valid manifest whose network.mesh is the given flow
// mapping (line 8, the mapping starts at column 9).
func meshDoc(mesh string) string {
	return strings.Replace(header, "  mesh: {}\n", "  mesh: "+mesh+"\n", 1) + okCap
}

func TestMeshKeys(t *testing.T) {
	m, err := Parse("t.yml", []byte(meshDoc(`{bind: 192.168.1.20, port: 7950, advertise: "10.0.0.5:7000", label: site_north,
    key_file: /etc/physd/mesh.key, seed_peers: ["node_1/192.168.1.20:7950", "192.168.1.21", "gw_b/192.168.1.22:7950", "192.168.1.21:7950"],
    expected_size: 4, request_timeout_ms: 250, reconnect_interval_ms: 30000, heartbeat_interval_ms: 500}`)))
	if err != nil {
		t.Fatal(err)
	}
	got := m.Network.Mesh
	want := Mesh{
		Enabled: true, MaxPeers: 10, HeartbeatIntervalMS: 500,
		SeedPeers: []string{"node_1/192.168.1.20:7950", "192.168.1.21", "gw_b/192.168.1.22:7950", "192.168.1.21:7950"},
		Bind:      "192.168.1.20", Port: 7950, AdvertiseAddr: "10.0.0.5", AdvertisePort: 7000, Label: "site_north",
		KeyFile: "/etc/physd/mesh.key", KeyPos: Pos{File: "t.yml", Line: 9, Col: 15}, KeyField: "network.mesh.key_file",
		ExpectedSize: 4, RequestTimeoutMS: 250, ReconnectIntervalMS: 30000,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mesh =\n %+v\nwant\n %+v", got, want)
	}

	// expected_size default: 1 + distinct seeds that are not this node
	// (node_1 by name, and its own bind:port, are skipped).
	m, err = Parse("t.yml", []byte(meshDoc(`{seed_peers: [node_1/10.1.1.1, "127.0.0.1:7946", "10.1.1.2", "10.1.1.2:7946", "gw_c/[fd00::3]:7946"]}`)))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Network.Mesh.ExpectedSize; got != 3 {
		t.Errorf("derived expected_size = %d, want 3", got)
	}

	// A disabled mesh on a LAN address needs no key.
	if _, err := Parse("t.yml", []byte(meshDoc(`{enabled: false, bind: 192.168.1.20}`))); err != nil {
		t.Errorf("disabled mesh: %v", err)
	}
	// A wildcard bind with advertise and a key is fine.
	if _, err := Parse("t.yml", []byte(meshDoc(`{bind: 0.0.0.0, advertise: 192.168.1.20, key_env: PHYSD_MESH_KEY}`))); err != nil {
		t.Errorf("wildcard with advertise: %v", err)
	}
}

func TestMeshErrors(t *testing.T) {
	for _, tc := range []struct{ mesh, want string }{
		{`{bind: 192.168.1.20}`,
			`t.yml:8:16: network.mesh.bind: bind 192.168.1.20 is reachable from the network, so the mesh must be encrypted: no key_file or key_env; fix: ` + fixMeshKey},
		{`{bind: 0.0.0.0, key_file: /k}`,
			`t.yml:8:16: network.mesh.bind: bind 0.0.0.0 listens on every interface and needs advertise; fix: bind one address of this host, or add advertise: <the address peers dial>`},
		{`{bind: gateway.local}`,
			`t.yml:8:16: network.mesh.bind: bind "gateway.local" is not an IP address; fix: write an IP address of this host, e.g. 192.168.1.20 or 127.0.0.1 (host names are not accepted)`},
		{`{advertise: "0.0.0.0"}`,
			`t.yml:8:21: network.mesh.advertise: advertise "0.0.0.0" is a wildcard address; fix: write the specific address peers dial, e.g. 192.168.1.20`},
		{`{advertise: "10.0.0.1:99999"}`,
			`t.yml:8:21: network.mesh.advertise: invalid advertise "10.0.0.1:99999": invalid port "99999"; fix: write ip or ip:port, e.g. 192.168.1.20 or 192.168.1.20:7946`},
		{`{key_file: /k, key_env: K}`,
			`t.yml:8:24: network.mesh.key_env: key_file and key_env are both set; fix: keep either key_file or key_env`},
		{`{key_env: "bad name"}`,
			`t.yml:8:19: network.mesh.key_env: invalid key_env "bad name"; fix: name an environment variable, e.g. PHYSD_MESH_KEY`},
		{`{label: ""}`,
			`t.yml:8:17: network.mesh.label: label must not be empty; fix: remove label to use "physd", or name the site, e.g. site_north`},
		{`{seed_peers: ["/10.0.0.1", "10.0.0.2:0"]}`,
			`t.yml:8:23: network.mesh.seed_peers[0]: invalid seed "/10.0.0.1": empty device id before /; fix: write host:port, host, or device_id/host:port, e.g. gw_boiler_001/192.168.1.21:7946`},
		{`{port: 0}`,
			`t.yml:8:16: network.mesh.port: port 0 is out of range; fix: use a value from 1 to 65535`},
		{`{expected_size: 0}`,
			`t.yml:8:25: network.mesh.expected_size: expected_size 0 is out of range; fix: use a value of at least 1`},
		{`{request_timeout_ms: 600000}`,
			`t.yml:8:30: network.mesh.request_timeout_ms: request_timeout_ms 600000 is out of range; fix: use a value from 1 to 60000`},
		{`{reconnect_interval_ms: 10}`,
			`t.yml:8:33: network.mesh.reconnect_interval_ms: reconnect_interval_ms 10 is out of range; fix: use a value from 100 to 86400000`},
		{`{bind_addr: 127.0.0.1}`,
			`t.yml:8:10: network.mesh.bind_addr: unknown key "bind_addr"; fix: did you mean "bind"? valid keys: ` + strings.Join(meshKeys, ", ")},
	} {
		_, err := Parse("t.yml", []byte(meshDoc(tc.mesh)))
		if err == nil {
			t.Errorf("%s: no error", tc.mesh)
			continue
		}
		if first := strings.Split(err.Error(), "\n")[0]; first != tc.want {
			t.Errorf("%s:\n got: %s\nwant: %s", tc.mesh, err, tc.want)
		}
	}
}

func TestDecodeKey(t *testing.T) {
	key := bytes.Repeat([]byte{0xab, 0x01}, 16)
	for _, text := range []string{
		hex.EncodeToString(key), strings.ToUpper(hex.EncodeToString(key)) + "\n",
		base64.StdEncoding.EncodeToString(key), base64.RawURLEncoding.EncodeToString(key),
	} {
		got, err := DecodeKey(text)
		if err != nil || !bytes.Equal(got, key) {
			t.Errorf("%q: %x %v", text, got, err)
		}
	}
	for _, n := range []int{16, 24} {
		if got, err := DecodeKey(base64.StdEncoding.EncodeToString(key[:n])); err != nil || len(got) != n {
			t.Errorf("%d-byte key: %v", n, err)
		}
	}
	for text, want := range map[string]string{
		"":           "empty",
		"not a key!": "neither hex nor base64",
		base64.StdEncoding.EncodeToString(key[:20]): "20 bytes",
	} {
		if _, err := DecodeKey(text); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", text, err, want)
		}
	}
}

func TestLoadKey(t *testing.T) {
	dir := t.TempDir()
	key := bytes.Repeat([]byte{7}, 32)
	path := filepath.Join(dir, "mesh.key")
	if err := os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := Parse("t.yml", []byte(meshDoc(`{key_file: "`+path+`"}`)))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := m.Network.Mesh.LoadKey(); err != nil || !bytes.Equal(got, key) {
		t.Fatalf("LoadKey = %x, %v", got, err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = m.Network.Mesh.LoadKey()
	var e *Error
	if !errors.As(err, &e) || !strings.HasPrefix(err.Error(), "t.yml:8:20: network.mesh.key_file: the key file ") || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable: %v", err)
	}

	t.Setenv("PHYSD_TEST_MESH_KEY", hex.EncodeToString(key[:16]))
	m, err = Parse("t.yml", []byte(meshDoc(`{key_env: PHYSD_TEST_MESH_KEY}`)))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := m.Network.Mesh.LoadKey(); err != nil || !bytes.Equal(got, key[:16]) {
		t.Errorf("env key = %x, %v", got, err)
	}
	t.Setenv("PHYSD_TEST_MESH_KEY", "c2hvcnQ=")
	if _, err := m.Network.Mesh.LoadKey(); err == nil || !strings.Contains(err.Error(), "t.yml:8:19: network.mesh.key_env: environment variable PHYSD_TEST_MESH_KEY: the key is 5 bytes") {
		t.Errorf("short env key: %v", err)
	}
	m, _ = Parse("t.yml", []byte(meshDoc(`{key_env: PHYSD_TEST_UNSET_KEY_XYZ}`)))
	if _, err := m.Network.Mesh.LoadKey(); err == nil || !strings.Contains(err.Error(), "is not set") {
		t.Errorf("unset env: %v", err)
	}
	m, _ = Parse("t.yml", []byte(meshDoc(`{}`)))
	if k, err := m.Network.Mesh.LoadKey(); k != nil || err != nil {
		t.Errorf("no key configured: %x %v", k, err)
	}
}

func TestMDNSKeys(t *testing.T) {
	// Without the block mDNS is off (the zero value).
	m, err := Parse("t.yml", []byte(meshDoc(`{}`)))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Network.Mesh.MDNS; !reflect.DeepEqual(got, MDNS{}) || m.Network.Mesh.MDNSDiscovery() {
		t.Errorf("no mdns block: %+v, discovery %v; want off", got, m.Network.Mesh.MDNSDiscovery())
	}
	// An empty block turns it on with loopback as the interface.
	m, err = Parse("t.yml", []byte(meshDoc(`{mdns: {}}`)))
	if err != nil {
		t.Fatal(err)
	}
	want := MDNS{Enabled: true, Interface: "lo", Advertise: true, Discover: true, BrowseIntervalMS: 15000,
		Pos: Pos{File: "t.yml", Line: 8, Col: 16}, Field: "network.mesh.mdns.interface"}
	if got := m.Network.Mesh.MDNS; !reflect.DeepEqual(got, want) || !m.Network.Mesh.MDNSDiscovery() {
		t.Errorf("mdns: {} =\n %+v\nwant\n %+v (discovery %v)", got, want, m.Network.Mesh.MDNSDiscovery())
	}
	m, err = Parse("t.yml", []byte(meshDoc(`{mdns: {interface: eth0, advertise: false, browse_interval_ms: 2000}}`)))
	if err != nil {
		t.Fatal(err)
	}
	want = MDNS{Enabled: true, Interface: "eth0", Advertise: false, Discover: true, BrowseIntervalMS: 2000,
		Pos: Pos{File: "t.yml", Line: 8, Col: 28}, Field: "network.mesh.mdns.interface"}
	if got := m.Network.Mesh.MDNS; !reflect.DeepEqual(got, want) {
		t.Errorf("mdns =\n %+v\nwant\n %+v", got, want)
	}
}

// TestMDNSDiscoveryDecision: discovery runs only with the mesh on, mDNS
// on, discover not off, and no seed_peers.
func TestMDNSDiscoveryDecision(t *testing.T) {
	for mesh, want := range map[string]bool{
		`{mdns: {}}`:                                    true,
		`{mdns: {interface: eth0}}`:                     true,
		`{mdns: {enabled: false}}`:                      false,
		`{mdns: {discover: false}}`:                     false,
		`{enabled: false, mdns: {}}`:                    false,
		`{seed_peers: [10.0.0.2], mdns: {}}`:            false,
		`{seed_peers: [gw_x/127.0.0.1:7946], mdns: {}}`: false,
		`{}`: false,
	} {
		m, err := Parse("t.yml", []byte(meshDoc(mesh)))
		if err != nil {
			t.Fatalf("%s: %v", mesh, err)
		}
		if got := m.Network.Mesh.MDNSDiscovery(); got != want {
			t.Errorf("%s: discovery = %v, want %v", mesh, got, want)
		}
	}
}

func TestMDNSErrors(t *testing.T) {
	for _, tc := range []struct{ mesh, want string }{
		{`{mdns: {interface: "eth0 wlan0"}}`,
			`t.yml:8:28: network.mesh.mdns.interface: interface "eth0 wlan0" is not an interface name; fix: name a network interface of this host, e.g. eth0, end0 or wlan0 (ip -br link lists them); lo keeps mDNS on this host`},
		{`{mdns: {browse_interval_ms: 10}}`,
			`t.yml:8:37: network.mesh.mdns.browse_interval_ms: browse_interval_ms 10 is out of range; fix: use a value from 1000 to 300000`},
		{`{mdns: {interfase: eth0}}`,
			`t.yml:8:17: network.mesh.mdns.interfase: unknown key "interfase"; fix: did you mean "interface"? valid keys: ` + strings.Join(mdnsKeys, ", ")},
		{`{mdns: true}`,
			`t.yml:8:16: network.mesh.mdns: expected a mapping, got the boolean true; fix: write key: value pairs, indented under the key`},
	} {
		_, err := Parse("t.yml", []byte(meshDoc(tc.mesh)))
		if err == nil {
			t.Errorf("%s: no error", tc.mesh)
			continue
		}
		if first := strings.Split(err.Error(), "\n")[0]; !strings.HasPrefix(first, tc.want) {
			t.Errorf("%s:\n got: %s\nwant: %s", tc.mesh, err, tc.want)
		}
	}
}
