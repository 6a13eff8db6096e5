package modbus

import (
	"context"
	"errors"
	"fmt"
	"time"

	gb "github.com/goburrow/modbus"
	"github.com/physd/physd/drivers"
)

// The worker's operations: merged reads, writes, and bit writes by
// read-modify-write. Each turns into one or more exchanges (exchange.go).

// reads answers a run of reads (no write among them): expired ones
// without sending, the rest merged into spans.
func (w *worker) reads(rs []*request) {
	live := make([]*request, 0, len(rs))
	for _, r := range rs {
		if err := r.ctx.Err(); err != nil {
			w.st.rejected.Add(1)
			r.reply(result{err: notSent("%s: %s: expired in the queue: %w", w.name, r.what(), drivers.ErrTimeout)})
			continue
		}
		live = append(live, r)
	}
	for _, sp := range plan(live, w.spec.Coalesce, w.spec.CoalesceGap) {
		w.readSpan(sp)
		w.link.settle()
	}
}

// readSpan performs one (possibly merged) read and answers its requests.
func (w *worker) readSpan(sp *span) {
	what := ref(sp.table, sp.addr)
	if len(sp.reqs) > 1 {
		what += fmt.Sprintf(" +%d (merged read for %d points)", sp.qty-1, len(sp.reqs))
	}
	ctxs := make([]context.Context, len(sp.reqs))
	for i, r := range sp.reqs {
		ctxs[i] = r.ctx
	}
	var data []byte
	err := w.exchange(exch{unit: sp.unit, fc: readFC(sp.table), what: what, ctxs: ctxs, do: func(c gb.Client) error {
		var err error
		data, err = readTable(c, sp.table, sp.addr, sp.qty)
		return err
	}})
	if err != nil {
		var ex *ExceptionError
		if errors.As(err, &ex) && len(sp.reqs) > 1 {
			// The merged range crossed a register the device refuses (a
			// hole in a gap, or one bad binding): ask for each point alone,
			// so each gets its own answer.
			for _, r := range sp.reqs {
				w.readSpan(&span{unit: r.unit, table: r.table, addr: r.addr, qty: r.qty, reqs: []*request{r}})
			}
			return
		}
		for _, r := range sp.reqs {
			r.reply(result{err: fmt.Errorf("%s: %w", w.name, err)})
		}
		return
	}
	at := time.Now()
	var regs []uint16
	var bits []bool
	if sp.table.isBit() {
		bits = bitsFromBytes(data, int(sp.qty))
	} else {
		regs = registersFromBytes(data)
	}
	// Each request gets its part of the span's values (fresh for every
	// span, never written again: a view, not a copy).
	for _, r := range sp.reqs {
		off := int(r.addr - sp.addr)
		res := result{at: at}
		if bits != nil {
			res.bits = bits[off : off+int(r.qty) : off+int(r.qty)]
		} else {
			res.regs = regs[off : off+int(r.qty) : off+int(r.qty)]
		}
		r.reply(res)
	}
	w.st.reads.Add(int64(len(sp.reqs)))
	w.st.coalesced.Add(int64(len(sp.reqs) - 1))
}

