// Package modbustest provides Modbus peers for tests and the example
// simulator: Bank, an in-memory multi-unit device that counts every request;
// a Modbus TCP server on github.com/simonvetter/modbus serving a Bank; and
// an RTU slave that answers on a serial line (a pty in tests).
//
// The peers are independent of the driver's code (own framing, own CRC), so
// a test against them checks the driver against Modbus, not against itself.
package modbustest

import (
	"encoding/binary"
	"fmt"
	"sync"
	"time"
)

// Table is one of the four Modbus data tables.
type Table uint8

// Tables.
const (
	Coils Table = iota + 1
	DiscreteInputs
	InputRegisters
	HoldingRegisters
)

func (t Table) String() string {
	switch t {
	case Coils:
		return "coils"
	case DiscreteInputs:
		return "discrete inputs"
	case InputRegisters:
		return "input registers"
	case HoldingRegisters:
		return "holding registers"
	}
	return fmt.Sprintf("Table(%d)", uint8(t))
}

// Exception is a Modbus exception code; a fault hook returns one to make
// the bank answer with it.
type Exception byte

// Exception codes.
const (
	IllegalFunction    Exception = 1
	IllegalDataAddress Exception = 2
	IllegalDataValue   Exception = 3
	DeviceFailure      Exception = 4
	DeviceBusy         Exception = 6
	GatewayNoResponse  Exception = 11
)

func (e Exception) Error() string { return fmt.Sprintf("modbus exception %d", byte(e)) }

// Request is one request as the bank saw it.
type Request struct {
	Unit     byte
	Function byte
	Table    Table
	Addr     uint16
	Qty      uint16
	Write    bool
	Regs     []uint16 // values written (holding registers)
	Bits     []bool   // values written (coils)
}

type unitData struct {
	coils, discrete map[uint16]bool
	input, holding  map[uint16]uint16
}

type holeKey struct {
	unit  byte
	table Table
	addr  uint16
}

// Bank is an in-memory Modbus device with any number of units. Addresses
// 0..Size-1 exist in every table of every unit (reading them before a Set
// gives 0); others, and holes, draw an illegal data address exception. It
// is safe for concurrent use.
type Bank struct {
	Size int

	mu     sync.Mutex
	units  map[byte]*unitData
	holes  map[holeKey]bool
	absent map[byte]bool
	log    []Request
	delay  func(Request) time.Duration
	fault  func(Request) error
	mirror []Mirror
	ident  map[byte][]string
}

// SetIdent gives a unit a device identification (function 43 / MEI 14,
// answered over RTU): objects 0, 1, 2, ... in order (VendorName,
// ProductCode, MajorMinorRevision, VendorUrl, ProductName, ModelName,
// UserApplicationName). A unit without one answers illegal function.
func (b *Bank) SetIdent(unit byte, objects ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ident == nil {
		b.ident = map[byte][]string{}
	}
	b.ident[unit] = objects
}

// handleIdent answers function 43 / MEI 14 (read device identification):
// read codes 1 (basic, objects 0..2), 2 (regular, 0..6) and 4 (one object),
// in one reply (no "more follows").
func (b *Bank) handleIdent(unit byte, data []byte) ([]byte, bool) {
	exc := func(e Exception) ([]byte, bool) { return []byte{43 | 0x80, byte(e)}, true }
	_, answers, err := b.begin(Request{Unit: unit, Function: 43})
	if !answers {
		return nil, false
	}
	if err != nil {
		if e, ok := err.(Exception); ok {
			return exc(e)
		}
		return exc(DeviceFailure)
	}
	b.mu.Lock()
	objs := b.ident[unit]
	b.mu.Unlock()
	if objs == nil {
		return exc(IllegalFunction)
	}
	if len(data) != 3 || data[0] != 14 {
		return exc(IllegalDataValue)
	}
	code, first := data[1], int(data[2])
	last := 0
	switch code {
	case 1:
		last = 2
	case 2:
		last = 6
	case 4:
		last = first
	default:
		return exc(IllegalDataValue)
	}
	if first >= len(objs) {
		return exc(IllegalDataAddress)
	}
	last = min(last, len(objs)-1)
	out := []byte{43, 14, code, code, 0, 0, 0}
	for id := first; id <= last; id++ {
		out = append(out, byte(id), byte(len(objs[id])))
		out = append(out, objs[id]...)
		out[6]++
	}
	return out, true
}

