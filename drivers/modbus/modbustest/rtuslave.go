package modbustest

import (
	"io"
	"sync"
	"time"
)

// Diagnostics is how an RTU slave answers function 8 sub-function 0
// (return query data), which masters use to re-synchronise a line.
type Diagnostics uint8

// Ways to answer function 8.
const (
	DiagEcho      Diagnostics = iota // echo the request, as the spec says
	DiagException                    // exception 01, illegal function (e.g. libmodbus)
	DiagSilent                       // no answer at all (non-compliant, but seen)
)

// Fault is what the slave does to one request (SetFault).
type Fault struct {
	Delay time.Duration // answer this much later (the slave is busy meanwhile)
	Drop  bool          // do not answer
	Stray []byte        // write these bytes on the line before the reply (noise, another device)
}

// RTUSlave answers Modbus RTU requests read from a serial line (the master
// side of a pty in tests) for some units of a Bank. Like a real slave it
// handles one request at a time: while it waits out a Bank delay, later
// requests sit in the line's buffer.
type RTUSlave struct {
	rw    io.ReadWriter
	bank  *Bank
	units map[byte]bool
	done  chan struct{}

	mu        sync.Mutex
	mangle    func(reply []byte) []byte
	fault     func(n int, r Request) Fault
	diag      Diagnostics
	dropBusy  bool
	seen      int // request frames with a good CRC
	badCRC    int
	replies   int
	overlaps  int
	dropped   int
	probes    int
	busy      bool
	writeLock sync.Mutex
}

// ServeRTU starts a slave for units (all units when none are given). It
// stops when reading rw fails (close the pty master).
func ServeRTU(rw io.ReadWriter, bank *Bank, units ...byte) *RTUSlave {
	s := &RTUSlave{rw: rw, bank: bank, units: map[byte]bool{}, done: make(chan struct{})}
	for _, u := range units {
		s.units[u] = true
	}
	go s.run()
	return s
}

// Done is closed when the slave has stopped.
func (s *RTUSlave) Done() <-chan struct{} { return s.done }

// SetMangle lets a test alter reply frames (CRC included) before they are
// written; nil restores them.
func (s *RTUSlave) SetMangle(f func(reply []byte) []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mangle = f
}

// SetFault lets a test delay, drop or precede with stray bytes the reply
// to request number n (1-based, every request frame for every unit, probes
// included); nil restores normal service.
func (s *RTUSlave) SetFault(f func(n int, r Request) Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = f
}

// SetDiagnostics sets how function 8 is answered (DiagEcho by default).
func (s *RTUSlave) SetDiagnostics(d Diagnostics) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.diag = d
}

// SetDropWhileBusy makes the slave ignore requests that arrive while it is
// still answering one (a slave with a single frame buffer) instead of
// answering them in turn afterwards.
func (s *RTUSlave) SetDropWhileBusy(v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropBusy = v
}

// Inject writes bytes on the line now: noise, or another device talking.
func (s *RTUSlave) Inject(b []byte) {
	s.writeLock.Lock()
	defer s.writeLock.Unlock()
	_, _ = s.rw.Write(b)
}

// Probes is the number of function 8 requests seen.
func (s *RTUSlave) Probes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.probes
}

// Dropped is the number of requests not answered (Fault.Drop, or ignored
// while busy).
func (s *RTUSlave) Dropped() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// Overlaps counts requests that arrived before the slave had answered the
// previous one: a master that serialises its line strictly never causes
// one (unless it gives up on a slow reply and moves on).
func (s *RTUSlave) Overlaps() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.overlaps
}

// Replies is the number of replies written.
func (s *RTUSlave) Replies() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replies
}

// BadCRC is the number of request frames dropped for a bad CRC.
func (s *RTUSlave) BadCRC() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.badCRC
}

func (s *RTUSlave) run() {
	defer close(s.done)
	// A reader goroutine hands bytes over as they arrive, so a request that
	// comes in while the previous one is being answered is noticed (busy).
	type chunk struct {
		b    []byte
		drop bool // arrived while busy, and the slave drops such requests
	}
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		for {
			rd := make([]byte, 512)
			n, err := s.rw.Read(rd)
			if err != nil {
				return
			}
			s.mu.Lock()
			if s.busy {
				s.overlaps++
			}
			drop := s.busy && s.dropBusy
			s.mu.Unlock()
			chunks <- chunk{rd[:n], drop}
		}
	}()
	var buf []byte
	for c := range chunks {
		if c.drop {
			s.mu.Lock()
			s.dropped++
			s.mu.Unlock()
			buf = nil
			continue
		}
		buf = append(buf, c.b...)
		for {
			l := requestLen(buf)
			if l == 0 || len(buf) < l {
				break
			}
			frame := buf[:l]
			buf = buf[l:]
			if crc(frame[:l-2]) != uint16(frame[l-2])|uint16(frame[l-1])<<8 {
				// A real slave would resynchronise on line silence; here the
				// rest of the buffer is dropped with the frame.
				s.mu.Lock()
				s.badCRC++
				s.mu.Unlock()
				buf = nil
				break
			}
			s.answer(frame)
		}
		if len(buf) > 512 {
			buf = nil
		}
	}
}

