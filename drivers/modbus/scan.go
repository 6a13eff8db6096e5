package modbus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	gb "github.com/goburrow/modbus"
	"github.com/goburrow/serial"
)

// Scanning (physd scan modbus): find the units that answer on an endpoint,
// read their device identification (function 43 / MEI 14) and find the
// readable ranges of each table. A scan only ever sends read requests
// (functions 1, 2, 3, 4 and 43); it never writes.
//
// The scan owns its link the way the bus worker does (one goroutine, the
// same TCP and RTU transports, so the same line discipline), but it is
// cheaper on absent units: a unit that never answered is only quarantined
// after its timeout (silence_ms), never probed, so a sweep costs about
// timeout + silence per absent unit.

// ScanOptions configure Scan.
type ScanOptions struct {
	TCP      string        // host:port of a Modbus TCP endpoint; or
	Serial   serial.Config // a Modbus RTU line (Serial.Address is the port)
	Units    []byte        // unit ids to try, in order
	Timeout  time.Duration // the wait for one reply
	Silence  time.Duration // RTU: quiet line required after a timeout or a garbled reply
	MaxTime  time.Duration // bound on the whole scan; units not reached are reported as skipped
	From, To uint16        // the addresses probed in every table (inclusive)
	Chunk    int           // registers per probe read (bits: 4 × Chunk)
	Progress io.Writer     // one line per unit; nil: none
}

// IdentObject is one object of a device identification (function 43/14).
type IdentObject struct {
	ID    byte
	Name  string // VendorName, ProductCode, ... (the spec's names for 0..6)
	Value string
}

// Block is a run of readable addresses of one table, with the values read.
type Block struct {
	Table string // coil, discrete, input, holding
	Start uint16
	Regs  []uint16 // input and holding registers
	Bits  []bool   // coils and discrete inputs
}

// Len is the number of addresses in the block.
func (b Block) Len() int { return max(len(b.Regs), len(b.Bits)) }

// Ref names the block's first address in both notations: "holding 40001 (address 0)".
func (b Block) Ref() string { return ref(tableNames[b.Table], b.Start) }

// ScannedUnit is what a scan learnt about one unit.
type ScannedUnit struct {
	ID        byte
	Ident     []IdentObject
	IdentNote string // why there is no identification (e.g. "not supported (illegal function)")
	Blocks    []Block
	Notes     []string // tables refused, timeouts, garbled replies
}

// ScanReport is the result of Scan.
type ScanReport struct {
	Kind     string // TypeTCP or TypeRTU
	Endpoint string
	Units    []ScannedUnit
	Tried    int      // units asked
	Skipped  []byte   // units not reached within MaxTime
	Notes    []string // about the endpoint
	Requests int
	Elapsed  time.Duration
	Options  ScanOptions // as used, defaults filled in
}

// identNames are the standard object names of function 43/14 (objects 0..6).
var identNames = []string{"VendorName", "ProductCode", "MajorMinorRevision", "VendorUrl", "ProductName", "ModelName", "UserApplicationName"}

// scanner runs one scan.
type scanner struct {
	o        ScanOptions
	l        link
	st       counters
	stop     chan struct{}
	deadline time.Time
	ctx      context.Context
	requests int
}

var errScanTime = errors.New("scan time is up")

