package modbus

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"time"

	gb "github.com/goburrow/modbus"
	"github.com/goburrow/serial"
	"github.com/physd/physd/drivers"
)

// rtuLink is Modbus RTU: goburrow's client and RTU packager (PDU encoding,
// CRC, response checks) over our own transport, rtuTransport, on a
// goburrow/serial port. goburrow's own RTU transport is not used; see the
// package doc for why.
type rtuLink struct {
	pk *gb.RTUClientHandler // only its packager half (SlaveId, Encode, Verify, Decode) is used
	t  *rtuTransport
	c  gb.Client
}

func newRTULink(cfg serial.Config, silence time.Duration, st *counters, stop <-chan struct{}) *rtuLink {
	pk := gb.NewRTUClientHandler(cfg.Address)
	t := newRTUTransport(cfg, silence, st, stop)
	return &rtuLink{pk: pk, t: t, c: gb.NewClient2(pk, t)}
}

func (l *rtuLink) open() error {
	if l.t.port != nil {
		return nil
	}
	return l.t.openPort()
}

func (l *rtuLink) client(unit byte, timeout time.Duration) gb.Client {
	l.pk.SlaveId = unit
	l.t.timeout = timeout
	return l.c
}

// broken also covers errors goburrow finds after the transport returned a
// frame (an echo that does not match): the line is suspect either way.
func (l *rtuLink) broken(error) { l.t.dirty = true }

// settle flushes a dirty line before the worker takes the next request.
func (l *rtuLink) settle() {
	if l.t.port != nil && l.t.dirty {
		_ = l.t.flush()
	}
}

func (l *rtuLink) reused() bool { return false }
func (l *rtuLink) close() error { return l.t.closePort() }

// rtuTransport implements goburrow's Transporter for one serial line.
//
// The hazard it exists for: RTU has no transaction id, so a reply that
// arrives after its request timed out looks, CRC and all, like the reply to
// the next request. Two defences:
//
//  1. After any timeout or error the line is dirty: before anything else
//     is sent (rtuLink.settle, or Send itself), input is read and
//     discarded until the line has been silent for `silence` (silence_ms,
//     default timeout_ms: the slowest reply expected).
//  2. Before every send one quiet inter-frame gap (t3.5) is required
//     anyway; a byte seen then is a stray reply, and the line is flushed
//     as in 1. This costs one t3.5 per request (1.75 ms above 19200 baud).
//
// A reply later than timeout + silence_ms that lands exactly between a
// send and its reply can still pass for that reply: set silence_ms above
// the slowest reply any unit on the line gives. Besides, a reply is
// accepted only when its unit, function, byte count, length and CRC all
// fit the request, and bytes trailing a complete frame make it an error.
//
// goburrow/serial's port reads with select(2) and a fixed timeout set at
// open; the transport opens it with timeout t3.5 and polls, which gives
// both the quiet checks and per-request deadlines at t3.5 granularity.
type rtuTransport struct {
	cfg     serial.Config
	port    serial.Port
	gap     time.Duration // t3.5, also the port's read timeout (the poll tick)
	silence time.Duration
	timeout time.Duration // of the exchange about to run
	dirty   bool
	st      *counters
	stop    <-chan struct{} // the bus is closing: abandon a flush
	rd      [rtuMaxFrame]byte
}

// maxFlush bounds a flush on a line that never goes quiet (another master,
// noise): the request then fails unsent instead of waiting forever.
func (t *rtuTransport) maxFlush() time.Duration { return max(10*t.silence, 2*time.Second) }

func newRTUTransport(cfg serial.Config, silence time.Duration, st *counters, stop <-chan struct{}) *rtuTransport {
	gap := max(frameGap(cfg.BaudRate), time.Millisecond)
	cfg.Timeout = gap
	return &rtuTransport{cfg: cfg, gap: gap, silence: silence, st: st, stop: stop}
}

func (t *rtuTransport) openPort() error {
	p, err := serial.Open(&t.cfg)
	if err != nil {
		if t.cfg.RS485.Enabled && errors.Is(err, syscall.ENOTTY) {
			return fmt.Errorf("open serial port %s: the device does not support RS-485 mode (TIOCSRS485): %w; set rs485.enabled: false if the adapter switches direction by itself", t.cfg.Address, err)
		}
		return fmt.Errorf("open serial port %s: %w", t.cfg.Address, err)
	}
	t.port = p
	// Bytes already waiting are not ours; quiet() sees them before the
	// first send and flushes.
	t.dirty = false
	t.st.reconnects.Add(1)
	return nil
}

func (t *rtuTransport) closePort() error {
	if t.port == nil {
		return nil
	}
	err := t.port.Close()
	t.port = nil
	return err
}

