package modbustest

import (
	"io"
	"sync"
)

// RTUSlave answers Modbus RTU requests read from a serial line (the master
// side of a pty in tests) for some units of a Bank. Like a real slave it
// handles one request at a time: while it waits out a Bank delay, later
// requests sit in the line's buffer.
type RTUSlave struct {
	rw    io.ReadWriter
	bank  *Bank
	units map[byte]bool
	done  chan struct{}

	mu       sync.Mutex
	mangle   func(reply []byte) []byte
	badCRC   int
	replies  int
	overlaps int
	busy     bool
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
	chunks := make(chan []byte, 64)
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
			s.mu.Unlock()
			chunks <- rd[:n]
		}
	}()
	var buf []byte
	for chunk := range chunks {
		buf = append(buf, chunk...)
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
	// busy covers the time from the request to the start of the reply: a
	// master that waits for replies cannot send in it.
	s.setBusy(true)
	pdu, ok := s.bank.HandlePDU(unit, frame[1:len(frame)-2])
	s.setBusy(false)
	if !ok {
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
	_, _ = s.rw.Write(reply)
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
