package modbus

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	gb "github.com/goburrow/modbus"
	"github.com/physd/physd/drivers"
)

// tcpLink is Modbus TCP: goburrow's client and TCP packager (MBAP
// encoding, transaction-id checks) over our own transport, tcpTransport,
// which knows whether a request reached the wire. goburrow's transport
// does not tell "never sent" from "sent, no reply", and a write that may
// have landed must never be resent nor reported as not applied.
type tcpLink struct {
	pk *gb.TCPClientHandler // only its packager half (SlaveId, Encode, Verify, Decode) is used
	t  *tcpTransport
	c  gb.Client
}

func newTCPLink(address string, timeout time.Duration, st *counters) *tcpLink {
	pk := gb.NewTCPClientHandler(address)
	t := &tcpTransport{address: address, timeout: timeout, st: st}
	return &tcpLink{pk: pk, t: t, c: gb.NewClient2(pk, t)}
}

func (l *tcpLink) open() error { return l.t.dial() }

func (l *tcpLink) client(unit byte, timeout time.Duration) gb.Client {
	// A caller's deadline may shorten the wait: a reply later than that is
	// never read, because any error closes the connection.
	l.pk.SlaveId = unit
	l.t.timeout = timeout
	l.t.wasReused, l.t.fresh = !l.t.fresh, false
	return l.c
}

// broken closes the connection: goburrow's packager would otherwise stay
// one transaction id behind after a timeout.
func (l *tcpLink) broken(error) { l.t.close() }

func (l *tcpLink) settle()      {}
func (l *tcpLink) reused() bool { return l.t.wasReused }
func (l *tcpLink) close() error { return l.t.close() }

// tcpTransport implements goburrow's Transporter on one connection.
type tcpTransport struct {
	address   string
	timeout   time.Duration // of the exchange about to run; also the dial timeout
	conn      net.Conn
	fresh     bool // connected for the exchange about to run
	wasReused bool
	st        *counters
	hdr       [7]byte
}

func (t *tcpTransport) dial() error {
	if t.conn != nil {
		return nil
	}
	c, err := (&net.Dialer{Timeout: t.timeout}).Dial("tcp", t.address)
	if err != nil {
		return err
	}
	t.conn, t.fresh = c, true
	t.st.reconnects.Add(1)
	return nil
}

func (t *tcpTransport) close() error {
	if t.conn == nil {
		return nil
	}
	err := t.conn.Close()
	t.conn = nil
	return err
}

// alive checks, without waiting, that an idle connection still works: the
// peer may have closed it (a restart, an idle timeout), or bytes may be
// waiting that belong to no request. Either way it is replaced before the
// request is sent, so the request is never lost to a dead connection.
func (t *tcpTransport) alive() bool {
	if err := t.conn.SetReadDeadline(time.Now()); err != nil {
		return false
	}
	var b [1]byte
	n, err := t.conn.Read(b[:])
	return n == 0 && errors.Is(err, os.ErrDeadlineExceeded)
}

// Send writes one request and reads its reply. Errors before any byte of
// the request was written wrap drivers.ErrOffline (not sent); later ones
// leave the outcome open.
func (t *tcpTransport) Send(req []byte) ([]byte, error) {
	if t.conn != nil && !t.fresh && !t.alive() {
		t.close()
	}
	if err := t.dial(); err != nil {
		return nil, &errNotSent{err: err}
	}
	if err := t.conn.SetDeadline(time.Now().Add(t.timeout)); err != nil {
		return nil, &errNotSent{err: err}
	}
	if n, err := t.conn.Write(req); err != nil {
		if n == 0 {
			return nil, &errNotSent{err: err}
		}
		return nil, fmt.Errorf("request written in part (%d of %d bytes): %w", n, len(req), err)
	}
	if _, err := io.ReadFull(t.conn, t.hdr[:]); err != nil {
		return nil, replyErr(err)
	}
	n := int(binary.BigEndian.Uint16(t.hdr[4:]))
	if n < 2 || n > 254 {
		return nil, fmt.Errorf("reply header gives length %d (want 2..254)", n)
	}
	reply := make([]byte, 6+n)
	copy(reply, t.hdr[:])
	if _, err := io.ReadFull(t.conn, reply[7:]); err != nil {
		return nil, replyErr(err)
	}
	return reply, nil
}

// replyErr marks a missing reply: a timeout wraps drivers.ErrTimeout.
func replyErr(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("no reply: %w (%v)", drivers.ErrTimeout, err)
	}
	return fmt.Errorf("no reply: %w", err)
}
