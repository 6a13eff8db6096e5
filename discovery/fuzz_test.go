package discovery

import (
	"net"
	"testing"

	"github.com/hashicorp/mdns"
	"github.com/miekg/dns"
)

// FuzzAnswer: any packet a host on the link sends to the browser or the
// advertiser (answers and queries alike) is handled without a panic; a
// gateway parsed from it has an id and, with a mesh port, a mesh address.
//
//	go test ./discovery -run '^$' -fuzz FuzzAnswer -fuzztime 60s
func FuzzAnswer(f *testing.F) {
	zone, err := mdns.NewMDNSService("gw_a", Service, "local.", "gw_a.local.", 8080, []net.IP{net.IPv4(10, 0, 0, 1)},
		Record{DeviceID: "gw_a", PhysMCPVersion: "0.1", MCPPort: 8080, MCPPath: "/mcp", MeshPort: 7946, MeshLabel: "site"}.TXT())
	if err != nil {
		f.Fatal(err)
	}
	resp := &dns.Msg{MsgHdr: dns.MsgHdr{Response: true}, Compress: true,
		Answer: zone.Records(dns.Question{Name: Service + ".local.", Qtype: dns.TypePTR, Qclass: dns.ClassINET})}
	b, err := resp.Pack()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	q := new(dns.Msg)
	q.SetQuestion(Service+".local.", dns.TypePTR)
	b, _ = q.Pack()
	f.Add(b)
	f.Fuzz(func(t *testing.T, pkt []byte) {
		var m dns.Msg
		if m.Unpack(pkt) != nil {
			return
		}
		gws, _ := parseAnswer(&m, &net.UDPAddr{IP: net.IPv4(10, 0, 0, 9), Port: Port})
		for _, g := range gws {
			if g.DeviceID == "" {
				t.Fatalf("gateway without id from %x", pkt)
			}
			if g.MeshPort != 0 && g.MeshAddr() == "" {
				t.Fatalf("gateway with a mesh port and no address from %x", pkt)
			}
		}
		for _, question := range m.Question {
			_ = zone.Records(question) // the advertiser's path for a query
		}
	})
}
