package natscluster

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP link the test controls: it forwards connections to a
// target and can add latency, stall (bytes wait, as in a link that drops
// packets for a while: TCP delivers them late), or cut (every connection
// closed; new ones are accepted and left silent, as in a link whose
// packets go nowhere, until Heal).
type Proxy struct {
	l      net.Listener
	target string

	mu      sync.Mutex
	delay   time.Duration
	cut     bool
	stalled bool
	changed chan struct{} // closed and replaced on every change of cut/stalled
	conns   map[*pipe]bool
	held    []net.Conn // accepted while cut
	closed  bool
}

// NewProxy listens on a free loopback port and forwards to target
// (host:port). It is closed when the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{l: l, target: target, changed: make(chan struct{}), conns: map[*pipe]bool{}}
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// SetDelay delays every chunk by d in each direction (a round trip of
// 2d); bytes keep their order and nothing limits the throughput.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Cut closes every connection; connections made until Heal are accepted
// and left silent.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = map[*pipe]bool{}
	p.signal()
	p.mu.Unlock()
	for c := range conns {
		c.close()
	}
}

// Stall stops forwarding: the bytes wait in the proxy and the sockets
// until Heal delivers them, late (or until an end gives up on the
// connection).
func (p *Proxy) Stall() {
	p.mu.Lock()
	p.stalled = true
	p.signal()
	p.mu.Unlock()
}

// Heal ends a cut or a stall: stalled bytes are delivered, connections
// held silent are closed (their clients dial again).
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut, p.stalled = false, false
	held := p.held
	p.held = nil
	p.signal()
	p.mu.Unlock()
	for _, c := range held {
		c.Close()
	}
}

// Close stops the proxy and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	conns, held := p.conns, p.held
	p.conns, p.held = map[*pipe]bool{}, nil
	p.mu.Unlock()
	p.l.Close()
	for c := range conns {
		c.close()
	}
	for _, c := range held {
		c.Close()
	}
}

func (p *Proxy) signal() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Proxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		if p.cut {
			p.held = append(p.held, c)
			p.mu.Unlock()
			continue
		}
		p.mu.Unlock()
		up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		pp := &pipe{a: c, b: up, done: make(chan struct{})}
		p.mu.Lock()
		if p.cut || p.closed {
			p.mu.Unlock()
			pp.close()
			continue
		}
		p.conns[pp] = true
		p.mu.Unlock()
		go p.forward(pp, c, up)
		go p.forward(pp, up, c)
	}
}

type pipe struct {
	a, b net.Conn
	once sync.Once
	done chan struct{}
}

func (pp *pipe) close() {
	pp.once.Do(func() {
		close(pp.done)
		pp.a.Close()
		pp.b.Close()
	})
}

type chunk struct {
	b  []byte
	at time.Time
}

// forward copies src to dst: a reader queues each chunk with its arrival
// time, a writer delivers it once the delay has passed and the link is
// not stalled (so latency does not cap the throughput).
func (p *Proxy) forward(pp *pipe, src, dst net.Conn) {
	q := make(chan chunk, 256)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case q <- chunk{buf[:n], time.Now()}:
				case <-pp.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		p.mu.Lock()
		delete(p.conns, pp)
		p.mu.Unlock()
		pp.close()
	}()
	for c := range q {
		for {
			p.mu.Lock()
			stalled, changed, delay := p.stalled, p.changed, p.delay
			p.mu.Unlock()
			if stalled {
				select {
				case <-changed:
				case <-pp.done:
					return
				}
				continue
			}
			wait := time.Until(c.at.Add(delay))
			if wait <= 0 {
				break
			}
			select { // and look again: the link may stall meanwhile
			case <-time.After(wait):
			case <-changed:
			case <-pp.done:
				return
			}
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}
