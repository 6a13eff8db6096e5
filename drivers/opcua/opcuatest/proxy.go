package opcuatest

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// writeRequestID is how a WriteRequest's type id (ns=0;i=673) is encoded
// in an unencrypted OPC UA message body (a four-byte NodeId).
var writeRequestID = []byte{0x01, 0x00, 0xA1, 0x02}

// LossProxy forwards OPC UA TCP connections to a server. Once armed, the
// first connection that carries a WriteRequest (SecurityPolicy None only:
// it looks for the request's type id in the clear) forwards it to the
// server and drops every reply from then on: the write lands, its response
// is lost. Later connections are forwarded whole. Freeze makes it a
// network that silently loses everything, Thaw mends it.
type LossProxy struct {
	Endpoint string // opc.tcp://127.0.0.1:<port>/physd
	ln       net.Listener
	target   string
	armed    atomic.Bool
	frozen   atomic.Bool
	lost     atomic.Int32
	mu       sync.Mutex
	conns    []net.Conn
}

// StartLossProxy proxies to the server s until t ends.
func StartLossProxy(t testing.TB, s *Server) *LossProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &LossProxy{ln: ln, target: net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)),
		Endpoint: "opc.tcp://" + ln.Addr().String() + "/physd"}
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
	})
	return p
}

// Arm makes the next WriteRequest's reply (and its connection's) vanish.
func (p *LossProxy) Arm() { p.armed.Store(true) }

// Freeze drops every byte in both directions from now on, without closing
// a connection: a cable cut, as TCP sees it until its own timeouts.
func (p *LossProxy) Freeze() { p.frozen.Store(true) }

// Thaw forwards again (what was dropped meanwhile stays lost).
func (p *LossProxy) Thaw() { p.frozen.Store(false) }

// Lost is how many writes had their reply dropped.
func (p *LossProxy) Lost() int { return int(p.lost.Load()) }

func (p *LossProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		var mute atomic.Bool
		go func() { // client -> server
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 && !p.frozen.Load() {
					if p.armed.Load() && bytes.Contains(buf[:n], writeRequestID) && p.armed.CompareAndSwap(true, false) {
						mute.Store(true)
						p.lost.Add(1)
					}
					if _, werr := u.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = u.Close()
					return
				}
			}
		}()
		go func() { // server -> client
			buf := make([]byte, 64<<10)
			for {
				n, err := u.Read(buf)
				if n > 0 && !mute.Load() && !p.frozen.Load() {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					if err != io.EOF || !mute.Load() {
						_ = c.Close()
					}
					return
				}
			}
		}()
	}
}
