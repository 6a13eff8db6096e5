package modbus

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"time"

	"github.com/goburrow/serial"
	"github.com/physd/physd/drivers"
)

// rtuTransport implements goburrow's Transporter for one serial line, with
// the line discipline that keeps a reply from ever being taken as the
// answer to another request.
//
// The hazard: RTU has no transaction id, so a reply that arrives after its
// request timed out looks, CRC and all, like the reply to the next request
// of the same shape to the same unit. The defences:
//
//  1. A request waits its full timeout_ms plus the frames' time on the
//     wire, whatever the caller's deadline (rtuLink.client).
//  2. After a timeout, a frame error or stray bytes the line is suspect:
//     nothing is sent until it has been silent for silence_ms, counted
//     from the last byte seen (quarantine).
//  3. Every unit whose reply may still come is then re-synchronised: it
//     gets a probe, function 8 sub-function 0 (return query data) with a
//     sequence number, whose echo (or exception 0x88) has a function code
//     no real request uses. A late reply arriving during the probe is
//     recognised by its function and byte count and discarded; a probe
//     answered proves the unit has answered everything sent before it (a
//     slave answers in order). A unit that does not answer the probe is
//     trusted again only after a second quarantine, when the line has been
//     watched for at least 2 × (timeout_ms + silence_ms) since the
//     request that failed.
//  4. Before every send the line must be quiet for t3.5; bytes found then
//     are strays: quarantine and re-synchronise their unit first.
//  5. A reply is accepted only when its unit, function, byte count, length
//     and CRC all fit the request; bytes trailing a complete frame make it
//     an error.
//
// So a late reply is never returned for another request when its unit
// answers probes, and otherwise when it comes within 2 × (timeout_ms +
// silence_ms) of its request; beyond that it is still rejected unless it
// lands in a request of exactly its shape to its unit.
//
// goburrow/serial's port reads with select(2) and a fixed timeout set at
// open; the transport opens it with a short tick and polls.
type rtuTransport struct {
	cfg     serial.Config
	port    serial.Port
	gap     time.Duration // t3.5
	char    time.Duration // one 11-bit character
	tick    time.Duration // the port's read timeout: the poll period
	timeout time.Duration // timeout_ms: never shortened by callers
	silence time.Duration // silence_ms
	lastRx  time.Time     // when a byte was last read
	dirty   bool          // quarantine before the next send
	units   map[byte]*lineUnit
	seq     uint16 // probe sequence number, echoed by the unit
	st      *counters
	stop    <-chan struct{} // the bus is closing: abandon a quarantine
	rd      [rtuMaxFrame]byte
}

// lineUnit is what the line knows about one unit's replies.
type lineUnit struct {
	unsynced bool // a reply to an earlier request may still come
	// probed: the unit has answered a probe (or a late probe reply of it
	// was seen). Such a unit is held to a proof: after a failure, nothing
	// is sent to it until it answers a probe. A unit never seen to answer
	// one is trusted again by time, after a quarantine.
	probed     bool
	lastSeq    uint16    // t.seq when the last real request was sent
	lastSentAt time.Time // when the last real request was sent
	// An exception to function 8 carries no sequence number, so it proves
	// nothing while a probe sent before the last real request may still be
	// answered: unansweredAt is when the latest unanswered probe was sent,
	// staleProbeAt its value when the last real request was sent.
	unansweredAt, staleProbeAt time.Time
}

// maxFlush bounds a quarantine on a line that never goes quiet (another
// master, noise): the request then fails unsent instead of waiting forever.
func (t *rtuTransport) maxFlush() time.Duration { return max(10*t.silence, 2*time.Second) }

func newRTUTransport(cfg serial.Config, timeout, silence time.Duration, st *counters, stop <-chan struct{}) *rtuTransport {
	gap := max(frameGap(cfg.BaudRate), time.Millisecond)
	tick := min(gap, 500*time.Microsecond)
	cfg.Timeout = tick
	return &rtuTransport{cfg: cfg, gap: gap, char: charTime(cfg.BaudRate), tick: tick, timeout: timeout, silence: silence,
		units: map[byte]*lineUnit{}, st: st, stop: stop}
}

