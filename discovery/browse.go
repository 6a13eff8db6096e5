package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/ipv4"
)

// Gateway is a gateway found by Browse.
type Gateway struct {
	Record
	// Addr is the gateway's address: its A record, else the address the
	// answer came from.
	Addr net.IP `json:"addr"`
	// Port is the SRV port.
	Port int `json:"port"`
}

// MeshAddr is "ip:mesh_port", or "" when the gateway runs no mesh.
func (g Gateway) MeshAddr() string {
	if g.MeshPort == 0 || g.Addr == nil {
		return ""
	}
	return hostPort(g.Addr, g.MeshPort)
}

// Browse sends a one-shot query for _physmcp._tcp out of ifi (again
// after a third of wait, for a lost packet) and collects the answers that
// arrive on ifi until wait has passed or ctx ends. It joins no multicast
// group: answers come back by unicast. Answers that do not parse are
// skipped (reported in the error when nothing else was found).
func Browse(ctx context.Context, ifi *net.Interface, wait time.Duration) ([]Gateway, error) {
	conn, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		return nil, fmt.Errorf("mdns: browse: %w", err)
	}
	defer conn.Close()
	pc := ipv4.NewPacketConn(conn)
	if err := pc.SetControlMessage(ipv4.FlagInterface, true); err != nil {
		return nil, fmt.Errorf("mdns: browse on %s: %w", ifi.Name, err)
	}
	if err := pc.SetMulticastInterface(ifi); err != nil {
		return nil, fmt.Errorf("mdns: browse on %s: %w", ifi.Name, err)
	}
	_ = pc.SetMulticastTTL(255)
	_ = pc.SetMulticastLoopback(true) // gateways on this host answer too

	q := new(dns.Msg)
	q.SetQuestion(Service+".local.", dns.TypePTR)
	q.RecursionDesired = false
	query, err := q.Pack()
	if err != nil {
		return nil, err
	}
	send := func() error {
		_, err := pc.WriteTo(query, &ipv4.ControlMessage{IfIndex: ifi.Index}, groupAddr)
		return err
	}
	if err := send(); err != nil {
		return nil, fmt.Errorf("mdns: query on %s: %w", ifi.Name, err)
	}
	deadline := time.Now().Add(wait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Now()) })
	defer stop()
	resend := time.Now().Add(wait / 3)
	found := map[string]Gateway{}
	var bad []string
	buf := make([]byte, 9000)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		next := deadline
		if !resend.IsZero() && resend.Before(next) {
			next = resend
		}
		_ = conn.SetReadDeadline(next)
		n, cm, src, err := pc.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if !resend.IsZero() && !time.Now().Before(resend) {
					resend = time.Time{}
					_ = send()
				}
				continue
			}
			return nil, fmt.Errorf("mdns: browse on %s: %w", ifi.Name, err)
		}
		if cm == nil || cm.IfIndex != ifi.Index {
			continue
		}
		var m dns.Msg
		if m.Unpack(buf[:n]) != nil || !m.Response {
			continue
		}
		from, _ := src.(*net.UDPAddr)
		gws, errs := parseAnswer(&m, from)
		bad = append(bad, errs...)
		for _, g := range gws {
			found[g.DeviceID] = g
		}
	}
	out := make([]Gateway, 0, len(found))
	for _, g := range found {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].DeviceID < out[j].DeviceID })
	if len(out) == 0 && len(bad) > 0 {
		return nil, fmt.Errorf("mdns: unusable answers: %s", strings.Join(bad, "; "))
	}
	return out, nil
}

// parseAnswer assembles the gateways one response describes: each
// _physmcp._tcp instance with a TXT record, its SRV port, and the A
// record of the SRV target (else the source address). A TTL of 0 is a
// goodbye: that instance is not returned.
func parseAnswer(m *dns.Msg, from *net.UDPAddr) ([]Gateway, []string) {
	suffix := "." + Service + ".local."
	type inst struct {
		txt     []string
		hasTXT  bool
		target  string
		port    int
		goodbye bool
	}
	insts := map[string]*inst{}
	get := func(name string) *inst {
		name = strings.ToLower(name)
		if insts[name] == nil {
			insts[name] = &inst{}
		}
		return insts[name]
	}
	hosts := map[string]net.IP{}
	for _, rr := range append(append([]dns.RR{}, m.Answer...), m.Extra...) {
		h := rr.Header()
		switch r := rr.(type) {
		case *dns.PTR:
			if strings.EqualFold(h.Name, Service+".local.") && strings.HasSuffix(strings.ToLower(r.Ptr), suffix) {
				i := get(r.Ptr)
				i.goodbye = i.goodbye || h.Ttl == 0
			}
		case *dns.SRV:
			if strings.HasSuffix(strings.ToLower(h.Name), suffix) {
				i := get(h.Name)
				i.target, i.port = strings.ToLower(r.Target), int(r.Port)
			}
		case *dns.TXT:
			if strings.HasSuffix(strings.ToLower(h.Name), suffix) {
				i := get(h.Name)
				i.txt, i.hasTXT = r.Txt, true
				i.goodbye = i.goodbye || h.Ttl == 0
			}
		case *dns.A:
			if _, ok := hosts[strings.ToLower(h.Name)]; !ok {
				hosts[strings.ToLower(h.Name)] = r.A.To4()
			}
		}
	}
	var out []Gateway
	var bad []string
	for name, i := range insts {
		if !i.hasTXT || i.goodbye {
			continue
		}
		rec, err := ParseTXT(i.txt)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s: %v", strings.TrimSuffix(name, "."), err))
			continue
		}
		g := Gateway{Record: rec, Port: i.port, Addr: hosts[i.target]}
		if g.Addr == nil && from != nil {
			g.Addr = from.IP.To4()
		}
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].DeviceID < out[j].DeviceID })
	return out, bad
}