// readFC is the read function code of a table.
func readFC(t table) byte {
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

// readTable reads qty registers or bits and checks the reply carries
// exactly what was asked (goburrow checks the byte count against the
// payload, not against the request).
func readTable(c gb.Client, t table, addr, qty uint16) ([]byte, error) {
	var b []byte
	var err error
	want := 2 * int(qty)
	switch t {
	case tableCoil:
		b, err = c.ReadCoils(addr, qty)
		want = (int(qty) + 7) / 8
	case tableDiscrete:
		b, err = c.ReadDiscreteInputs(addr, qty)
		want = (int(qty) + 7) / 8
	case tableHolding:
		b, err = c.ReadHoldingRegisters(addr, qty)
	default:
		b, err = c.ReadInputRegisters(addr, qty)
	}
	if err == nil && len(b) != want {
		err = fmt.Errorf("reply carries %d data bytes, want %d", len(b), want)
	}
	return b, err
}

// write performs one point write and answers it.
func (w *worker) write(r *request) {
	if err := r.ctx.Err(); err != nil {
		w.st.rejected.Add(1)
		r.reply(result{err: notSent("%s: %s: expired in the queue: %w", w.name, r.what(), drivers.ErrTimeout)})
		return
	}
	if !r.internal {
		w.st.writes.Add(1)
	}
	ctxs := []context.Context{r.ctx}
	var err error
	if r.op == opWriteBit {
		err = w.writeBit(r, ctxs)
	} else {
		err = w.exchange(exch{unit: r.unit, fc: r.fc, what: ref(r.table, r.addr), write: true, ctxs: ctxs, take: r.take, do: func(c gb.Client) error {
			return writeTable(c, r)
		}})
	}
	w.explainRefusal(r, ctxs, err)
	if err != nil {
		err = fmt.Errorf("%s: %w", w.name, err)
	}
	r.reply(result{at: time.Now(), err: err})
}

// explainRefusal reads the register a write was refused with exception 2:
// if the read works, the register exists and refuses writes (read-only,
// or writable only through another table or function), which is a
// different fix from "no such register".
func (w *worker) explainRefusal(r *request, ctxs []context.Context, err error) {
	var ex *ExceptionError
	if !errors.As(err, &ex) || ex.Exception != 2 || !ex.write {
		return
	}
	qty := uint16(max(len(r.regs), 1))
	if r.table.isBit() {
		qty = 1
	}
	rerr := w.exchange(exch{unit: r.unit, fc: readFC(r.table), what: ref(r.table, r.addr) + " (read to explain a refused write)", ctxs: ctxs, do: func(c gb.Client) error {
		_, err := readTable(c, r.table, r.addr, qty)
		return err
	}})
	var rex *ExceptionError
	switch {
	case rerr == nil:
		ex.readable = new(true)
	case errors.As(rerr, &rex) && rex.Exception == 2:
		ex.readable = new(false)
	}
}

// writeTable sends a write with the binding's function code; goburrow
// checks the echo of address and value (or quantity).
func writeTable(c gb.Client, r *request) error {
	var err error
	switch r.fc {
	case 5:
		v := uint16(0x0000)
		if r.bits[0] {
			v = 0xFF00
		}
		_, err = c.WriteSingleCoil(r.addr, v)
	case 15:
		_, err = c.WriteMultipleCoils(r.addr, uint16(len(r.bits)), bitsToBytes(r.bits))
	case 6:
		_, err = c.WriteSingleRegister(r.addr, r.regs[0])
	case 16:
		_, err = c.WriteMultipleRegisters(r.addr, uint16(len(r.regs)), registersToBytes(r.regs))
	default:
		err = fmt.Errorf("write function %d is not supported", r.fc)
	}
	return err
}

// writeBit sets one bit of a holding register by read-modify-write. Both
// requests go out back to back from this goroutine, so no other physd
// request comes between them; the device's own logic still can (use a
// whole register or a coil where that matters).
func (w *worker) writeBit(r *request, ctxs []context.Context) error {
	if !r.take() {
		return notSent("%s: the caller gave up before it was sent: %w", r.what(), drivers.ErrTimeout)
	}
	var cur []byte
	err := w.exchange(exch{unit: r.unit, fc: 3, what: ref(r.table, r.addr) + " (read before setting bit)", ctxs: ctxs, do: func(c gb.Client) error {
		var err error
		cur, err = readTable(c, tableHolding, r.addr, 1)
		return err
	}})
	if err != nil {
		return &errNotSent{err: err}
	}
	v := registersFromBytes(cur)[0]
	if r.swap {
		v = v<<8 | v>>8
	}
	if r.set {
		v |= 1 << r.bit
	} else {
		v &^= 1 << r.bit
	}
	if r.swap {
		v = v<<8 | v>>8
	}
	wr := &request{unit: r.unit, table: r.table, addr: r.addr, fc: r.fc, regs: []uint16{v}}
	return w.exchange(exch{unit: r.unit, fc: r.fc, what: ref(r.table, r.addr), write: true, ctxs: ctxs, do: func(c gb.Client) error {
		return writeTable(c, wr)
	}})
}