// Mirror makes the bank reflect writes at another address, the way real
// devices show a command: a coil command in a status discrete input, a
// setpoint in an "active setpoint" register. A write to any of the N
// addresses from From/FromAddr on stores the same values (bits negated
// with Invert) at To/ToAddr on. Bits mirror to bits, registers to
// registers.
type Mirror struct {
	Unit     byte
	From     Table
	FromAddr uint16
	To       Table
	ToAddr   uint16
	N        int
	Invert   bool
}

// AddMirror adds a reflection of writes (see Mirror).
func (b *Bank) AddMirror(m Mirror) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mirror = append(b.mirror, m)
}

// StopMirrors removes every reflection: the status points stop following
// the commands, like a stuck actuator or a device in local override.
func (b *Bank) StopMirrors() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mirror = nil
}

// reflect applies the mirrors to a write of r (b.mu held).
func (b *Bank) reflect(r Request, regArgs []uint16, bitArgs []bool) {
	for _, m := range b.mirror {
		if m.Unit != r.Unit || m.From != r.Table {
			continue
		}
		d := b.unit(m.Unit)
		for i := range max(len(regArgs), len(bitArgs)) {
			a := int(r.Addr) + i
			if a < int(m.FromAddr) || a >= int(m.FromAddr)+m.N {
				continue
			}
			to := m.ToAddr + uint16(a-int(m.FromAddr))
			switch m.To {
			case Coils, DiscreteInputs:
				if i < len(bitArgs) {
					t := d.coils
					if m.To == DiscreteInputs {
						t = d.discrete
					}
					t[to] = bitArgs[i] != m.Invert
				}
			default:
				if i < len(regArgs) {
					t := d.holding
					if m.To == InputRegisters {
						t = d.input
					}
					t[to] = regArgs[i]
				}
			}
		}
	}
}

// NewBank returns a bank whose tables have size addresses each.
func NewBank(size int) *Bank {
	return &Bank{Size: size, units: map[byte]*unitData{}, holes: map[holeKey]bool{}, absent: map[byte]bool{}}
}

func (b *Bank) unit(u byte) *unitData {
	d := b.units[u]
	if d == nil {
		d = &unitData{coils: map[uint16]bool{}, discrete: map[uint16]bool{}, input: map[uint16]uint16{}, holding: map[uint16]uint16{}}
		b.units[u] = d
	}
	return d
}

// SetHolding stores holding registers from addr on.
func (b *Bank) SetHolding(unit byte, addr uint16, v ...uint16) {
	b.setRegs(unit, HoldingRegisters, addr, v)
}

// SetInput stores input registers from addr on.
func (b *Bank) SetInput(unit byte, addr uint16, v ...uint16) {
	b.setRegs(unit, InputRegisters, addr, v)
}

// SetCoil stores coils from addr on.
func (b *Bank) SetCoil(unit byte, addr uint16, v ...bool) { b.setBits(unit, Coils, addr, v) }

// SetDiscrete stores discrete inputs from addr on.
func (b *Bank) SetDiscrete(unit byte, addr uint16, v ...bool) {
	b.setBits(unit, DiscreteInputs, addr, v)
}

func (b *Bank) setRegs(unit byte, t Table, addr uint16, v []uint16) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.unit(unit).holding
	if t == InputRegisters {
		m = b.unit(unit).input
	}
	for i, x := range v {
		m[addr+uint16(i)] = x
	}
}