func (t *rtuTransport) unit(id byte) *lineUnit {
	u := t.units[id]
	if u == nil {
		u = &lineUnit{}
		t.units[id] = u
	}
	return u
}

func (t *rtuTransport) openPort() error {
	p, err := serial.Open(&t.cfg)
	if err != nil {
		return &serialError{port: t.cfg.Address, rs485: t.cfg.RS485.Enabled, err: err}
	}
	t.port = p
	// Bytes already waiting are not ours: the quiet check before the first
	// send sees them and quarantines.
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

// suspect marks the line and a unit whose reply may still come.
func (t *rtuTransport) suspect(id byte) {
	t.dirty = true
	if id >= 1 && id <= 247 {
		t.unit(id).unsynced = true
	}
}

// wire is how long n bytes take on the line.
func (t *rtuTransport) wire(n int) time.Duration { return time.Duration(n) * t.char }

// Send writes one request frame and returns the reply frame.
func (t *rtuTransport) Send(req []byte) ([]byte, error) {
	if t.port == nil {
		return nil, notSent("serial port %s is not open", t.cfg.Address)
	}
	if len(req) < 4 {
		return nil, notSent("request of %d bytes is too short", len(req))
	}
	id := req[0]
	if u := t.unit(id); u.unsynced {
		if err := t.resync(id, u); err != nil {
			return nil, err
		}
	}
	if err := t.quiet(); err != nil {
		return nil, err
	}
	if err := t.write(req); err != nil {
		t.suspect(id)
		return nil, err
	}
	u := t.unit(id)
	u.lastSeq, u.lastSentAt, u.staleProbeAt = t.seq, time.Now(), u.unansweredAt
	deadline := time.Now().Add(t.timeout + t.wire(len(req)+rtuExpectedLen(req)))
	got, err := t.readFrame(deadline, true, func(got []byte) (int, error) { return rtuReplyLen(req, got) })
	if err != nil {
		t.suspect(id)
		if len(got) > 0 {
			t.suspect(got[0]) // someone else's reply, perhaps: that unit is out of step too
			if len(got) >= 2 && got[1]&0x7F == 8 {
				t.unit(got[0]).probed = true // a late answer to a probe
			}
		}
		return nil, err
	}
	return got, nil
}

// write sends a frame. An error before any byte left means nothing was
// sent (drivers.ErrOffline).
func (t *rtuTransport) write(frame []byte) error {
	deadline := time.Now().Add(t.timeout + t.wire(len(frame)))
	for off := 0; off < len(frame); {
		n, err := t.port.Write(frame[off:])
		if err != nil && !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EINTR) {
			if off == 0 && n <= 0 {
				return &errNotSent{err: t.ioFailed(err)}
			}
			return t.ioFailed(err)
		}
		off += max(n, 0)
		if off < len(frame) && !time.Now().Before(deadline) {
			if off == 0 {
				return notSent("serial write timed out with nothing written: %w", drivers.ErrTimeout)
			}
			return fmt.Errorf("serial write of %d/%d bytes timed out: %w", off, len(frame), drivers.ErrTimeout)
		}
	}
	return nil
}

// readFrame reads one frame whose length frameLen judges from its first
// bytes (0: more bytes needed), until deadline. It returns the bytes read
// so far with any error. With confirm, the frame must also be followed by
// t3.5 of silence, as RTU delimits frames: a reply of the right shape that
// runs straight into more bytes (a stray frame and then the real reply) is
// refused, and the next send's quiet check is then already satisfied.
func (t *rtuTransport) readFrame(deadline time.Time, confirm bool, frameLen func(got []byte) (int, error)) ([]byte, error) {
	got := make([]byte, 0, rtuMaxFrame)
	want := 0
	for {
		if want == 0 {
			n, err := frameLen(got)
			if err != nil {
				return got, err
			}
			want = n
		}
		if want > 0 && len(got) >= want {
			break
		}
		if !time.Now().Before(deadline) {
			return got, fmt.Errorf("no complete reply within %v (got %d bytes): %w", t.timeout, len(got), drivers.ErrTimeout)
		}
		n, err := t.read()
		if err != nil {
			return got, err
		}
		if len(got)+n > rtuMaxFrame {
			return got, frameErr("reply exceeds %d bytes", rtuMaxFrame)
		}
		got = append(got, t.rd[:n]...)
	}
	if len(got) > want {
		return got, frameErr("%d bytes follow a complete %d-byte reply (a late reply on the line?)", len(got)-want, want)
	}
	if !crcOK(got) {
		return got, frameErr("CRC mismatch")
	}
	if confirm {
		n, _, err := t.drain(t.gap, t.lastRx)
		switch {
		case err != nil:
			return got, err
		case n > 0:
			return got, frameErr("%d bytes follow a complete %d-byte reply within t3.5 (a stray frame and then the reply?)", n, want)
		}
	}
	return got, nil
}