func (s *RTUSlave) answer(frame []byte) {
	unit := frame[0]
	if len(s.units) > 0 && !s.units[unit] {
		return // not ours: silence, as on a multi-drop line
	}
	s.mu.Lock()
	s.seen++
	n, fault, diag := s.seen, s.fault, s.diag
	if frame[1] == 8 {
		s.probes++
	}
	s.mu.Unlock()
	// busy covers the time from the request to the start of the reply: a
	// master that waits for replies cannot send in it.
	s.setBusy(true)
	var pdu []byte
	ok := true
	if frame[1] == 8 {
		switch diag {
		case DiagEcho:
			pdu = append([]byte(nil), frame[1:len(frame)-2]...)
		case DiagException:
			pdu = []byte{0x88, byte(IllegalFunction)}
		default:
			ok = false
		}
	} else {
		pdu, ok = s.bank.HandlePDU(unit, frame[1:len(frame)-2])
	}
	var f Fault
	if fault != nil && ok {
		f = fault(n, requestOf(frame)) // a frame it ignores costs it no time
	}
	time.Sleep(f.Delay)
	s.setBusy(false)
	if !ok || f.Drop {
		if f.Drop {
			s.mu.Lock()
			s.dropped++
			s.mu.Unlock()
		}
		return
	}
	reply := append([]byte{unit}, pdu...)
	c := crc(reply)
	reply = append(reply, byte(c), byte(c>>8))
	s.mu.Lock()
	mangle := s.mangle
	s.replies++
	s.mu.Unlock()
	if mangle != nil {
		reply = mangle(reply)
	}
	s.writeLock.Lock()
	defer s.writeLock.Unlock()
	if len(f.Stray) > 0 {
		_, _ = s.rw.Write(f.Stray)
	}
	_, _ = s.rw.Write(reply)
}

// requestOf describes a request frame for a fault hook (without reading
// or changing the bank).
func requestOf(frame []byte) Request {
	r := Request{Unit: frame[0], Function: frame[1]}
	if len(frame) >= 8 {
		r.Addr = uint16(frame[2])<<8 | uint16(frame[3])
		r.Qty = uint16(frame[4])<<8 | uint16(frame[5])
	}
	switch r.Function {
	case 1, 5, 15:
		r.Table = Coils
	case 2:
		r.Table = DiscreteInputs
	case 3, 6, 16:
		r.Table = HoldingRegisters
	case 4:
		r.Table = InputRegisters
	}
	r.Write = r.Function == 5 || r.Function == 6 || r.Function == 15 || r.Function == 16
	if r.Function == 5 || r.Function == 6 {
		r.Qty = 1
	}
	return r
}

func (s *RTUSlave) setBusy(b bool) {
	s.mu.Lock()
	s.busy = b
	s.mu.Unlock()
}

// requestLen is the length of the request frame at the head of b, or 0
// when more bytes are needed to tell. Unknown functions are taken as
// 8-byte frames (they then draw an illegal function exception).
func requestLen(b []byte) int {
	if len(b) < 2 {
		return 0
	}
	switch b[1] {
	case 43:
		return 7 // unit, 43, MEI type, read code, object id, CRC
	case 15, 16:
		if len(b) < 7 {
			return 0
		}
		return 7 + int(b[6]) + 2
	}
	return 8
}

// crc is the Modbus CRC-16, written here independently of the driver's.
func crc(b []byte) uint16 {
	c := uint16(0xFFFF)
	for _, x := range b {
		c ^= uint16(x)
		for i := 0; i < 8; i++ {
			lsb := c & 1
			c >>= 1
			if lsb == 1 {
				c ^= 0xA001
			}
		}
	}
	return c
}

// CRC exposes the CRC for tests that build frames by hand.
func CRC(b []byte) uint16 { return crc(b) }
