package modbus

import (
	"errors"
	"strings"
	"testing"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/modbus/modbustest"
)

// Each exception gives its code, the right "did it change anything"
// sentinel for writes, and a fix that fits the exception and the request.
func TestExceptionCodesAndFixes(t *testing.T) {
	srv, bank := peer(t)
	b := openTCP(t, srv.Addr, "busy_retries: 2, busy_backoff_ms: 5, down_after: 100")
	w := pointOn(t, b, `{name: w, kind: do, data_type: int, binding: {type: modbus, table: holding, address: 5, data_type: uint16}}`)
	r := pointOn(t, b, `{name: r, data_type: int, binding: {type: modbus, table: input, address: 5, data_type: uint16}}`)
	bank.Hole(1, modbustest.HoldingRegisters, 9)
	missing := pointOn(t, b, `{name: m, kind: do, data_type: int, binding: {type: modbus, table: holding, address: 9, data_type: uint16}}`)
	only := func(e modbustest.Exception, writes bool) func(modbustest.Request) error {
		return func(q modbustest.Request) error {
			if q.Write == writes {
				return e
			}
			return nil
		}
	}
	cases := []struct {
		name     string
		fault    func(modbustest.Request) error
		p        any // drivers.Point, written when kind do
		write    bool
		code     string
		sentinel error // nil: the outcome is open
		fix      string
	}{
		{"01 write", only(modbustest.IllegalFunction, true), w, true, "illegal_function", drivers.ErrBadValue, "try write_function 16"},
		{"01 read", only(modbustest.IllegalFunction, false), r, false, "illegal_function", nil, "no such table"},
		{"02 write, register readable", only(modbustest.IllegalDataAddress, true), w, true, "illegal_data_address", drivers.ErrBadValue, "exists (a read of it works) but refuses writes"},
		{"02 write, no such register", nil, missing, true, "illegal_data_address", drivers.ErrBadValue, "no such register"},
		{"02 read", only(modbustest.IllegalDataAddress, false), r, false, "illegal_data_address", nil, "check unit: 1"},
		{"03 write", only(modbustest.IllegalDataValue, true), w, true, "illegal_data_value", drivers.ErrBadValue, "refused the value"},
		{"04 write", only(modbustest.DeviceFailure, true), w, true, "server_device_failure", nil, "read the value back"},
		{"06 write", only(modbustest.DeviceBusy, true), w, true, "slave_device_busy", drivers.ErrOffline, "busy through 2 resends"},
		{"11 write", only(modbustest.GatewayNoResponse, true), w, true, "gateway_target_failed", nil, "its unit id is 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bank.SetFault(c.fault)
			defer bank.SetFault(nil)
			p := c.p.(drivers.Point)
			var err error
			if c.write {
				err = writeCtx(p, int64(7))
			} else {
				_, err = p.Read(ctxFor(t, 2e9))
			}
			code, fix, ok := drivers.CodeOf(err)
			if !ok || code != c.code || !strings.Contains(fix, c.fix) {
				t.Fatalf("err %v\ncode %q fix %q; want %q, fix containing %q", err, code, fix, c.code, c.fix)
			}
			for _, s := range []error{drivers.ErrBadValue, drivers.ErrOffline} {
				if errors.Is(err, s) != (s == c.sentinel) {
					t.Errorf("errors.Is(err, %v) = %v, want %v", s, errors.Is(err, s), s == c.sentinel)
				}
			}
		})
	}
}

// A busy device is resent to within the deadline; only the accepted write
// lands, once.
func TestBusyIsResent(t *testing.T) {
	srv, bank := peer(t)
	b := openTCP(t, srv.Addr, "busy_retries: 5, busy_backoff_ms: 5")
	w := pointOn(t, b, `{name: w, kind: do, data_type: int, binding: {type: modbus, table: holding, address: 5, data_type: uint16}}`)
	busy := 2
	bank.SetFault(func(q modbustest.Request) error {
		if q.Write && busy > 0 {
			busy--
			return modbustest.DeviceBusy
		}
		return nil
	})
	if err := writeCtx(w, int64(42)); err != nil {
		t.Fatal(err)
	}
	writes := 0
	for _, q := range bank.Requests() {
		if q.Write {
			writes++
		}
	}
	if writes != 3 || bank.Holding(1, 5, 1)[0] != 42 {
		t.Fatalf("%d writes reached the device (want 2 refused as busy, 1 applied), register %d", writes, bank.Holding(1, 5, 1)[0])
	}
}
