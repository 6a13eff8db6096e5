package mesh

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/physd/physd/mesh/meshtest"
)

func TestConfigValidation(t *testing.T) {
	key := bytes.Repeat([]byte{1}, 16)
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "NodeName is empty"},
		{Config{NodeName: "a", BindAddr: "192.168.1.20"}, "not loopback: a SecretKey"},
		{Config{NodeName: "a", BindAddr: "0.0.0.0", SecretKey: key}, "wildcard: set AdvertiseAddr"},
		{Config{NodeName: "a", BindAddr: "gw.local"}, "not an IP address"},
		{Config{NodeName: "a", SecretKey: []byte("short")}, "SecretKey is 5 bytes"},
		{Config{NodeName: "a", Profile: "wan"}, `Profile "wan"`},
		{Config{NodeName: "a", Seeds: []string{"/x"}}, "empty node name"},
		{Config{NodeName: "a", AdvertiseAddr: "0.0.0.0"}, "must be a specific IP"},
		{Config{NodeName: "a", Label: strings.Repeat("x", 300)}, "Label is 300 bytes"},
	} {
		_, err := tc.cfg.withDefaults()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
	// Valid: wildcard with advertise and key; an injected transport needs no key.
	if _, err := (Config{NodeName: "a", BindAddr: "0.0.0.0", AdvertiseAddr: "192.168.1.20", SecretKey: key}).withDefaults(); err != nil {
		t.Error(err)
	}
	nw := meshtest.NewNetwork(1)
	cfg, err := (Config{NodeName: "a", BindAddr: "10.0.0.1", Transport: nw.NewTransport("a")}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Label != DefaultLabel || cfg.RequestTimeout != DefaultRequestTimeout || cfg.ReconnectInterval != DefaultReconnectInterval || cfg.Profile != ProfileLAN {
		t.Errorf("defaults %+v", cfg)
	}
}

func TestSplitSeed(t *testing.T) {
	for in, want := range map[string][3]any{
		"10.0.0.1:7000":       {"", "10.0.0.1", 7000},
		"10.0.0.1":            {"", "10.0.0.1", 7946},
		"gw_a/10.0.0.1:7000":  {"gw_a", "10.0.0.1", 7000},
		"gw.local":            {"", "gw.local", 7946},
		"[fd00::1]:7000":      {"", "fd00::1", 7000},
		"fd00::1":             {"", "fd00::1", 7946},
		"gw_b/[fd00::1]:7001": {"gw_b", "fd00::1", 7001},
	} {
		n, h, p, err := SplitSeed(in, 7946)
		if err != nil || n != want[0] || h != want[1] || p != want[2] {
			t.Errorf("%s = %q %q %d %v", in, n, h, p, err)
		}
	}
	for _, bad := range []string{"", "/10.0.0.1", "10.0.0.1:0", "10.0.0.1:x", ":7000"} {
		if _, _, _, err := SplitSeed(bad, 7946); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCatalogHash(t *testing.T) {
	a := testCatalog("n1")
	b := testCatalog("n1")
	b.Capabilities[0], b.Capabilities[1] = b.Capabilities[1], b.Capabilities[0]
	b.Capabilities[1].Tags = []string{"air", "temperature", "air"}
	ca, cb := a.Canonical(), b.Canonical()
	if ca.Hash != cb.Hash || len(ca.Hash) != 64 {
		t.Errorf("hash depends on order: %s vs %s", ca.Hash, cb.Hash)
	}
	*b.Capabilities[1].Max = 60
	if b.Canonical().Hash == ca.Hash {
		t.Error("hash ignores the range")
	}
	if *a.Capabilities[0].Max != 50 {
		t.Error("Canonical aliased the caller's range")
	}
	_, enc, err := encodeCatalog(a)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeCatalog(enc)
	if err != nil || got.Hash != ca.Hash {
		t.Fatalf("round trip: %v", err)
	}
	tampered := bytes.Replace(enc, []byte("celsius"), []byte("kelvin!"), 1)
	if _, err := decodeCatalog(tampered); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("tampered catalog: %v", err)
	}
	dup := testCatalog("n1")
	dup.Capabilities = append(dup.Capabilities, dup.Capabilities[0])
	if _, _, err := encodeCatalog(dup); err == nil {
		t.Error("duplicate tool accepted")
	}
	if h, ok := decodeMeta(encodeMeta(ca.Hash)); !ok || h != ca.Hash || len(encodeMeta(ca.Hash)) > 512 {
		t.Error("meta round trip")
	}
}

func TestPartitionStateTable(t *testing.T) {
	for _, tc := range []struct {
		alive, suspect, dead, left, expected int
		want                                 string
	}{
		{5, 0, 0, 0, 5, Healthy},
		{1, 0, 0, 0, 1, Healthy},
		{4, 0, 1, 0, 5, SuspectedPartition},
		{4, 1, 0, 0, 5, SuspectedPartition},
		{3, 0, 2, 0, 5, SuspectedPartition},
		{2, 0, 3, 0, 5, Partitioned},
		{2, 3, 0, 0, 5, Partitioned},
		{4, 0, 0, 1, 5, Healthy},            // a graceful leave is not a partition
		{3, 0, 0, 0, 5, SuspectedPartition}, // two expected nodes never joined
		{2, 0, 0, 0, 3, SuspectedPartition},
		{1, 0, 1, 0, 2, Partitioned},
	} {
		if got := partitionState(tc.alive, tc.suspect, tc.dead, tc.left, tc.expected); got != tc.want {
			t.Errorf("%+v: %s", tc, got)
		}
	}
}

func TestWireRoundTrip(t *testing.T) {
	in := message{typ: msgRequest, id: 1 << 40, from: "n1", addr: "10.0.0.1:7946", text: "do", budget: 499, flags: flagAck | flagCommit, payload: []byte("{}")}
	out, err := decodeMessage(in.encode())
	if err != nil || out.id != in.id || out.from != in.from || out.addr != in.addr || out.text != in.text || out.budget != in.budget || out.flags != in.flags || string(out.payload) != "{}" {
		t.Fatalf("%+v %v", out, err)
	}
	for _, typ := range []byte{msgAck, msgCommit} {
		w := message{typ: typ, id: 9, from: "n2", addr: "10.0.0.2:7946"}
		if out, err := decodeMessage(w.encode()); err != nil || out.typ != typ || out.id != 9 || out.from != "n2" {
			t.Errorf("type %d: %+v %v", typ, out, err)
		}
	}
	v1 := in.encode()
	v1[0] = 1 // a peer on the previous wire version (no flags) is refused, not misread
	for _, bad := range [][]byte{nil, {2}, {2, 1}, {2, 9}, {2, 1, 0x80}, v1, (&message{typ: msgReply, id: 1}).encode()} {
		if _, err := decodeMessage(bad); !errors.Is(err, errBadMessage) {
			t.Errorf("%x accepted", bad)
		}
	}
}

func FuzzDecodeMessage(f *testing.F) {
	f.Add((&message{typ: msgRequest, id: 7, from: "n1", addr: "10.0.0.1:7946", text: "echo", budget: 5, payload: []byte("x")}).encode())
	f.Add((&message{typ: msgReply, id: 7, from: "n2", text: "boom"}).encode())
	f.Add((&message{typ: msgRequest, id: 8, from: "n1", addr: "10.0.0.1:7946", text: "do", budget: 5, flags: flagCommit, payload: []byte("{}")}).encode())
	f.Add((&message{typ: msgCommit, id: 8, from: "n1", addr: "10.0.0.1:7946"}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := decodeMessage(b)
		if err != nil {
			return
		}
		again, err := decodeMessage(w.encode())
		if err != nil || again.id != w.id || again.from != w.from || again.text != w.text || again.flags != w.flags || !bytes.Equal(again.payload, w.payload) {
			t.Fatalf("re-encode mismatch: %+v vs %+v (%v)", w, again, err)
		}
	})
}