// Scan sweeps the units of opts on one endpoint. It errors only when the
// endpoint itself cannot be used (a serial port that does not open, a TCP
// endpoint that refuses connections); units that do not answer are simply
// not in the report.
func Scan(ctx context.Context, o ScanOptions) (*ScanReport, error) {
	if o.Timeout <= 0 {
		o.Timeout = 500 * time.Millisecond
	}
	if o.Silence <= 0 {
		o.Silence = min(o.Timeout, 100*time.Millisecond)
	}
	if o.Chunk <= 0 {
		o.Chunk = 16
	}
	o.Chunk = min(o.Chunk, 125)
	if o.To < o.From {
		return nil, fmt.Errorf("address range %d-%d is empty", o.From, o.To)
	}
	s := &scanner{o: o, stop: make(chan struct{}), ctx: ctx}
	defer close(s.stop)
	rep := &ScanReport{Options: o}
	if o.TCP != "" {
		rep.Kind, rep.Endpoint = TypeTCP, o.TCP
		s.l = newTCPLink(o.TCP, o.Timeout, &s.st)
	} else {
		rep.Kind, rep.Endpoint = TypeRTU, o.Serial.Address
		s.l = newRTULink(o.Serial, o.Timeout, o.Silence, &s.st, s.stop)
	}
	defer s.l.close()
	start := time.Now()
	if o.MaxTime > 0 {
		s.deadline = start.Add(o.MaxTime)
	}
	if err := s.l.open(); err != nil {
		return nil, fmt.Errorf("%s %s: %w", rep.Kind, rep.Endpoint, err)
	}
	for i, id := range o.Units {
		if s.timeUp() {
			rep.Skipped = append(rep.Skipped, o.Units[i:]...)
			break
		}
		rep.Tried++
		present, note, err := s.present(id)
		if err != nil && !errors.Is(err, errScanTime) {
			rep.Notes = append(rep.Notes, fmt.Sprintf("unit %d: %v", id, err))
		}
		if !present {
			if note != "" {
				rep.Notes = append(rep.Notes, fmt.Sprintf("unit %d: %s", id, note))
			}
			continue
		}
		u := ScannedUnit{ID: id}
		if note != "" {
			u.Notes = append(u.Notes, note)
		}
		s.identify(&u)
		for _, t := range []table{tableHolding, tableInput, tableCoil, tableDiscrete} {
			s.probeTable(&u, t)
		}
		rep.Units = append(rep.Units, u)
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "unit %d answers: %s; %d readable blocks\n", id, identLine(u), len(u.Blocks))
		}
	}
	rep.Requests, rep.Elapsed = s.requests, time.Since(start)
	return rep, nil
}

// identLine is a one-line summary of a unit's identification.
func identLine(u ScannedUnit) string {
	if len(u.Ident) == 0 {
		if u.IdentNote != "" {
			return "no identification (" + u.IdentNote + ")"
		}
		return "no identification"
	}
	s := ""
	for i, o := range u.Ident {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s %q", o.Name, o.Value)
	}
	return s
}

func (s *scanner) timeUp() bool {
	if s.ctx.Err() != nil {
		return true
	}
	return !s.deadline.IsZero() && time.Now().After(s.deadline)
}

// exceptionOf returns the exception code of a Modbus exception reply, or 0.
func exceptionOf(err error) byte {
	var me *gb.ModbusError
	if errors.As(err, &me) {
		return me.ExceptionCode
	}
	return 0
}

// failed recovers the link after an error that is not an exception. A
// known unit gets the full line discipline (probe and quarantine); a unit
// that has never answered (sweep) only a quarantine.
func (s *scanner) failed(unit byte, err error, known bool) {
	if exceptionOf(err) != 0 {
		return
	}
	s.l.broken(err)
	if rl, ok := s.l.(*rtuLink); ok && !known {
		delete(rl.t.units, unit) // nothing is owed by a unit that never answered
		_ = rl.t.quarantine()
		return
	}
	s.l.settle()
}