// read polls the port for one tick; 0 bytes is a quiet tick.
func (t *rtuTransport) read() (int, error) {
	n, err := t.port.Read(t.rd[:])
	switch {
	case errors.Is(err, serial.ErrTimeout), errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EINTR):
		yield()
		return 0, nil
	case err != nil:
		return 0, t.ioFailed(err)
	case n == 0:
		return 0, t.ioFailed(errors.New("hang-up (read returned no data)"))
	}
	t.lastRx = time.Now()
	return n, nil
}

// quiet makes sure the line is fit for a send: recovered if suspect, and
// silent for t3.5. Bytes found then are a stray (a reply later than the
// guarantee's bound, or noise): their unit is re-synchronised first. Its
// errors mean nothing was sent.
func (t *rtuTransport) quiet() error {
	for range 2 {
		if err := t.recover(); err != nil {
			return err
		}
		// Bytes that arrived since the last one read are still buffered,
		// so the line has been quiet since then if the first poll finds
		// none. (Even right after the check that follows a reply this poll
		// is needed: a stray that lands in between would otherwise be read
		// as the next reply.)
		n, first, err := t.drain(t.gap, t.lastRx)
		if err != nil {
			return &errNotSent{err: err}
		}
		if n == 0 {
			return nil
		}
		t.st.strays.Add(1)
		t.st.discarded.Add(int64(n))
		t.suspect(first)
	}
	return notSent("serial line %s keeps carrying stray bytes (another master or noise on the line?)", t.cfg.Address)
}

// recover quarantines a suspect line and tries to re-synchronise every
// unit whose reply may still come. A unit that stays out of step only
// blocks requests to itself (Send); the other units' replies cannot be
// mistaken for its own. Its errors mean nothing was sent.
func (t *rtuTransport) recover() error {
	for id, u := range t.units {
		if !u.unsynced {
			continue
		}
		if err := t.resync(id, u); err != nil && !errors.Is(err, errOutOfStep) {
			return err
		}
	}
	if t.dirty {
		return t.quarantine()
	}
	return nil
}

// errOutOfStep: a unit that answers probes has not answered one since its
// last failure, so a reply it owes may still come.
var errOutOfStep = errors.New("unit out of step")

// resync sends one probe to a unit after a quarantine. Answered: the unit
// is in step (a slave answers in order). Not answered: a unit known to
// answer probes stays out of step and requests to it fail unsent until it
// answers one; any other unit is trusted again after a second quarantine,
// the line having been watched for at least timeout_ms + silence_ms since
// anything was sent to it.
func (t *rtuTransport) resync(id byte, u *lineUnit) error {
	if err := t.quarantine(); err != nil {
		return err
	}
	sent := time.Now()
	answered, err := t.probe(id, u)
	if err != nil {
		return err
	}
	if answered {
		u.probed, u.unsynced, u.unansweredAt = true, false, time.Time{} // in order: every earlier probe is answered too
		return nil
	}
	u.unansweredAt = sent
	t.dirty = true
	if u.probed {
		return notSent("unit %d has not answered a probe since its last failure; a reply it owes may still come: %w", id, errOutOfStep)
	}
	if err := t.quarantine(); err != nil {
		return err
	}
	u.unsynced = false
	return nil
}

