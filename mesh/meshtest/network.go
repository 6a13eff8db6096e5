// Package meshtest is an in-memory, fault-injecting memberlist transport for
// tests of package mesh. It needs no sockets, so whole meshes run inside
// testing/synctest, where minutes of gossip, failure detection and
// partition healing take milliseconds of real time.
//
// A Network hands out one Transport per node (NewTransport). Every transport
// has its own address (10.0.x.y:7946) and delivers
//
//   - packets (memberlist's UDP side) through a buffered channel: a send
//     never blocks, and is silently lost when the destination is crashed,
//     partitioned away, shut down, its queue is full, or the seeded random
//     loss (Drop) says so;
//   - streams (memberlist's TCP side) through net.Pipe pairs: a dial to an
//     unknown or shut-down address is refused at once, a dial across a
//     partition or to a crashed node waits out its timeout and fails with a
//     timeout error (like a SYN into the void), and streams already open
//     across a new partition or to a crashed node are closed.
//
// Faults: Partition(a, b) cuts every link between the two groups (both
// directions), Heal() restores all links, Crash(name) cuts a node off from
// everyone (its memberlist keeps running, as after a cable pull or a frozen
// process), Restore(name) undoes a Crash, Drop(p) loses each packet with
// probability p, Latency(d) delays packet delivery. Streams are reliable
// (TCP retransmits), so Drop applies to packets only; SynLoss(p) loses
// connection attempts and stream segments, which cost TCP's retransmission
// timeouts (1 s for a SYN, 200 ms for a segment, doubling).
// Stop(name) freezes a node like SIGSTOP: connections to it are accepted
// but never read, packets are lost, nothing is refused; Resume undoes it.
//
// Stats counts the bytes and packets each node sent and received, which
// gives gossip bandwidth at rest.
//
// Create the Network inside the synctest bubble (synctest.Test's function):
// its channels and pipes must belong to the bubble for time to advance.
package meshtest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Port is the port every in-memory transport advertises.
const Port = 7946

// Queue sizes: packets beyond PacketQueue waiting at one node are dropped
// (like a full UDP socket buffer); dials beyond StreamQueue are refused.
const (
	PacketQueue = 4096
	StreamQueue = 256
)

// Network connects the transports it creates.
type Network struct {
	mu      sync.Mutex
	rng     *rand.Rand
	drop    float64
	synLoss float64
	latency time.Duration
	next    int
	byAddr  map[string]*Transport
	byName  map[string][]*Transport
	blocked map[[2]*Transport]bool
	conns   map[*conn]struct{}
}

// NewNetwork returns an empty network whose random packet loss is drawn
// from seed (runs are repeatable up to goroutine scheduling).
func NewNetwork(seed uint64) *Network {
	return &Network{
		rng:     rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		byAddr:  map[string]*Transport{},
		byName:  map[string][]*Transport{},
		blocked: map[[2]*Transport]bool{},
		conns:   map[*conn]struct{}{},
	}
}

// NewTransport creates the transport of a node. name is used by the fault
// controls (Partition, Crash); several transports may share a name (a
// duplicate node id), routing is by address.
func (n *Network) NewTransport(name string) *Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next++
	ip := nthIP(n.next)
	t := &Transport{
		net:      n,
		name:     name,
		ip:       ip,
		addr:     NthAddr(n.next),
		packetCh: make(chan *memberlist.Packet, PacketQueue),
		streamCh: make(chan net.Conn, StreamQueue),
		done:     make(chan struct{}),
	}
	n.byAddr[t.addr] = t
	n.byName[name] = append(n.byName[name], t)
	return t
}

// NthAddr is the address the k-th transport of a Network gets (1-based):
// 10.0.(k/256).(k%256):7946. Tests use it to write seed lists before the
// nodes exist.
func NthAddr(k int) string { return net.JoinHostPort(nthIP(k).String(), strconv.Itoa(Port)) }

func nthIP(k int) net.IP { return net.IPv4(10, 0, byte(k>>8), byte(k)) }

// Addr returns the address ("ip:port") of the most recent transport created
// for name, or "".
func (n *Network) Addr(name string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	ts := n.byName[name]
	if len(ts) == 0 {
		return ""
	}
	return ts[len(ts)-1].addr
}

// Partition cuts every link between a node of a and a node of b, in both
// directions, and closes the streams that cross the cut. Links inside each
// group, and to nodes in neither group, are untouched.
func (n *Network) Partition(a, b []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, x := range a {
		for _, y := range b {
			for _, tx := range n.byName[x] {
				for _, ty := range n.byName[y] {
					n.blocked[[2]*Transport{tx, ty}] = true
					n.blocked[[2]*Transport{ty, tx}] = true
				}
			}
		}
	}
	n.cutLocked()
}

// Heal removes every partition (crashed nodes stay crashed).
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.blocked)
}

// Crash cuts the named node(s) off from every other node: nothing is
// delivered to or from them, dials time out, open streams are closed.
func (n *Network) Crash(names ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, name := range names {
		for _, t := range n.byName[name] {
			t.down = true
		}
	}
	n.cutLocked()
}

