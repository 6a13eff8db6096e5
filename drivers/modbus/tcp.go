package modbus

import (
	"time"

	gb "github.com/goburrow/modbus"
)

// tcpLink is Modbus TCP through goburrow's TCPClientHandler. The handler
// already locks around each exchange and checks transaction ids; what it
// lacks is recovery (see link.broken), which the worker provides.
type tcpLink struct {
	h         *gb.TCPClientHandler
	c         gb.Client
	connected bool // we dialled and have not closed since
	fresh     bool // connected for the exchange about to run
	wasReused bool
	st        *counters
}

func newTCPLink(address string, timeout time.Duration, st *counters) *tcpLink {
	h := gb.NewTCPClientHandler(address)
	h.Timeout = timeout // also the dial timeout
	return &tcpLink{h: h, c: gb.NewClient(h), st: st}
}

func (l *tcpLink) open() error {
	if l.connected {
		return nil
	}
	if err := l.h.Connect(); err != nil {
		return err
	}
	l.connected, l.fresh = true, true
	l.st.reconnects.Add(1)
	return nil
}

func (l *tcpLink) client(unit byte, timeout time.Duration) gb.Client {
	// SlaveId and Timeout are plain fields goburrow reads in Encode and
	// Send; only this goroutine sends, so setting them here is race-free.
	l.h.SlaveId = unit
	l.h.Timeout = timeout
	l.wasReused, l.fresh = !l.fresh, false
	return l.c
}

func (l *tcpLink) broken(error) {
	_ = l.h.Close()
	l.connected = false
}

func (l *tcpLink) settle()      {}
func (l *tcpLink) reused() bool { return l.wasReused }

func (l *tcpLink) close() error {
	l.connected = false
	return l.h.Close()
}