// probe sends function 8 sub-function 0 with the next sequence number and
// waits out its timeout for an answer to a probe sent after the unit's
// last real request: an echo of such a sequence number, or an exception to
// function 8 (a unit without diagnostics answers 0x88 01). Anything else
// arriving meanwhile (a late reply, noise) is discarded.
func (t *rtuTransport) probe(id byte, u *lineUnit) (bool, error) {
	t.seq++
	seq := t.seq
	req := appendCRC([]byte{id, 8, 0, 0, byte(seq >> 8), byte(seq)})
	if err := t.write(req); err != nil {
		return false, &errNotSent{err: err}
	}
	t.st.probes.Add(1)
	deadline := time.Now().Add(t.timeout + t.wire(2*len(req)))
	for time.Now().Before(deadline) {
		got, err := t.readFrame(deadline, false, func(got []byte) (int, error) { return probeReplyLen(id, got) })
		switch {
		case err == nil && got[1] == 0x88:
			u.probed = true
			if u.staleProbeAt.IsZero() || time.Since(u.staleProbeAt) >= 2*(t.timeout+t.silence) {
				return true, nil
			}
			// perhaps the answer to a probe older than the last request (see lineUnit)
		case err == nil:
			u.probed = true
			echo := uint16(got[4])<<8 | uint16(got[5])
			if got[2] == 0 && got[3] == 0 && echo-u.lastSeq-1 < seq-u.lastSeq {
				return true, nil
			}
			// an older probe's echo: ours may follow
		case isTimeout(err):
			return false, nil
		case isIOError(err):
			return false, &errNotSent{err: err}
		default:
			// A stray (a late reply, noise): discard it, keep listening.
			t.st.strays.Add(1)
			n, _, derr := t.drain(t.gap, t.lastRx)
			if derr != nil {
				return false, &errNotSent{err: derr}
			}
			t.st.discarded.Add(int64(len(got) + n))
			if len(got) > 0 {
				t.suspect(got[0])
			}
		}
	}
	return false, nil
}

// quarantine discards input until the line has been silent for silence_ms,
// counted from the last byte seen (and at least from now).
func (t *rtuTransport) quarantine() error {
	n, _, err := t.drain(t.silence, time.Now())
	t.st.flushes.Add(1)
	t.st.discarded.Add(int64(n))
	if err != nil {
		return &errNotSent{err: err}
	}
	t.dirty = false
	return nil
}

// drain reads and discards input until none has arrived for quiet, counted
// from since or the last byte it reads; it returns how many bytes it threw
// away and the first of them.
func (t *rtuTransport) drain(quiet time.Duration, since time.Time) (int, byte, error) {
	start := time.Now()
	last, total, first := since, 0, byte(0)
	for {
		select {
		case <-t.stop:
			return total, first, errors.New("bus closed")
		default:
		}
		n, err := t.read()
		now := time.Now()
		switch {
		case err != nil:
			t.dirty = true
			return total, first, err
		case n == 0:
			if now.Sub(last) >= quiet {
				return total, first, nil
			}
		default:
			if total == 0 {
				first = t.rd[0]
			}
			total += n
			last = now
			t.noteProbeAnswers(t.rd[:n])
		}
		if now.Sub(start) > t.maxFlush() {
			t.dirty = true
			return total, first, fmt.Errorf("serial line %s did not go quiet for %v within %v (another master or noise on the line?)", t.cfg.Address, quiet, t.maxFlush())
		}
	}
}

// noteProbeAnswers marks the units whose answer to a probe is among
// discarded bytes: they answer probes, so they are held to proofs from
// now on. (A frame split across two reads is missed; that only delays
// the lesson.)
func (t *rtuTransport) noteProbeAnswers(b []byte) {
	for i := 0; i+rtuExceptionLen <= len(b); i++ {
		switch {
		case b[i+1] == 8 && i+8 <= len(b) && crcOK(b[i:i+8]),
			b[i+1] == 0x88 && crcOK(b[i:i+rtuExceptionLen]):
			if u := t.units[b[i]]; u != nil {
				u.probed = true
			}
		}
	}
}

// isIOError reports an error of the port itself (the transport has closed it).
func isIOError(err error) bool {
	var fe *frameError
	return !errors.As(err, &fe) && !isTimeout(err)
}

// yield lets other goroutines run between two polls of the port.
// goburrow/serial waits in select(2), a plain blocking syscall that keeps
// this goroutine's P for the whole tick; on a single-core gateway
// (GOMAXPROCS=1) back-to-back polls would otherwise leave the rest of the
// daemon (including a slave on a pty in tests) only what the runtime's
// sysmon takes back.
func yield() { runtime.Gosched() }