// Restore undoes Crash for the named node(s).
func (n *Network) Restore(names ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, name := range names {
		for _, t := range n.byName[name] {
			t.down = false
		}
	}
}

// Stop freezes the named node(s) like SIGSTOP: the host still accepts
// connections (dials succeed) but nothing reads them, so writes block until
// their deadline; packets to and from them are lost. Nothing is refused:
// the node is silent. Resume undoes it (held streams are then handed over).
func (n *Network) Stop(names ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, name := range names {
		for _, t := range n.byName[name] {
			t.stopped = true
		}
	}
}

// Resume undoes Stop: streams accepted meanwhile are handed to the node.
func (n *Network) Resume(names ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, name := range names {
		for _, t := range n.byName[name] {
			t.stopped = false
			for _, c := range t.held {
				select {
				case t.streamCh <- c:
				default:
					_ = c.Close()
				}
			}
			t.held = nil
		}
	}
}

// SynLoss sets the probability (0..1) that a connection attempt's SYN (or
// its SYN-ACK) is lost, and that a stream write's segment is. Like TCP, a
// lost SYN is sent again after 1 s, then 2 s, 4 s …, until the dial's
// timeout, and a lost segment after 200 ms, 400 ms, …: a lossy link makes
// streams slow, not broken. Packet loss (Drop) is separate.
func (n *Network) SynLoss(p float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.synLoss = min(max(p, 0), 1)
}

// Drop sets the probability (0..1) that any packet is lost.
func (n *Network) Drop(p float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.drop = min(max(p, 0), 1)
}

// Latency delays the delivery of every packet by d (0: immediate).
func (n *Network) Latency(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.latency = max(d, 0)
}

// Stats is what one node sent and received.
type Stats struct {
	Name                     string
	PacketsSent, PacketsRecv int64
	PacketBytesSent          int64
	PacketBytesRecv          int64
	PacketsDropped           int64 // sent by this node and lost (fault, loss or full queue)
	StreamsOpened            int64 // dials by this node that connected
	StreamBytesSent          int64
	StreamBytesRecv          int64
}

// BytesSent is everything the node put on the wire.
func (s Stats) BytesSent() int64 { return s.PacketBytesSent + s.StreamBytesSent }