// ioFailed drops a port that returned an I/O error (an unplugged adapter):
// the worker reopens it, with backoff, before the next request.
func (t *rtuTransport) ioFailed(err error) error {
	_ = t.closePort()
	return fmt.Errorf("serial port %s: %w", t.cfg.Address, err)
}

// Send writes one request frame and returns the reply frame.
func (t *rtuTransport) Send(req []byte) ([]byte, error) {
	if t.port == nil {
		return nil, notSent("serial port %s is not open", t.cfg.Address)
	}
	if err := t.quiet(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(t.timeout)
	for off := 0; off < len(req); {
		n, err := t.port.Write(req[off:])
		if err != nil && !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EINTR) {
			t.dirty = true
			return nil, t.ioFailed(err)
		}
		off += n
		if off < len(req) && !time.Now().Before(deadline) {
			t.dirty = true
			return nil, fmt.Errorf("serial write of %d/%d bytes timed out: %w", off, len(req), drivers.ErrTimeout)
		}
	}
	got := make([]byte, 0, rtuMaxFrame)
	want := 0
	for {
		if want == 0 {
			n, err := rtuReplyLen(req, got)
			if err != nil {
				t.dirty = true
				return nil, err
			}
			want = n
		}
		if want > 0 && len(got) >= want {
			break
		}
		if !time.Now().Before(deadline) {
			t.dirty = true
			return nil, fmt.Errorf("no complete reply within %v (got %d bytes): %w", t.timeout, len(got), drivers.ErrTimeout)
		}
		n, err := t.port.Read(t.rd[:])
		switch {
		case errors.Is(err, serial.ErrTimeout), errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINTR):
			yield()
			continue
		case err != nil:
			t.dirty = true
			return nil, t.ioFailed(err)
		case n == 0:
			t.dirty = true
			return nil, t.ioFailed(errors.New("hang-up (read returned no data)"))
		}
		if len(got)+n > rtuMaxFrame {
			t.dirty = true
			return nil, frameErr("reply exceeds %d bytes", rtuMaxFrame)
		}
		got = append(got, t.rd[:n]...)
	}
	if len(got) > want {
		t.dirty = true
		return nil, frameErr("%d bytes follow a complete %d-byte reply (a late reply on the line?)", len(got)-want, want)
	}
	if !crcOK(got) {
		t.dirty = true
		return nil, frameErr("CRC mismatch")
	}
	return got, nil
}

// quiet makes sure the line is silent before a send: one inter-frame gap
// normally; when stray bytes show up then (a reply later than silence_ms),
// or the line is still dirty, the full flush.
func (t *rtuTransport) quiet() error {
	if t.dirty {
		return t.flush()
	}
	n, err := t.drain(t.gap)
	if err != nil {
		return err
	}
	if n > 0 {
		t.st.strays.Add(1)
		t.st.discarded.Add(int64(n))
		return t.flush()
	}
	return nil
}

// flush discards input until the line has been silent for silence.
func (t *rtuTransport) flush() error {
	n, err := t.drain(t.silence)
	t.st.flushes.Add(1)
	t.st.discarded.Add(int64(n))
	if err != nil {
		return err
	}
	t.dirty = false
	return nil
}

// drain reads and discards input until none has arrived for quiet; it
// returns how many bytes it threw away.
func (t *rtuTransport) drain(quiet time.Duration) (int, error) {
	start := time.Now()
	last, total := start, 0
	for {
		select {
		case <-t.stop:
			return total, notSent("bus closed")
		default:
		}
		n, err := t.port.Read(t.rd[:])
		now := time.Now()
		switch {
		case errors.Is(err, serial.ErrTimeout), errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINTR):
			if now.Sub(last) >= quiet {
				return total, nil
			}
			yield()
		case err != nil:
			return total, &errNotSent{err: t.ioFailed(err)}
		case n == 0:
			return total, &errNotSent{err: t.ioFailed(errors.New("hang-up (read returned no data)"))}
		default:
			total += n
			last = now
		}
		if now.Sub(start) > t.maxFlush() {
			t.dirty = true
			return total, notSent("serial line %s did not go quiet for %v within %v (another master or noise on the line?)", t.cfg.Address, quiet, t.maxFlush())
		}
	}
}

// yield lets other goroutines run between two polls of the port.
// goburrow/serial waits in select(2), a plain blocking syscall that keeps
// this goroutine's P for the whole tick; on a single-core gateway
// (GOMAXPROCS=1) back-to-back polls would otherwise leave the rest of the
// daemon (including a slave on a pty in tests) only what the runtime's
// sysmon takes back.
func yield() { runtime.Gosched() }
