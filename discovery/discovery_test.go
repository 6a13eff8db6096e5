package discovery

import (
	"context"
	"errors"
	"net"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/miekg/dns"
)

func TestTXTRoundTrip(t *testing.T) {
	r := Record{DeviceID: "gw_zone_a", PhysMCPVersion: "0.1", MCPPort: 8443, MCPPath: "/mcp", MCPHost: "127.0.0.1", TLS: true,
		MeshPort: 7946, MeshLabel: "greenhouse_site", Zone: "zone_a"}
	want := []string{"txtvers=1", "id=gw_zone_a", "physmcp_version=0.1", "mcp_port=8443", "mcp_path=/mcp", "tls=true",
		"mcp_host=127.0.0.1", "mesh_port=7946", "mesh_label=greenhouse_site", "zone=zone_a"}
	if got := r.TXT(); !slices.Equal(got, want) {
		t.Fatalf("TXT() =\n %q\nwant\n %q", got, want)
	}
	back, err := ParseTXT(r.TXT())
	if err != nil || back != r {
		t.Fatalf("ParseTXT(TXT()) = %+v, %v; want %+v", back, err, r)
	}
	// No HTTP and no mesh: neither port nor their keys.
	bare := Record{DeviceID: "gw_b", PhysMCPVersion: "0.1"}
	if got := bare.TXT(); !slices.Equal(got, []string{"txtvers=1", "id=gw_b", "physmcp_version=0.1"}) {
		t.Errorf("bare TXT() = %q", got)
	}
	// Keys are case-insensitive, unknown keys and empty strings ignored, a
	// bare tls key is true (RFC 6763 §6.4).
	got, err := ParseTXT([]string{"ID=gw_c", "", "future_key=1", "tls", "MESH_PORT=7000"})
	if err != nil || got != (Record{DeviceID: "gw_c", TLS: true, MeshPort: 7000}) {
		t.Errorf("lenient parse = %+v, %v", got, err)
	}
}

func TestParseTXTErrors(t *testing.T) {
	for _, tc := range []struct {
		txt  []string
		want string
	}{
		{[]string{"txtvers=1", "mesh_port=7946"}, "TXT has no id"},
		{[]string{"id=a", "mesh_port=0"}, `TXT mesh_port="0" is not a port (1..65535)`},
		{[]string{"id=a", "mesh_port=70000"}, `TXT mesh_port="70000" is not a port`},
		{[]string{"id=a", "mcp_port=http"}, `TXT mcp_port="http" is not a port`},
		{[]string{"id=a", "tls=maybe"}, `TXT tls="maybe" is not true or false`},
		{[]string{"txtvers=2", "id=a"}, "TXT txtvers=2: this physd reads version 1"},
		{[]string{"id=a", "ID=b"}, "TXT key id given twice"},
	} {
		_, err := ParseTXT(tc.txt)
		if err == nil || err.Error() != tc.want && !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("ParseTXT(%q) = %v, want %q", tc.txt, err, tc.want)
		}
	}
	if err := (Record{DeviceID: "a", MeshLabel: strings.Repeat("x", 250)}).Validate(); err != nil {
		t.Errorf("a label without a mesh port is not advertised, so it cannot be too long: %v", err)
	}
	if err := (Record{DeviceID: "a", MeshPort: 1, MeshLabel: strings.Repeat("x", 250)}).Validate(); err == nil || !strings.Contains(err.Error(), "TXT mesh_label is 261 bytes") {
		t.Errorf("Validate of a 261-byte TXT string: %v", err)
	}
}

func gw(id, ip string, meshPort int, label string) Gateway {
	return Gateway{Record: Record{DeviceID: id, MeshPort: meshPort, MeshLabel: label}, Addr: net.ParseIP(ip).To4()}
}