func (b *Bank) setBits(unit byte, t Table, addr uint16, v []bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.unit(unit).coils
	if t == DiscreteInputs {
		m = b.unit(unit).discrete
	}
	for i, x := range v {
		m[addr+uint16(i)] = x
	}
}

// Holding returns n holding registers from addr.
func (b *Bank) Holding(unit byte, addr uint16, n int) []uint16 {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]uint16, n)
	for i := range out {
		out[i] = b.unit(unit).holding[addr+uint16(i)]
	}
	return out
}

// Coil returns one coil.
func (b *Bank) Coil(unit byte, addr uint16) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.unit(unit).coils[addr]
}

// Discrete returns one discrete input.
func (b *Bank) Discrete(unit byte, addr uint16) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.unit(unit).discrete[addr]
}

// Hole makes one address of a table refuse access (illegal data address),
// like the unimplemented registers between a device's register blocks.
func (b *Bank) Hole(unit byte, t Table, addr uint16) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holes[holeKey{unit, t, addr}] = true
}

// Absent makes a unit not answer at all (RTU: silence; TCP: gateway
// target failed to respond).
func (b *Bank) Absent(unit byte, absent bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.absent[unit] = absent
}

// SetDelay makes the bank wait before answering (nil: no delay).
func (b *Bank) SetDelay(f func(Request) time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.delay = f
}

// SetFault lets a test refuse requests: return an Exception (or nil).
func (b *Bank) SetFault(f func(Request) error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fault = f
}

// Requests returns every request seen so far, in order.
func (b *Bank) Requests() []Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Request(nil), b.log...)
}

// Count is the number of requests seen so far.
func (b *Bank) Count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.log)
}

// ResetCount forgets the requests seen so far.
func (b *Bank) ResetCount() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.log = nil
}

// begin logs r and applies the test hooks: it returns the delay to wait,
// whether the unit answers at all, and an error to answer with. The hooks
// run without the bank's lock, so they may block or call the bank.
func (b *Bank) begin(r Request) (time.Duration, bool, error) {
	b.mu.Lock()
	b.log = append(b.log, r)
	absent, delay, fault := b.absent[r.Unit], b.delay, b.fault
	b.mu.Unlock()
	if absent {
		return 0, false, nil
	}
	var d time.Duration
	if delay != nil {
		d = delay(r)
	}
	if fault != nil {
		if err := fault(r); err != nil {
			return d, true, err
		}
	}
	return d, true, nil
}

func (b *Bank) check(r Request) error {
	if int(r.Addr)+int(r.Qty) > b.Size || r.Qty == 0 {
		return IllegalDataAddress
	}
	for i := 0; i < int(r.Qty); i++ {
		if b.holes[holeKey{r.Unit, r.Table, r.Addr + uint16(i)}] {
			return IllegalDataAddress
		}
	}
	return nil
}

// Access performs a request on the bank's data (after the hooks): reads
// return values, writes store args. It is the one place the tables are
// touched, shared by every peer.
func (b *Bank) Access(r Request, regArgs []uint16, bitArgs []bool) ([]uint16, []bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(r); err != nil {
		return nil, nil, err
	}
	d := b.unit(r.Unit)
	switch r.Table {
	case Coils, DiscreteInputs:
		m := d.coils
		if r.Table == DiscreteInputs {
			m = d.discrete
		}
		if r.Write {
			for i, v := range bitArgs {
				m[r.Addr+uint16(i)] = v
			}
			b.reflect(r, nil, bitArgs)
			return nil, nil, nil
		}
		out := make([]bool, r.Qty)
		for i := range out {
			out[i] = m[r.Addr+uint16(i)]
		}
		return nil, out, nil
	default:
		m := d.holding
		if r.Table == InputRegisters {
			m = d.input
		}
		if r.Write {
			for i, v := range regArgs {
				m[r.Addr+uint16(i)] = v
			}
			b.reflect(r, regArgs, nil)
			return nil, nil, nil
		}
		out := make([]uint16, r.Qty)
		for i := range out {
			out[i] = m[r.Addr+uint16(i)]
		}
		return out, nil, nil
	}
}

