package modbustest

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
)

// Drop is what a FaultProxy does with one request (SetDrop).
type Drop uint8

// What a proxy can do to a request and its reply.
const (
	Pass         Drop = iota // forward both
	DropRequest              // never deliver the request; the connection stays open
	DropReply                // deliver the request, swallow the reply; the connection stays open
	ResetReply               // deliver the request, then close the client's connection instead of replying
	ResetRequest             // close the client's connection instead of delivering the request
)

// FaultProxy sits between a Modbus TCP client and a server and loses
// requests or replies on command, like a flaky network or a gateway that
// drops frames. It parses MBAP frames only to count them.
type FaultProxy struct {
	Addr   string // where clients connect
	target string
	ln     net.Listener

	mu    sync.Mutex
	drop  func(n int) Drop
	n     int
	conns map[net.Conn]bool
	done  chan struct{}
}

// StartProxy listens on a free loopback port and forwards to target.
func StartProxy(target string) (*FaultProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &FaultProxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]bool{}, done: make(chan struct{})}
	go p.accept()
	return p, nil
}

// SetDrop decides the fate of request number n (1-based, over all
// connections); nil passes everything.
func (p *FaultProxy) SetDrop(f func(n int) Drop) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drop = f
}

// Close stops the proxy and closes every connection.
func (p *FaultProxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	<-p.done
	return err
}

func (p *FaultProxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
}

func (p *FaultProxy) accept() {
	defer close(p.done)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		wg.Go(func() { p.serve(c) })
	}
}

func (p *FaultProxy) next() Drop {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	if p.drop == nil {
		return Pass
	}
	return p.drop(p.n)
}

// serve relays one client connection, one request at a time (Modbus TCP
// clients here wait for each reply).
func (p *FaultProxy) serve(client net.Conn) {
	p.track(client, true)
	defer p.track(client, false)
	defer client.Close()
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	p.track(up, true)
	defer p.track(up, false)
	defer up.Close()
	for {
		req, err := readMBAP(client)
		if err != nil {
			return
		}
		switch p.next() {
		case DropRequest:
			continue
		case ResetRequest:
			return
		case DropReply:
			if _, err := up.Write(req); err != nil {
				return
			}
			if _, err := readMBAP(up); err != nil {
				return
			}
			continue
		case ResetReply:
			if _, err := up.Write(req); err != nil {
				return
			}
			_, _ = readMBAP(up) // the server has acted on it
			return
		}
		if _, err := up.Write(req); err != nil {
			return
		}
		reply, err := readMBAP(up)
		if err != nil {
			return
		}
		if _, err := client.Write(reply); err != nil {
			return
		}
	}
}

// readMBAP reads one Modbus TCP frame (7-byte header, then length-1 bytes).
func readMBAP(r io.Reader) ([]byte, error) {
	hdr := make([]byte, 7)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(hdr[4:]))
	if n < 2 || n > 254 {
		return nil, errors.New("modbustest: bad MBAP length")
	}
	body := make([]byte, n-1)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	return append(hdr, body...), nil
}