func TestJoinTargets(t *testing.T) {
	self := Self{ID: "gw_a", MeshAddr: "10.0.0.1:7946", Label: "site"}
	found := []Gateway{
		gw("gw_c", "10.0.0.3", 7946, "site"),
		gw("gw_a", "10.0.0.1", 7946, "site"), // itself by id
		gw("gw_x", "10.0.0.1", 7946, "site"), // itself by address (a stale id)
		gw("gw_b", "10.0.0.2", 7946, "site"),
		gw("gw_b", "10.0.0.9", 7946, "site"),  // the same id twice: first kept
		gw("gw_d", "10.0.0.2", 7946, "site"),  // gw_b's address again
		gw("gw_e", "10.0.0.5", 0, "site"),     // no mesh
		gw("gw_f", "10.0.0.6", 7946, "other"), // another site
		gw("gw_g", "10.0.0.7", 7946, ""),      // no label advertised: tried
		gw("gw_h", "10.0.0.8", 7946, "site"),  // already a member
	}
	got := JoinTargets(found, self, map[string]bool{"gw_a": true, "gw_h": true})
	want := []string{"gw_b/10.0.0.2:7946", "gw_c/10.0.0.3:7946", "gw_g/10.0.0.7:7946"}
	if !slices.Equal(got, want) {
		t.Errorf("JoinTargets =\n %q\nwant\n %q", got, want)
	}
	// Off the link: not joined.
	self.Link = []*net.IPNet{{IP: net.IPv4(10, 0, 0, 0).To4(), Mask: net.CIDRMask(30, 32)}} // 10.0.0.0-3
	got = JoinTargets(found, self, map[string]bool{"gw_a": true, "gw_h": true})
	if want := []string{"gw_b/10.0.0.2:7946", "gw_c/10.0.0.3:7946"}; !slices.Equal(got, want) {
		t.Errorf("JoinTargets on 10.0.0.0/30 =\n %q\nwant\n %q", got, want)
	}
	if got := JoinTargets(nil, self, nil); got != nil {
		t.Errorf("nothing found: %q", got)
	}
}

// fakeMesh records joins; joined targets become live.
type fakeMesh struct {
	mu    sync.Mutex
	live  map[string]bool
	joins [][]string
}

func (f *fakeMesh) Live() map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]bool{}
	for k, v := range f.live {
		out[k] = v
	}
	return out
}

func (f *fakeMesh) Join(targets []string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.joins = append(f.joins, targets)
	for _, t := range targets {
		id, _, _ := strings.Cut(t, "/")
		f.live[id] = true
	}
	return len(targets)
}

// TestDiscovererLoop: it browses at once and every Interval; a gateway
// that appears later is joined at the next browse; members are not
// joined again; a failed browse is retried; Run ends with its ctx.
func TestDiscovererLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &fakeMesh{live: map[string]bool{"gw_a": true}}
		var mu sync.Mutex
		var browses []time.Duration
		start := time.Now()
		answers := map[int][]Gateway{
			0: {gw("gw_b", "10.0.0.2", 7946, "site")},
			1: nil, // browse error below
			2: {gw("gw_b", "10.0.0.2", 7946, "site"), gw("gw_c", "10.0.0.3", 7946, "site")},
		}
		d := &Discoverer{
			Self: Self{ID: "gw_a", MeshAddr: "10.0.0.1:7946", Label: "site"}, Mesh: m, Interval: 10 * time.Second,
			Browse: func(ctx context.Context) ([]Gateway, error) {
				mu.Lock()
				i := len(browses)
				browses = append(browses, time.Since(start))
				mu.Unlock()
				time.Sleep(time.Second) // the browse's own wait
				if i == 1 {
					return nil, errors.New("network is unreachable")
				}
				if a, ok := answers[i]; ok {
					return a, nil
				}
				return answers[2], nil
			},
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { d.Run(ctx); close(done) }()
		time.Sleep(35 * time.Second)
		cancel()
		<-done

		wantBrowses := []time.Duration{0, 10 * time.Second, 20 * time.Second, 30 * time.Second}
		if !reflect.DeepEqual(browses, wantBrowses) {
			t.Errorf("browsed at %v, want %v", browses, wantBrowses)
		}
		wantJoins := [][]string{{"gw_b/10.0.0.2:7946"}, {"gw_c/10.0.0.3:7946"}}
		if !reflect.DeepEqual(m.joins, wantJoins) {
			t.Errorf("joins = %q, want %q", m.joins, wantJoins)
		}
		f := d.Found()
		if len(f) != 2 || f[0].DeviceID != "gw_b" || f[1].DeviceID != "gw_c" ||
			f[0].JoinTried != start.Add(time.Second) || f[1].JoinTried != start.Add(21*time.Second) || f[1].LastSeen != start.Add(31*time.Second) {
			t.Errorf("Found() = %+v", f)
		}
	})
}