// read sends one read request.
func (s *scanner) read(unit byte, t table, addr uint16, qty int, known bool) ([]uint16, []bool, error) {
	if s.timeUp() {
		return nil, nil, errScanTime
	}
	if err := s.l.open(); err != nil {
		return nil, nil, err
	}
	s.requests++
	c := s.l.client(unit, s.o.Timeout)
	var b []byte
	var err error
	switch t {
	case tableCoil:
		b, err = c.ReadCoils(addr, uint16(qty))
	case tableDiscrete:
		b, err = c.ReadDiscreteInputs(addr, uint16(qty))
	case tableInput:
		b, err = c.ReadInputRegisters(addr, uint16(qty))
	default:
		b, err = c.ReadHoldingRegisters(addr, uint16(qty))
	}
	if err != nil {
		s.failed(unit, err, known)
		return nil, nil, err
	}
	if t.isBit() {
		if len(b)*8 < qty {
			return nil, nil, fmt.Errorf("reply carries %d bytes for %d bits", len(b), qty)
		}
		bits := make([]bool, qty)
		for i := range bits {
			bits[i] = b[i/8]>>(i%8)&1 == 1
		}
		return nil, bits, nil
	}
	if len(b) != 2*qty {
		return nil, nil, fmt.Errorf("reply carries %d bytes for %d registers", len(b), qty)
	}
	regs := make([]uint16, qty)
	for i := range regs {
		regs[i] = uint16(b[2*i])<<8 | uint16(b[2*i+1])
	}
	return regs, nil, nil
}

// present asks unit for one holding register: any answer, an exception
// included, proves the unit is there, except the gateway's "no answer"
// exceptions 10 and 11.
func (s *scanner) present(id byte) (bool, string, error) {
	_, _, err := s.read(id, tableHolding, s.o.From, 1, false)
	switch x := exceptionOf(err); {
	case err == nil:
		return true, "", nil
	case x == 10 || x == 11:
		return false, "", nil
	case x != 0:
		return true, "", nil
	case isTimeout(err), errors.Is(err, errScanTime):
		return false, "", err
	}
	var fe *frameError
	if errors.As(err, &fe) {
		// Garbled: noise, or a late reply of another unit. Ask once more
		// after the quarantine.
		_, _, err2 := s.read(id, tableHolding, s.o.From, 1, false)
		if err2 == nil || (exceptionOf(err2) != 0 && exceptionOf(err2) != 10 && exceptionOf(err2) != 11) {
			return true, fmt.Sprintf("first reply garbled (%v)", err), nil
		}
		return false, fmt.Sprintf("garbled reply (%v); check baud, parity and termination", err), nil
	}
	return false, "", err
}

// mei sends one function 43 / MEI 14 request and returns the reply's data.
func (s *scanner) mei(unit byte, code, obj byte) ([]byte, error) {
	if s.timeUp() {
		return nil, errScanTime
	}
	if err := s.l.open(); err != nil {
		return nil, err
	}
	s.requests++
	s.l.client(unit, s.o.Timeout) // sets the unit and the timeout
	var pk gb.Packager
	var tr gb.Transporter
	switch l := s.l.(type) {
	case *tcpLink:
		pk, tr = l.pk, l.t
	case *rtuLink:
		pk, tr = l.pk, l.t
	default:
		return nil, errors.New("device identification is not supported on this link")
	}
	adu, err := pk.Encode(&gb.ProtocolDataUnit{FunctionCode: 43, Data: []byte{14, code, obj}})
	if err == nil {
		var resp []byte
		if resp, err = tr.Send(adu); err == nil {
			if err = pk.Verify(adu, resp); err == nil {
				var pdu *gb.ProtocolDataUnit
				if pdu, err = pk.Decode(resp); err == nil {
					switch {
					case pdu.FunctionCode == 43|0x80 && len(pdu.Data) >= 1:
						return nil, &gb.ModbusError{FunctionCode: pdu.FunctionCode, ExceptionCode: pdu.Data[0]}
					case pdu.FunctionCode != 43:
						err = fmt.Errorf("reply function %d to function 43", pdu.FunctionCode)
					default:
						return pdu.Data, nil
					}
				}
			}
		}
	}
	s.failed(unit, err, true)
	return nil, err
}

