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
// and refused it. It names the exception and the registers asked for, and
// implements drivers.Coded with a fix that fits both the exception and
// the request.
type ExceptionError struct {
	Unit      byte
	Function  byte // the request's function code
	Exception byte // the exception code
	What      string
	write     bool
	// readable, for exception 2 to a write: whether a read of the same
	// register works (then it exists, and refuses writes). nil: not known.
	readable *bool
	busy     int // for exception 6: resends made before giving up
}

var exceptionCodes = map[byte][2]string{
	1:  {"illegal_function", "illegal function"},
	2:  {"illegal_data_address", "illegal data address"},
	3:  {"illegal_data_value", "illegal data value"},
	4:  {"server_device_failure", "server device failure"},
	5:  {"acknowledge", "acknowledge"},
	6:  {"slave_device_busy", "server device busy"},
	8:  {"memory_parity_error", "memory parity error"},
	10: {"gateway_path_unavailable", "gateway path unavailable"},
	11: {"gateway_target_failed", "gateway target device failed to respond"},
}

// Code is the exception's machine name, e.g. "illegal_data_address".
func (e *ExceptionError) Code() string {
	if c, ok := exceptionCodes[e.Exception]; ok {
		return c[0]
	}
	return fmt.Sprintf("modbus_exception_%d", e.Exception)
}

func (e *ExceptionError) Error() string {
	name := fmt.Sprintf("exception %d", e.Exception)
	if c, ok := exceptionCodes[e.Exception]; ok {
		name = c[1]
	}
	op := "read"
	if e.write {
		op = "write"
	}
	return fmt.Sprintf("unit %d %s: %s with function %d: modbus exception %d (%s); fix: %s", e.Unit, e.What, op, e.Function, e.Exception, name, e.Fix())
}

// Fix says what to do, for this exception to this request.
func (e *ExceptionError) Fix() string {
	wrongUnit := fmt.Sprintf("if no register of this device answers, check unit: %d (another device may answer at this id)", e.Unit)
	switch e.Exception {
	case 1:
		if e.write {
			return fmt.Sprintf("the device does not take function %d here: try write_function %s; if it refuses both, the register is read-only or in another table", e.Function, otherWriteFC(e.Function))
		}
		return fmt.Sprintf("the device has no function %d, so it has no such table: check table: (input vs holding, coil vs discrete); %s", e.Function, wrongUnit)
	case 2:
		switch {
		case e.write && e.readable != nil && *e.readable:
			return "the register exists (a read of it works) but refuses writes: it is read-only, or writable only in another table or with another function code (write_function 6/16, 5/15); the device manual lists the writable registers"
		case e.write && e.readable == nil:
			return "the device refuses writes at this address: the register is read-only or does not exist; check address: (0-based; reg=4xxxx is 1-based Modicon), table: and the device manual's writable registers"
		}
		return "no such register: check address: (0-based protocol address; reg=4xxxx is 1-based Modicon) and table:; " + wrongUnit
	case 3:
		if e.write {
			return "the device refused the value or the quantity: check the capability's range against the device's, and for multi-register types the data_type and write_function"
		}
		return "the device refused the quantity: it may limit registers per read; set coalesce: false or coalesce_gap: 0 on the bus"
	case 4:
		if e.write {
			return "the device failed while acting on the write, which may be applied in part: read the value back before retrying, and check the device's alarms"
		}
		return "the device failed while reading: check its alarms and status"
	case 5:
		return "the device accepted a long-running command and is still processing it: read the value back later before sending it again"
	case 6:
		if e.busy > 0 {
			return fmt.Sprintf("the device stayed busy through %d resends: retry later, or raise busy_retries or the capability's timeout_ms", e.busy)
		}
		return "the device is busy: retry later, or raise busy_retries or the capability's timeout_ms"
	case 8:
		return "the device reports a memory parity error: it needs service"
	case 10:
		return fmt.Sprintf("the gateway has no path to unit %d: check unit: and the gateway's routing table", e.Unit)
	case 11:
		return fmt.Sprintf("the gateway got no reply from unit %d: check the device is powered and wired, that its unit id is %d, and the gateway's serial settings", e.Unit, e.Unit)
	}
	return "see the device manual for this exception code"
}

// otherWriteFC suggests the other write function for a table.
func otherWriteFC(fc byte) string {
	switch fc {
	case 5:
		return "15"
	case 15:
		return "5"
	case 6:
		return "16"
	}
	return "6"
}

// Unwrap tells the node what a refused write means: exceptions 1, 2 and 3
// are refusals before anything changed (drivers.ErrBadValue), 6 (busy,
// after the resends) and 10 (no gateway path) mean the request was not
// carried out (drivers.ErrOffline); 4, 5, 11 and others leave the outcome
// open, so the node reads back. Exceptions to reads carry no sentinel.
func (e *ExceptionError) Unwrap() error {
	if !e.write {
		return nil
	}
	switch e.Exception {
	case 1, 2, 3:
		return drivers.ErrBadValue
	case 6, 10:
		return drivers.ErrOffline
	}
	return nil
}

var _ drivers.Coded = (*ExceptionError)(nil)

// unitFault reports whether an exception says the unit itself is unwell
// (it counts toward marking the unit down), rather than "bad request".
func (e *ExceptionError) unitFault() bool {
	return e.Exception == 4 || e.Exception == 10 || e.Exception == 11
}

// asException converts goburrow's exception error for a request.
func asException(err error, unit, fc byte, what string, write bool) (*ExceptionError, bool) {
	var me *gb.ModbusError
	if !errors.As(err, &me) {
		return nil, false
	}
	return &ExceptionError{Unit: unit, Function: fc, Exception: me.ExceptionCode, What: what, write: write}, true
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