// TestParseAnswer: a response with PTR, SRV, TXT and A records gives the
// gateway at its A address; without A the source address is used; a
// goodbye (TTL 0) and an instance of another service are not gateways.
func TestParseAnswer(t *testing.T) {
	hdr := func(name string, typ uint16, ttl uint32) dns.RR_Header {
		return dns.RR_Header{Name: name, Rrtype: typ, Class: dns.ClassINET, Ttl: ttl}
	}
	inst := "gw_b._physmcp._tcp.local."
	m := &dns.Msg{Answer: []dns.RR{
		&dns.PTR{Hdr: hdr("_physmcp._tcp.local.", dns.TypePTR, 120), Ptr: inst},
		&dns.SRV{Hdr: hdr(inst, dns.TypeSRV, 120), Port: 8080, Target: "gw_b.local."},
		&dns.TXT{Hdr: hdr(inst, dns.TypeTXT, 120), Txt: Record{DeviceID: "gw_b", MeshPort: 7946}.TXT()},
		&dns.A{Hdr: hdr("gw_b.local.", dns.TypeA, 120), A: net.IPv4(10, 0, 0, 2)},
		&dns.TXT{Hdr: hdr("printer._ipp._tcp.local.", dns.TypeTXT, 120), Txt: []string{"id=printer"}},
	}}
	gws, bad := parseAnswer(m, &net.UDPAddr{IP: net.IPv4(10, 0, 0, 99), Port: 5353})
	if len(bad) != 0 || len(gws) != 1 || gws[0].MeshAddr() != "10.0.0.2:7946" || gws[0].Port != 8080 || gws[0].DeviceID != "gw_b" {
		t.Fatalf("parseAnswer = %+v, %q", gws, bad)
	}
	m.Answer = m.Answer[:3] // no A record
	gws, _ = parseAnswer(m, &net.UDPAddr{IP: net.IPv4(10, 0, 0, 99), Port: 5353})
	if len(gws) != 1 || gws[0].MeshAddr() != "10.0.0.99:7946" {
		t.Errorf("without A: %+v", gws)
	}
	m.Answer[2].Header().Ttl = 0 // goodbye
	if gws, _ = parseAnswer(m, nil); len(gws) != 0 {
		t.Errorf("goodbye parsed as a gateway: %+v", gws)
	}
	m.Answer[2] = &dns.TXT{Hdr: hdr(inst, dns.TypeTXT, 120), Txt: []string{"mesh_port=1"}}
	if gws, bad = parseAnswer(m, nil); len(gws) != 0 || len(bad) != 1 || !strings.Contains(bad[0], "TXT has no id") {
		t.Errorf("a TXT without id: %+v %q", gws, bad)
	}
}

// TestDiscovererHealing: while Healing reports true the browse interval
// drops to 5 s, and returns to Interval after.
func TestDiscovererHealing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		healing := false
		var browses []time.Duration
		start := time.Now()
		d := &Discoverer{
			Self: Self{ID: "gw_a"}, Mesh: &fakeMesh{live: map[string]bool{}}, Interval: 30 * time.Second,
			Healing: func() bool { mu.Lock(); defer mu.Unlock(); return healing },
			Browse: func(ctx context.Context) ([]Gateway, error) {
				mu.Lock()
				browses = append(browses, time.Since(start))
				mu.Unlock()
				time.Sleep(time.Second)
				return nil, nil
			},
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { d.Run(ctx); close(done) }()
		// Each round ends 1 s after it starts and then reads Healing:
		// switch it half a second away from those instants.
		time.Sleep(30*time.Second + 500*time.Millisecond) // browses at 0 and 30
		mu.Lock()
		healing = true
		mu.Unlock()
		time.Sleep(12 * time.Second) // 35, 40; decided at 41 while healing
		mu.Lock()
		healing = false
		mu.Unlock()
		time.Sleep(37 * time.Second) // 45, then 75
		cancel()
		<-done
		want := []time.Duration{0, 30 * time.Second, 35 * time.Second, 40 * time.Second, 45 * time.Second, 75 * time.Second}
		if !reflect.DeepEqual(browses, want) {
			t.Errorf("browsed at %v, want %v", browses, want)
		}
	})
}

// TestDiscovererForgets: a gateway that stops answering stays listed for
// ForgetAfter (at least), then is dropped from Found.
func TestDiscovererForgets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		answer := []Gateway{gw("gw_b", "10.0.0.2", 7946, "site")}
		d := &Discoverer{
			Self: Self{ID: "gw_a"}, Mesh: &fakeMesh{live: map[string]bool{}}, Interval: 10 * time.Second,
			Browse: func(ctx context.Context) ([]Gateway, error) {
				mu.Lock()
				defer mu.Unlock()
				return answer, nil
			},
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { d.Run(ctx); close(done) }()
		time.Sleep(5 * time.Second) // seen at 0
		mu.Lock()
		answer = nil
		mu.Unlock()
		time.Sleep(ForgetAfter) // 5 min 5 s: the round at 5 min still lists it (exactly ForgetAfter)
		if f := d.Found(); len(f) != 1 {
			t.Errorf("after %v without an answer Found() = %+v, want gw_b still listed", ForgetAfter, f)
		}
		time.Sleep(10 * time.Second) // the round at 5 min 10 s forgets it
		if f := d.Found(); len(f) != 0 {
			t.Errorf("after %v without an answer Found() = %+v, want it forgotten", ForgetAfter+10*time.Second, f)
		}
		cancel()
		<-done
	})
}