// Stats returns per-transport counters, sorted by name then address.
func (n *Network) Stats() []Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []Stats
	addrs := make([]string, 0, len(n.byAddr))
	for a := range n.byAddr {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	for _, a := range addrs {
		t := n.byAddr[a]
		s := t.stats
		s.Name = t.name
		out = append(out, s)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ResetStats zeroes every counter.
func (n *Network) ResetStats() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, t := range n.byAddr {
		t.stats = Stats{}
	}
}

// linkLocked reports whether from can reach to now.
func (n *Network) linkLocked(from, to *Transport) bool {
	return !from.down && !to.down && !from.closed && !to.closed && !n.blocked[[2]*Transport{from, to}]
}

// packetLinkLocked: a link that also carries packets (a stopped node
// neither reads nor sends any).
func (n *Network) packetLinkLocked(from, to *Transport) bool {
	return n.linkLocked(from, to) && !from.stopped && !to.stopped
}

// cutLocked closes every open stream whose link is now broken.
func (n *Network) cutLocked() {
	for c := range n.conns {
		if !n.linkLocked(c.local, c.remote) {
			delete(n.conns, c)
			_ = c.Conn.Close()
		}
	}
}

// Transport is one node's memberlist.NodeAwareTransport.
type Transport struct {
	net      *Network
	name     string
	ip       net.IP
	addr     string
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	done     chan struct{}

	// guarded by net.mu
	down, closed bool
	stopped      bool
	held         []net.Conn // streams accepted while stopped
	stats        Stats
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// Name is the node name the transport was created for.
func (t *Transport) Name() string { return t.name }

// Addr is the transport's "ip:port".
func (t *Transport) Addr() string { return t.addr }

// FinalAdvertiseAddr implements memberlist.Transport: the transport's own
// address, whatever was configured.
func (t *Transport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return t.ip, Port, nil
}

// WriteTo implements memberlist.Transport.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress implements memberlist.NodeAwareTransport. Like UDP, it
// never blocks and never reports a lost packet.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	n := t.net
	n.mu.Lock()
	if t.closed {
		n.mu.Unlock()
		return now, errors.New("meshtest: transport shut down")
	}
	t.stats.PacketsSent++
	t.stats.PacketBytesSent += int64(len(b))
	dst := n.byAddr[a.Addr]
	if dst == nil || !n.packetLinkLocked(t, dst) || (n.drop > 0 && n.rng.Float64() < n.drop) {
		t.stats.PacketsDropped++
		n.mu.Unlock()
		return now, nil
	}
	p := &memberlist.Packet{
		Buf:       append([]byte(nil), b...),
		From:      &net.UDPAddr{IP: t.ip, Port: Port},
		Timestamp: now,
	}
	if d := n.latency; d > 0 {
		n.mu.Unlock()
		time.AfterFunc(d, func() { t.deliver(dst, p, true) })
		return now, nil
	}
	t.deliverLocked(dst, p)
	n.mu.Unlock()
	return now, nil
}

// deliver hands a delayed packet over, re-checking the link at arrival.
func (t *Transport) deliver(dst *Transport, p *memberlist.Packet, recheck bool) {
	n := t.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if recheck && !n.packetLinkLocked(t, dst) {
		t.stats.PacketsDropped++
		return
	}
	p.Timestamp = time.Now()
	t.deliverLocked(dst, p)
}

func (t *Transport) deliverLocked(dst *Transport, p *memberlist.Packet) {
	select {
	case dst.packetCh <- p:
		dst.stats.PacketsRecv++
		dst.stats.PacketBytesRecv += int64(len(p.Buf))
	default:
		t.stats.PacketsDropped++
	}
}

// PacketCh implements memberlist.Transport.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// DialTimeout implements memberlist.Transport.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	n := t.net
	n.mu.Lock()
	if t.closed {
		n.mu.Unlock()
		return nil, errors.New("meshtest: transport shut down")
	}
	dst := n.byAddr[a.Addr]
	if dst == nil || dst.closed {
		n.mu.Unlock()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("connect %s: connection refused", a.Addr)}
	}
	if !n.linkLocked(t, dst) || t.stopped {
		n.mu.Unlock()
		// The SYN goes nowhere (or a frozen process sends none): wait out the timeout (or our shutdown).
		tm := time.NewTimer(timeout)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-t.done:
		}
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: timeoutError{}}
	}
	// Lost SYNs: retransmitted after 1 s, 2 s, 4 s … within the timeout.
	start, rto := time.Now(), time.Second
	for n.synLoss > 0 && n.rng.Float64() < n.synLoss {
		n.mu.Unlock()
		left := timeout - time.Since(start)
		if left <= rto {
			tm := time.NewTimer(max(left, 0))
			select {
			case <-tm.C:
			case <-t.done:
			}
			tm.Stop()
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: timeoutError{}}
		}
		tm := time.NewTimer(rto)
		select {
		case <-tm.C:
		case <-t.done:
			tm.Stop()
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: timeoutError{}}
		}
		rto *= 2
		n.mu.Lock()
		if t.closed || dst.closed || !n.linkLocked(t, dst) {
			n.mu.Unlock()
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: timeoutError{}}
		}
	}
	p1, p2 := net.Pipe()
	local := &conn{Conn: p1, local: t, remote: dst, la: t.tcpAddr(), ra: dst.tcpAddr()}
	remote := &conn{Conn: p2, local: dst, remote: t, la: dst.tcpAddr(), ra: t.tcpAddr()}
	if dst.stopped {
		// The kernel accepts; the frozen process never reads.
		dst.held = append(dst.held, remote)
		n.conns[local] = struct{}{}
		n.conns[remote] = struct{}{}
		t.stats.StreamsOpened++
		n.mu.Unlock()
		return local, nil
	}
	select {
	case dst.streamCh <- remote:
	default:
		n.mu.Unlock()
		_ = p1.Close()
		_ = p2.Close()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: fmt.Errorf("connect %s: connection refused (backlog full)", a.Addr)}
	}
	n.conns[local] = struct{}{}
	n.conns[remote] = struct{}{}
	t.stats.StreamsOpened++
	n.mu.Unlock()
	return local, nil
}

// StreamCh implements memberlist.Transport.
func (t *Transport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown implements memberlist.Transport: the address stops accepting,
// open streams are closed, pending dials return.
func (t *Transport) Shutdown() error {
	n := t.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	close(t.done)
	n.cutLocked()
	for {
		select {
		case c := <-t.streamCh:
			_ = c.Close()
		default:
			return nil
		}
	}
}

func (t *Transport) tcpAddr() net.Addr { return &net.TCPAddr{IP: t.ip, Port: Port} }

// conn is one end of a stream: it counts bytes and reports TCP addresses.
type conn struct {
	net.Conn
	local, remote *Transport
	la, ra        net.Addr
}

func (c *conn) LocalAddr() net.Addr  { return c.la }
func (c *conn) RemoteAddr() net.Addr { return c.ra }

func (c *conn) Write(b []byte) (int, error) {
	// A lost segment is retransmitted after TCP's minimum RTO (200 ms),
	// then 400 ms, … (SynLoss).
	n := c.local.net
	rto := 200 * time.Millisecond
	for {
		n.mu.Lock()
		lost := n.synLoss > 0 && n.rng.Float64() < n.synLoss
		n.mu.Unlock()
		if !lost {
			break
		}
		time.Sleep(rto)
		rto *= 2
	}
	k, err := c.Conn.Write(b)
	if k > 0 {
		n.mu.Lock()
		c.local.stats.StreamBytesSent += int64(k)
		c.remote.stats.StreamBytesRecv += int64(k)
		n.mu.Unlock()
	}
	return k, err
}

func (c *conn) Close() error {
	n := c.local.net
	n.mu.Lock()
	delete(n.conns, c)
	n.mu.Unlock()
	return c.Conn.Close()
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }
