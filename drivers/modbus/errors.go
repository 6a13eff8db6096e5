package modbus

import (
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	gb "github.com/goburrow/modbus"
	"github.com/physd/physd/drivers"
)

// ExceptionError is a Modbus exception reply: the device got the request
// and refused it. It names the exception and the registers asked for.
type ExceptionError struct {
	Unit     byte
	Function byte // the request's function code
	Code     byte // the exception code
	What     string
	write    bool
}

var exceptionText = map[byte][2]string{
	1:  {"illegal function", "the device does not implement this function code for this table"},
	2:  {"illegal data address", "the device has no such register: check the binding's address and table (address: is 0-based, reg=4xxxx is 1-based)"},
	3:  {"illegal data value", "the device refused the value or the quantity"},
	4:  {"server device failure", "the device failed while acting on the request"},
	5:  {"acknowledge", "the device accepted a long-running request; read back later"},
	6:  {"server device busy", "the device is busy; retry later"},
	8:  {"memory parity error", "the device reports a memory parity error"},
	10: {"gateway path unavailable", "the gateway has no path to this unit"},
	11: {"gateway target device failed to respond", "the gateway got no reply from this unit"},
}

func (e *ExceptionError) Error() string {
	t, ok := exceptionText[e.Code]
	if !ok {
		t = [2]string{"unknown exception", "see the device manual"}
	}
	return fmt.Sprintf("unit %d %s: function %d: modbus exception %d (%s): %s", e.Unit, e.What, e.Function, e.Code, t[0], t[1])
}

// Unwrap tells the node what a refused write means: codes 1–3 and 6 are
// refusals before anything changed (drivers.ErrBadValue, or ErrOffline for
// busy / no gateway path); the others leave the outcome open, so the node
// reads back. Exceptions to reads carry no sentinel.
func (e *ExceptionError) Unwrap() error {
	if !e.write {
		return nil
	}
	switch e.Code {
	case 1, 2, 3:
		return drivers.ErrBadValue
	case 6, 10:
		return drivers.ErrOffline
	}
	return nil
}

// unitFault reports whether an exception says the unit itself is unwell
// (it counts toward marking the unit down), rather than "bad request".
func (e *ExceptionError) unitFault() bool { return e.Code == 4 || e.Code == 10 || e.Code == 11 }

// asException converts goburrow's exception error for a request.
func asException(err error, unit, fc byte, what string, write bool) (*ExceptionError, bool) {
	var me *gb.ModbusError
	if !errors.As(err, &me) {
		return nil, false
	}
	return &ExceptionError{Unit: unit, Function: fc, Code: me.ExceptionCode, What: what, write: write}, true
}

// errNotSent marks an error where the request never reached the wire:
// nothing was written, so it wraps drivers.ErrOffline.
type errNotSent struct{ err error }

func (e *errNotSent) Error() string { return e.err.Error() + " (not sent)" }
func (e *errNotSent) Unwrap() []error {
	return []error{e.err, drivers.ErrOffline}
}

func notSent(format string, args ...any) error {
	return &errNotSent{err: fmt.Errorf(format, args...)}
}

// isDial reports a failure to reach the endpoint (nothing was sent).
func isDial(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// isTimeout reports a request that got no (complete) reply in time.
func isTimeout(err error) bool {
	if errors.Is(err, drivers.ErrTimeout) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// isStale reports the errors of a TCP connection the peer dropped while it
// sat idle (a restart): the request did not reach the new peer, so one
// retry on a fresh connection is safe — and it is what makes a peer restart
// invisible to callers.
func isStale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}