// identify reads the regular identification (objects 0..6), falling back
// to the basic one (0..2), following "more follows" for at most 8 replies.
func (s *scanner) identify(u *ScannedUnit) {
	code, obj := byte(2), byte(0)
	seen := map[byte]bool{}
	for range 8 {
		data, err := s.mei(u.ID, code, obj)
		if err != nil {
			switch x := exceptionOf(err); {
			case x == 3 && code == 2 && len(u.Ident) == 0:
				code, obj = 1, 0 // regular identification refused: try basic
				continue
			case x != 0:
				u.IdentNote = "function 43/14 refused: exception " + exceptionName(x)
			default:
				u.IdentNote = err.Error()
			}
			return
		}
		objs, more, next, err := parseIdent(data)
		if err != nil {
			u.IdentNote = err.Error()
			return
		}
		for _, o := range objs {
			if !seen[o.ID] {
				seen[o.ID] = true
				u.Ident = append(u.Ident, o)
			}
		}
		if !more || seen[next] {
			return
		}
		obj = next
	}
}

func exceptionName(x byte) string {
	if c, ok := exceptionCodes[x]; ok {
		return fmt.Sprintf("%d (%s)", x, c[1])
	}
	return fmt.Sprint(x)
}

// parseIdent decodes the data of a function 43/14 reply: MEI type, read
// code, conformity, more follows, next object id, number of objects, then
// the objects (id, length, value).
func parseIdent(d []byte) (objs []IdentObject, more bool, next byte, err error) {
	if len(d) < 6 || d[0] != 14 {
		return nil, false, 0, fmt.Errorf("device identification reply of %d bytes is malformed", len(d))
	}
	more, next = d[3] == 0xFF, d[4]
	n := int(d[5])
	p := 6
	for range n {
		if p+2 > len(d) || p+2+int(d[p+1]) > len(d) {
			return nil, false, 0, errors.New("device identification reply is cut short")
		}
		o := IdentObject{ID: d[p], Value: string(d[p+2 : p+2+int(d[p+1])])}
		if int(o.ID) < len(identNames) {
			o.Name = identNames[o.ID]
		} else {
			o.Name = fmt.Sprintf("Object%d", o.ID)
		}
		objs = append(objs, o)
		p += 2 + int(d[p+1])
	}
	return objs, more, next, nil
}

// probeTable finds the readable ranges of one table in [From, To]: reads
// of Chunk addresses, a chunk refused for its size (exception 3) split in
// halves, and the edges of every readable run narrowed down by bisection
// in the refused chunks beside it, or in a refused chunk whose first or
// last address is readable alone. Runs that touch neither edge of a
// refused chunk are not found (Chunk 1 finds everything, slowly).
func (s *scanner) probeTable(u *ScannedUnit, t table) {
	tp := &tableProbe{s: s, u: u, t: t, regs: map[int]uint16{}, bits: map[int]bool{}}
	for _, c := range tp.sweep() {
		if c.n < 2 || s.timeUp() {
			continue
		}
		tp.narrow(c)
	}
	tp.blocks()
}

// tableProbe is one table of one unit being probed: the values read so
// far, by address.
type tableProbe struct {
	s        *scanner
	u        *ScannedUnit
	t        table
	regs     map[int]uint16
	bits     map[int]bool
	timeouts int // reads in a row without a valid reply
}

// addrRun is a run of n addresses from a.
type addrRun struct{ a, n int }

func (tp *tableProbe) keep(addr int, r []uint16, b []bool) {
	for i, v := range r {
		tp.regs[addr+i] = v
	}
	for i, v := range b {
		tp.bits[addr+i] = v
	}
}

// sweep reads [From, To] chunk by chunk and returns the chunks that were
// refused; it stops early when the table is given up.
func (tp *tableProbe) sweep() (bad []addrRun) {
	chunk := tp.s.o.Chunk
	if tp.t.isBit() {
		chunk *= 4
	}
	from, to := int(tp.s.o.From), int(tp.s.o.To)
	for a := from; a <= to; a += chunk {
		n := min(chunk, to-a+1)
		read, stop := tp.tryRead(a, n)
		if stop {
			break
		}
		if !read {
			bad = append(bad, addrRun{a, n})
		}
	}
	return bad
}

