package modbus

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// table is one of the four Modbus data tables.
type table uint8

const (
	tableCoil     table = iota + 1 // 0xxxx, read/write bits
	tableDiscrete                  // 1xxxx, read-only bits
	tableInput                     // 3xxxx, read-only registers
	tableHolding                   // 4xxxx, read/write registers
)

var tableNames = map[string]table{
	"coil": tableCoil, "coils": tableCoil,
	"discrete": tableDiscrete, "discrete_input": tableDiscrete, "discrete_inputs": tableDiscrete,
	"input": tableInput, "input_register": tableInput, "input_registers": tableInput,
	"holding": tableHolding, "holding_register": tableHolding, "holding_registers": tableHolding,
}

var tableWords = []string{"coil", "discrete", "input", "holding"}

func (t table) String() string {
	if t >= tableCoil && t <= tableHolding {
		return tableWords[t-1]
	}
	return fmt.Sprintf("table(%d)", uint8(t))
}

func (t table) isBit() bool    { return t == tableCoil || t == tableDiscrete }
func (t table) writable() bool { return t == tableCoil || t == tableHolding }

// modicon is the leading digit of the table's Modicon reference.
func (t table) modicon() int {
	switch t {
	case tableDiscrete:
		return 1
	case tableInput:
		return 3
	case tableHolding:
		return 4
	}
	return 0
}

// ref names a register for people in both notations: "holding 40001
// (address 0)"; six-digit Modicon numbers above 9999.
func ref(t table, addr uint16) string {
	if int(addr)+1 <= 9999 {
		return fmt.Sprintf("%s %d%04d (address %d)", t, t.modicon(), int(addr)+1, addr)
	}
	return fmt.Sprintf("%s %d%05d (address %d)", t, t.modicon(), int(addr)+1, addr)
}

// Protocol limits for one request (Modbus application protocol v1.1b3 §6).
const (
	maxReadRegs  = 125
	maxReadBits  = 2000
	maxWriteRegs = 123
	maxWriteBits = 1968
)

func (t table) maxRead() int {
	if t.isBit() {
		return maxReadBits
	}
	return maxReadRegs
}

type opKind uint8

const (
	opRead     opKind = iota + 1
	opWrite           // registers (fc 6 or 16) or coils (fc 5 or 15)
	opWriteBit        // read-modify-write of one bit of a holding register
)

// request is one point's read or write, queued to the bus worker.
type request struct {
	ctx   context.Context
	op    opKind
	unit  byte
	table table
	addr  uint16
	qty   uint16 // registers or bits to read

	// writes
	fc   byte     // 5, 6, 15 or 16
	regs []uint16 // opWrite on holding: wire order
	bits []bool   // opWrite on coil
	bit  uint8    // opWriteBit: bit of the canonical register value
	set  bool     // opWriteBit: the new state
	swap bool     // opWriteBit: the register's bytes are swapped on the wire

	internal bool // the bus's own write (the heartbeat), not a point's: not counted in Writes

	// members, when set, make this a batch: reads queued as one entry
	// (Bus.ReadPoints); the worker runs them as if each had been queued
	// at this place, and answers each on its own done.
	members []*request

	done chan result // buffered (1): the worker never blocks on a gone caller

	// A batch's member is answered through its batch's one channel
	// instead (buffered for every member): the worker stores the result
	// in res and sends the member there.
	batched chan *request
	res     result
	member  int // its place in the batch

	// state settles, for a write whose caller gives up, whether it was
	// sent: the worker takes it just before the wire, the caller abandons
	// it; whoever comes first wins.
	state atomic.Int32
}

const (
	stateQueued int32 = iota
	stateTaken
	stateAbandoned
)

// take claims the request for the wire; false: the caller abandoned it.
func (r *request) take() bool { return r.state.CompareAndSwap(stateQueued, stateTaken) }

// abandon gives the request up; false: it was already taken for the wire.
func (r *request) abandon() bool { return r.state.CompareAndSwap(stateQueued, stateAbandoned) }

// result is what the worker answers.
type result struct {
	regs []uint16
	bits []bool
	at   time.Time
	err  error
}

// appendTo appends the requests r stands for: its members for a batch,
// else r itself.
func (r *request) appendTo(list []*request) []*request {
	if r.members != nil {
		return append(list, r.members...)
	}
	return append(list, r)
}

func (r *request) what() string {
	if r.members != nil {
		return fmt.Sprintf("%d reads queued together", len(r.members))
	}
	return fmt.Sprintf("unit %d %s", r.unit, ref(r.table, r.addr))
}

func (r *request) reply(res result) {
	if r.batched != nil {
		r.res = res
		r.batched <- r // room for every member: never blocks
		return
	}
	select {
	case r.done <- res:
	default: // already answered (cannot happen: one reply per request)
	}
}
