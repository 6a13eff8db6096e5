package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/mdns"
	"github.com/miekg/dns"
	"golang.org/x/net/ipv4"
)

// mDNS's group and port (RFC 6762).
var (
	group     = net.IPv4(224, 0, 0, 251)
	groupAddr = &net.UDPAddr{IP: group, Port: Port}
)

// Port is the mDNS port.
const Port = 5353

// AdvertiseConfig is what Advertise needs.
type AdvertiseConfig struct {
	Interface *net.Interface
	// IPs are the addresses of the A records: where the gateway's mesh
	// (and MCP) can be reached on Interface.
	IPs    []net.IP
	Record Record
	// Port is the SRV port: the MCP port, else the mesh port.
	Port   int
	Logger *slog.Logger
}

// Advertiser answers mDNS queries for one gateway on one interface.
type Advertiser struct {
	ifi  *net.Interface
	zone *mdns.MDNSService
	conn net.PacketConn
	pc   *ipv4.PacketConn
	log  *slog.Logger

	closed  atomic.Bool
	stop    chan struct{}
	wg      sync.WaitGroup
	answers atomic.Int64
	// lastMulticast is when the records were last multicast (unix ns):
	// RFC 6762 §6 allows it once a second, so a flood of queries cannot
	// make the gateway flood the link.
	lastMulticast atomic.Int64
}

// multicastGap is RFC 6762 §6's least time between two multicasts of a
// record.
const multicastGap = time.Second