// tryRead reads [a, a+n), halving a range refused for its size; stop
// reports that the table should be given up.
func (tp *tableProbe) tryRead(a, n int) (read bool, stop bool) {
	u, t := tp.u, tp.t
	r, b, err := tp.s.read(u.ID, t, uint16(a), n, true)
	if err == nil {
		tp.keep(a, r, b)
		tp.timeouts = 0
		return true, false
	}
	x := exceptionOf(err)
	switch {
	case errors.Is(err, errScanTime):
		u.Notes = append(u.Notes, fmt.Sprintf("%s: scan time ran out", t))
		return false, true
	case x == 1 && len(tp.regs)+len(tp.bits) == 0:
		u.Notes = append(u.Notes, fmt.Sprintf("%s: function %d refused (illegal function): the unit has no %s table", t, readFunction(t), t))
		return false, true
	case x == 3 && n > 1:
		h := n / 2
		r1, s1 := tp.tryRead(a, h)
		if s1 {
			return false, true
		}
		r2, s2 := tp.tryRead(a+h, n-h)
		return r1 || r2, s2
	case x == 0:
		tp.timeouts++
		if tp.timeouts >= 3 {
			u.Notes = append(u.Notes, fmt.Sprintf("%s: 3 reads in a row got no valid reply (last: %v); the rest of the table was not probed", t, err))
			return false, true
		}
	}
	return false, false
}

func (tp *tableProbe) readable(a int) bool {
	if tp.t.isBit() {
		_, y := tp.bits[a]
		return y
	}
	_, y := tp.regs[a]
	return y
}

// one reads a single address, so that a run which starts or ends at a
// chunk boundary but is shorter than the chunk is found.
func (tp *tableProbe) one(a int) bool {
	r, b, err := tp.s.read(tp.u.ID, tp.t, uint16(a), 1, true)
	if err == nil {
		tp.keep(a, r, b)
	}
	return err == nil
}

// narrow bisects the edges of a refused chunk c: next to a readable
// address (or starting or ending with one), it holds the rest of that run.
func (tp *tableProbe) narrow(c addrRun) {
	s, u, t := tp.s, tp.u, tp.t
	if tp.readable(c.a-1) || tp.one(c.a) { // longest readable prefix: [c.a, c.a+lo)
		lo, hi := 0, c.n
		for hi-lo > 1 {
			mid := (lo + hi) / 2
			if r, b, err := s.read(u.ID, t, uint16(c.a), mid, true); err == nil {
				tp.keep(c.a, r, b)
				lo = mid
			} else {
				hi = mid
			}
		}
	}
	if tp.readable(c.a+c.n) || (!tp.readable(c.a+c.n-1) && tp.one(c.a+c.n-1)) { // shortest readable suffix: [lo+1 .. end)
		end := c.a + c.n
		lo, hi := c.a, end
		for hi-lo > 1 {
			mid := (lo + hi) / 2
			if r, b, err := s.read(u.ID, t, uint16(mid), end-mid, true); err == nil {
				tp.keep(mid, r, b)
				hi = mid
			} else {
				lo = mid
			}
		}
	}
}

// blocks adds the addresses read to the unit as runs of consecutive
// addresses.
func (tp *tableProbe) blocks() {
	u, t := tp.u, tp.t
	var addrs []int
	if t.isBit() {
		for a := range tp.bits {
			addrs = append(addrs, a)
		}
	} else {
		for a := range tp.regs {
			addrs = append(addrs, a)
		}
	}
	sort.Ints(addrs)
	for i, a := range addrs {
		if i == 0 || a != addrs[i-1]+1 {
			u.Blocks = append(u.Blocks, Block{Table: t.String(), Start: uint16(a)})
		}
		b := &u.Blocks[len(u.Blocks)-1]
		if t.isBit() {
			b.Bits = append(b.Bits, tp.bits[a])
		} else {
			b.Regs = append(b.Regs, tp.regs[a])
		}
	}
}

func readFunction(t table) int {
	switch t {
	case tableCoil:
		return 1
	case tableDiscrete:
		return 2
	case tableHolding:
		return 3
	}
	return 4
}