// HandlePDU answers one request PDU (function code and data) for unit; ok
// is false when the unit does not answer. Malformed requests draw an
// illegal data value exception, unknown functions illegal function.
func (b *Bank) HandlePDU(unit byte, pdu []byte) (resp []byte, ok bool) {
	if len(pdu) < 1 {
		return nil, false
	}
	fc := pdu[0]
	exc := func(e Exception) ([]byte, bool) { return []byte{fc | 0x80, byte(e)}, true }
	data := pdu[1:]
	if fc == 43 {
		return b.handleIdent(unit, data)
	}
	if len(data) < 4 {
		return exc(IllegalDataValue)
	}
	addr, qty := binary.BigEndian.Uint16(data), binary.BigEndian.Uint16(data[2:])
	r := Request{Unit: unit, Function: fc, Addr: addr, Qty: qty}
	var regArgs []uint16
	var bitArgs []bool
	switch fc {
	case 1:
		r.Table = Coils
	case 2:
		r.Table = DiscreteInputs
	case 3:
		r.Table = HoldingRegisters
	case 4:
		r.Table = InputRegisters
	case 5:
		r.Table, r.Write, r.Qty = Coils, true, 1
		if qty != 0xFF00 && qty != 0 {
			return exc(IllegalDataValue)
		}
		bitArgs = []bool{qty == 0xFF00}
	case 6:
		r.Table, r.Write, r.Qty = HoldingRegisters, true, 1
		regArgs = []uint16{qty}
	case 15, 16:
		r.Table, r.Write = Coils, true
		if fc == 16 {
			r.Table = HoldingRegisters
		}
		if len(data) < 5 || int(data[4]) != len(data)-5 {
			return exc(IllegalDataValue)
		}
		vals := data[5:]
		if fc == 15 {
			if int(qty) > 8*len(vals) || qty == 0 {
				return exc(IllegalDataValue)
			}
			for i := 0; i < int(qty); i++ {
				bitArgs = append(bitArgs, vals[i/8]>>(i%8)&1 == 1)
			}
		} else {
			if int(qty)*2 != len(vals) || qty == 0 {
				return exc(IllegalDataValue)
			}
			for i := 0; i < int(qty); i++ {
				regArgs = append(regArgs, binary.BigEndian.Uint16(vals[2*i:]))
			}
		}
	default:
		b.begin(Request{Unit: unit, Function: fc})
		return exc(IllegalFunction)
	}
	if !r.Write && (qty == 0 || (r.Table <= DiscreteInputs && qty > 2000) || (r.Table > DiscreteInputs && qty > 125)) {
		b.begin(r)
		return exc(IllegalDataValue)
	}
	r.Regs, r.Bits = regArgs, bitArgs
	d, answers, err := b.begin(r)
	if !answers {
		return nil, false
	}
	time.Sleep(d)
	if err == nil {
		var regs []uint16
		var bits []bool
		regs, bits, err = b.Access(r, regArgs, bitArgs)
		if err == nil {
			switch {
			case r.Write:
				return append([]byte{fc}, data[:4]...), true
			case bits != nil:
				packed := make([]byte, (len(bits)+7)/8)
				for i, v := range bits {
					if v {
						packed[i/8] |= 1 << (i % 8)
					}
				}
				return append([]byte{fc, byte(len(packed))}, packed...), true
			default:
				out := []byte{fc, byte(2 * len(regs))}
				for _, v := range regs {
					out = binary.BigEndian.AppendUint16(out, v)
				}
				return out, true
			}
		}
	}
	if e, isExc := err.(Exception); isExc {
		return exc(e)
	}
	return exc(DeviceFailure)
}
