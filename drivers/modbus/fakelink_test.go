package modbus

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	gb "github.com/goburrow/modbus"
	"github.com/physd/physd/drivers/modbus/modbustest"
)

// fakeLink is the TCP link's stand-in for tests inside testing/synctest:
// goburrow's real TCP packager (MBAP framing, transaction-id checks) over
// a transport that hands each PDU to a modbustest.Bank in memory. Bank
// delays and request timeouts run on synctest's fake clock.
type fakeLink struct {
	bank *modbustest.Bank
	pk   *gb.TCPClientHandler
	c    gb.Client

	timeout time.Duration
	st      *counters // counts opens as reconnects, as the real links do (nil: not counted)

	mu      sync.Mutex
	refuse  bool // open fails as a refused dial
	open_   bool
	opens   int
	brokens int
}

func newFakeLink(bank *modbustest.Bank) *fakeLink {
	l := &fakeLink{bank: bank, pk: gb.NewTCPClientHandler("fake:502")}
	l.c = gb.NewClient2(l.pk, l)
	return l
}

func (l *fakeLink) setRefuse(v bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refuse = v
}

func (l *fakeLink) stats() (opens, brokens int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.opens, l.brokens
}

func (l *fakeLink) open() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open_ {
		return nil
	}
	if l.refuse {
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	l.open_ = true
	l.opens++
	if l.st != nil {
		l.st.reconnects.Add(1)
	}
	return nil
}

func (l *fakeLink) client(unit byte, timeout time.Duration) gb.Client {
	l.pk.SlaveId = unit
	l.timeout = timeout
	return l.c
}

func (l *fakeLink) broken(error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open_ = false
	l.brokens++
}

func (l *fakeLink) settle()      {}
func (l *fakeLink) reused() bool { return false }
func (l *fakeLink) close() error { return nil }

// Send implements goburrow's Transporter: MBAP in, MBAP out.
func (l *fakeLink) Send(adu []byte) ([]byte, error) {
	if len(adu) < 8 {
		return nil, fmt.Errorf("short adu")
	}
	unit, pdu := adu[6], append([]byte(nil), adu[7:]...)
	type answer struct {
		pdu []byte
		ok  bool
	}
	ch := make(chan answer, 1)
	go func() {
		r, ok := l.bank.HandlePDU(unit, pdu)
		ch <- answer{r, ok}
	}()
	t := time.NewTimer(l.timeout)
	defer t.Stop()
	select {
	case a := <-ch:
		if a.ok {
			out := append([]byte(nil), adu[:7]...)
			binary.BigEndian.PutUint16(out[4:], uint16(1+len(a.pdu)))
			return append(out, a.pdu...), nil
		}
		<-t.C // an absent unit: no reply at all
	case <-t.C:
	}
	return nil, fmt.Errorf("read tcp fake: %w", os.ErrDeadlineExceeded)
}

// fakeBus starts a modbus_tcp bus on a fake link with extra config keys.
func fakeBus(t testing.TB, bank *modbustest.Bank, extra string) (*Bus, *fakeLink) {
	t.Helper()
	src := `{address: "fake:502"`
	if extra != "" {
		src += ", " + extra
	}
	spec, err := parseBus(busFrom(t, TypeTCP, src+"}"), TypeTCP)
	if err != nil {
		t.Fatal(err)
	}
	l := newFakeLink(bank)
	l.st = &counters{}
	b, err := start("modbus_tcp plc (fake)", spec, l, l.st, make(chan struct{}))
	if err != nil {
		t.Fatal(err)
	}
	return b, l
}
