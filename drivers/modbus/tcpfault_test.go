package modbus

import (
	"errors"
	"testing"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/modbus/modbustest"
)

// Modbus TCP with requests and replies lost (dropped, or the connection
// reset before or after the server acted): every write is classified by
// what physd knows — certainly not applied (ErrOffline) only when the
// request never reached the server, otherwise success or "may have
// landed" — and none is sent twice. The server counts the writes.
func TestTCPLostFramesClassified(t *testing.T) {
	srv, bank := peer(t)
	px, err := modbustest.StartProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	px.SetDrop(func(n int) modbustest.Drop {
		switch {
		case n%3 == 0:
			return modbustest.DropRequest
		case n%5 == 0:
			return modbustest.DropReply
		case n%7 == 0:
			return modbustest.ResetReply
		case n%11 == 0:
			return modbustest.ResetRequest
		}
		return modbustest.Pass
	})
	b := openTCP(t, px.Addr, "timeout_ms: 30, down_after: 1000, retry_backoff_ms: 1, max_backoff_ms: 1")
	w := pointOn(t, b, `{name: w, kind: do, data_type: int, binding: {type: modbus, table: holding, address: 5, data_type: uint16}}`)
	r := pointOn(t, b, `{name: r, data_type: int, binding: {type: modbus, table: holding, address: 6, data_type: uint16}}`)
	bank.SetHolding(1, 6, 606)
	const n = 150
	outcome := make([]error, n)
	for i := range n {
		outcome[i] = writeCtx(w, int64(1000+i))
		if rd, err := r.Read(ctxFor(t, 1e9)); err == nil && rd.Value != int64(606) {
			t.Fatalf("read %v, want 606", rd.Value)
		}
	}
	landed := map[uint16]int{}
	for _, q := range bank.Requests() {
		if q.Write {
			landed[q.Regs[0]]++
		}
	}
	var ok, notApplied, unknown, unknownLanded int
	for i, err := range outcome {
		v := uint16(1000 + i)
		switch c := landed[v]; {
		case c > 1:
			t.Errorf("value %d was written %d times", v, c)
		case err == nil:
			ok++
			if c != 1 {
				t.Errorf("write %d reported success but reached the server %d times", v, c)
			}
		case errors.Is(err, drivers.ErrOffline) || errors.Is(err, drivers.ErrBadValue):
			notApplied++
			if c != 0 {
				t.Errorf("write %d reported certainly not applied (%v) but the server applied it", v, err)
			}
		default:
			unknown++
			if c == 1 {
				unknownLanded++
			}
		}
	}
	t.Logf("%d writes: %d success, %d certainly not applied, %d may have landed (%d of them did); no value written twice", n, ok, notApplied, unknown, unknownLanded)
	if ok == 0 || unknown == 0 || unknownLanded == 0 {
		t.Errorf("the fault mix did not exercise every outcome")
	}
}

// The connection is reset after the server acted on a write, on a
// connection that had served requests before (which looks like a peer
// that dropped an idle connection): the write may have landed, so it is
// not resent.
func TestTCPResetAfterWriteIsNotResent(t *testing.T) {
	srv, bank := peer(t)
	px, err := modbustest.StartProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	px.SetDrop(func(n int) modbustest.Drop {
		if n == 2 {
			return modbustest.ResetReply
		}
		return modbustest.Pass
	})
	b := openTCP(t, px.Addr, "timeout_ms: 200")
	w := pointOn(t, b, `{name: w, kind: do, data_type: int, binding: {type: modbus, table: holding, address: 5, data_type: uint16}}`)
	readOK(t, w) // the connection is in use
	err = writeCtx(w, int64(77))
	if err == nil || errors.Is(err, drivers.ErrOffline) || errors.Is(err, drivers.ErrBadValue) {
		t.Fatalf("write = %v, want an error that leaves the outcome open", err)
	}
	writes := 0
	for _, q := range bank.Requests() {
		if q.Write {
			writes++
		}
	}
	if writes != 1 {
		t.Fatalf("the server saw %d writes, want 1", writes)
	}
}
