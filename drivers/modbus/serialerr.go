package modbus

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/physd/physd/drivers"
)

// serialError is a serial port that cannot be opened, classified by what
// the kernel said, so the fix fits the cause: a port that cannot do RS-485
// mode is not "unplugged". It implements drivers.Coded and wraps
// drivers.ErrOffline (nothing was sent).
type serialError struct {
	port  string
	rs485 bool // rs485.enabled was asked for
	err   error
}

func (e *serialError) Error() string {
	return fmt.Sprintf("open serial port %s: %s: %v; fix: %s", e.port, e.what(), e.err, e.Fix())
}

func (e *serialError) Unwrap() []error { return []error{e.err, drivers.ErrOffline} }

// Serial port codes.
const (
	CodeRS485Unsupported = "rs485_unsupported"
	CodePortMissing      = "serial_port_missing"
	CodePortPermission   = "serial_port_permission"
	CodePortBusy         = "serial_port_busy"
	CodeNotASerialPort   = "not_a_serial_port"
	CodePortError        = "serial_port_error"
)

// Code classifies the error by the errno the kernel returned.
func (e *serialError) Code() string {
	var se *os.SyscallError
	if errors.As(e.err, &se) && strings.Contains(se.Syscall, "RS485") {
		// TIOCSRS485: ENOTTY (no such ioctl: a pty, a USB adapter's
		// driver), EINVAL (flags the driver refuses), EOPNOTSUPP or
		// ENOSYS (older kernels): each means this port has no RS-485 mode.
		return CodeRS485Unsupported
	}
	var errno syscall.Errno
	if errors.As(e.err, &errno) {
		switch errno {
		case syscall.ENOENT, syscall.ENXIO, syscall.ENODEV:
			return CodePortMissing
		case syscall.EACCES, syscall.EPERM:
			return CodePortPermission
		case syscall.EBUSY:
			return CodePortBusy
		case syscall.ENOTTY:
			return CodeNotASerialPort
		case syscall.EINVAL, syscall.EOPNOTSUPP, syscall.ENOSYS:
			if e.rs485 {
				return CodeRS485Unsupported
			}
		}
	}
	// goburrow/serial reports a failed tcsetattr as text only.
	if strings.Contains(e.err.Error(), "could not set setting") {
		return CodeNotASerialPort
	}
	return CodePortError
}

func (e *serialError) what() string {
	switch e.Code() {
	case CodeRS485Unsupported:
		return "this port cannot do RS-485 mode (the kernel refused TIOCSRS485)"
	case CodePortMissing:
		return "no such device"
	case CodePortPermission:
		return "permission denied"
	case CodePortBusy:
		return "the port is in use"
	case CodeNotASerialPort:
		return "not a serial port (the terminal settings were refused)"
	}
	return "cannot open"
}

// Fix says what to do about it.
func (e *serialError) Fix() string {
	switch e.Code() {
	case CodeRS485Unsupported:
		return "set rs485.enabled: false when the adapter switches direction by itself (most USB RS-485 adapters do), " +
			"or use a port whose kernel driver supports RS-485 mode (e.g. a UART with an RS-485 overlay)"
	case CodePortMissing:
		return "check port: (a stable name from /dev/serial/by-id/ is best) and that the adapter is plugged in"
	case CodePortPermission:
		return "let physd's user open it: add it to the port's group (usually dialout), or run the service with SupplementaryGroups=dialout"
	case CodePortBusy:
		return "another program holds the port (ModemManager, a getty, another physd): stop it or use another port"
	case CodeNotASerialPort:
		return "port: must name a serial device (/dev/ttyUSB0, /dev/ttyAMA0, /dev/serial/by-id/...)"
	}
	return "check port: and the adapter; the error above is the kernel's"
}