// Advertise joins the mDNS group on cfg.Interface only, answers queries
// for _physmcp._tcp that arrive on it, and announces the gateway twice
// (RFC 6762 §8.3). Close sends the goodbye.
func Advertise(cfg AdvertiseConfig) (*Advertiser, error) {
	if cfg.Interface == nil {
		return nil, errors.New("mdns: no interface")
	}
	if err := cfg.Record.Validate(); err != nil {
		return nil, fmt.Errorf("mdns: %w", err)
	}
	if len(cfg.Record.DeviceID) > 63 {
		return nil, fmt.Errorf("mdns: device id %q is longer than a DNS label (63)", cfg.Record.DeviceID)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	// The host name is the device id: unique per gateway even where
	// several share one OS host name (containers, namespaces).
	zone, err := mdns.NewMDNSService(cfg.Record.DeviceID, Service, "local.", cfg.Record.DeviceID+".local.", cfg.Port, cfg.IPs, cfg.Record.TXT())
	if err != nil {
		return nil, fmt.Errorf("mdns: %w", err)
	}
	lc := net.ListenConfig{Control: reuse}
	conn, err := lc.ListenPacket(context.Background(), "udp4", fmt.Sprintf("0.0.0.0:%d", Port))
	if err != nil {
		return nil, fmt.Errorf("mdns: listen on UDP %d: %w (a program that holds the port without SO_REUSEADDR keeps physd out; avahi shares it)", Port, err)
	}
	pc := ipv4.NewPacketConn(conn)
	fail := func(what string, err error) (*Advertiser, error) {
		conn.Close()
		return nil, fmt.Errorf("mdns: %s on %s: %w", what, cfg.Interface.Name, err)
	}
	if err := pc.JoinGroup(cfg.Interface, &net.UDPAddr{IP: group}); err != nil {
		return fail("join 224.0.0.251", err)
	}
	if err := pc.SetControlMessage(ipv4.FlagInterface, true); err != nil {
		return fail("read arrival interfaces", err)
	}
	if err := pc.SetMulticastInterface(cfg.Interface); err != nil {
		return fail("set the multicast interface", err)
	}
	_ = pc.SetMulticastTTL(255) // RFC 6762 §11
	// Loopback on: other physd on this host (and on lo, the only way)
	// hear the announcements and answers.
	_ = pc.SetMulticastLoopback(true)
	a := &Advertiser{ifi: cfg.Interface, zone: zone, conn: conn, pc: pc, stop: make(chan struct{}),
		log: cfg.Logger.With("component", "mdns", "interface", cfg.Interface.Name)}
	a.wg.Add(2)
	go a.serve()
	go a.announce()
	a.log.Info("mdns: advertising", "instance", cfg.Record.DeviceID+"."+Service+".local", "port", cfg.Port, "ips", cfg.IPs, "txt", cfg.Record.TXT())
	return a, nil
}

// Answers is how many queries were answered.
func (a *Advertiser) Answers() int64 { return a.answers.Load() }

// Close sends the goodbye (every record with TTL 0) and stops answering.
func (a *Advertiser) Close() error {
	if a.closed.Swap(true) {
		return nil
	}
	close(a.stop)
	gerr := a.send(a.records(0), groupAddr, 0)
	err := a.conn.Close()
	a.wg.Wait()
	if gerr != nil {
		a.log.Warn("mdns: stopped advertising; goodbye not sent (peers forget this gateway when its records expire, 120 s)", "err", gerr.Error())
	} else {
		a.log.Info("mdns: stopped advertising (goodbye sent)")
	}
	return err
}

// records are the service's PTR, SRV, TXT and A records with ttl (0 is
// a goodbye, RFC 6762 §10.1); negative keeps the zone's TTL.
func (a *Advertiser) records(ttl int) []dns.RR {
	rrs := a.zone.Records(dns.Question{Name: Service + ".local.", Qtype: dns.TypePTR, Qclass: dns.ClassINET})
	if ttl >= 0 {
		for _, rr := range rrs {
			rr.Header().Ttl = uint32(ttl)
		}
	}
	return rrs
}

// announce multicasts the records at start and once more a second later.
func (a *Advertiser) announce() {
	defer a.wg.Done()
	for i := range 2 {
		if i > 0 {
			select {
			case <-a.stop:
				return
			case <-time.After(time.Second):
			}
		}
		// Marked before it is sent: a query answered while the packet is on
		// its way must see it (after the send, a querier that heard it could
		// ask and be multicast to again within the second).
		a.lastMulticast.Store(time.Now().UnixNano())
		if err := a.send(a.records(-1), groupAddr, 0); err != nil && !a.closed.Load() {
			a.log.Warn("mdns: announcement not sent", "err", err.Error())
		}
	}
}

// serve answers queries that arrived on the interface.
func (a *Advertiser) serve() {
	defer a.wg.Done()
	buf := make([]byte, 9000)
	for {
		n, cm, src, err := a.pc.ReadFrom(buf)
		if err != nil {
			if a.closed.Load() {
				return
			}
			continue
		}
		if cm == nil || cm.IfIndex != a.ifi.Index {
			continue // another interface: never answered
		}
		from, ok := src.(*net.UDPAddr)
		if !ok {
			continue
		}
		var q dns.Msg
		if q.Unpack(buf[:n]) != nil || q.Response || q.Opcode != dns.OpcodeQuery || q.Rcode != 0 {
			continue
		}
		a.answer(&q, from)
	}
}

// answer replies to q: by unicast to a one-shot querier (source port not
// 5353, RFC 6762 §6.7, with the query's id and question) or one that asked
// for unicast (the QU bit), by multicast otherwise.
func (a *Advertiser) answer(q *dns.Msg, from *net.UDPAddr) {
	var rrs []dns.RR
	unicast := from.Port != Port
	for _, question := range q.Question {
		recs := a.zone.Records(question)
		if len(recs) > 0 && question.Qclass&(1<<15) != 0 {
			unicast = true
		}
		rrs = append(rrs, recs...)
	}
	if len(rrs) == 0 {
		return
	}
	if unicast {
		if from.Port != Port { // legacy unicast: TTL ≤ 10 s (§6.7)
			for _, rr := range rrs {
				rr.Header().Ttl = min(rr.Header().Ttl, 10)
			}
		}
		if err := a.send(rrs, from, q.Id, q.Question...); err != nil {
			a.log.Debug("mdns: answer not sent", "to", from.String(), "err", err.Error())
			return
		}
	} else {
		now := time.Now().UnixNano()
		last := a.lastMulticast.Load()
		if now-last < int64(multicastGap) || !a.lastMulticast.CompareAndSwap(last, now) {
			return // multicast less than a second ago: the querier heard it
		}
		if err := a.send(rrs, groupAddr, 0); err != nil {
			a.log.Debug("mdns: answer not sent", "err", err.Error())
			return
		}
	}
	a.answers.Add(1)
}

// send writes a response with rrs to dst through the interface.
func (a *Advertiser) send(rrs []dns.RR, dst *net.UDPAddr, id uint16, question ...dns.Question) error {
	m := &dns.Msg{MsgHdr: dns.MsgHdr{Id: id, Response: true, Authoritative: true}, Compress: true, Answer: rrs}
	if dst.Port != Port {
		m.Question = question
	}
	b, err := m.Pack()
	if err != nil {
		return err
	}
	_, err = a.pc.WriteTo(b, &ipv4.ControlMessage{IfIndex: a.ifi.Index}, dst)
	return err
}
