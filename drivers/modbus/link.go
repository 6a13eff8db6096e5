package modbus

import (
	"time"

	gb "github.com/goburrow/modbus"
)

// link is one Modbus endpoint (a TCP connection or a serial line) as the
// bus worker drives it. Only the worker goroutine calls it, so
// implementations need no locking of their own.
//
// Both links speak through goburrow's modbus.Client, so PDU encoding and
// response checks are the same code for TCP and RTU; they differ in the
// transport underneath (tcp.go, rtu.go).
type link interface {
	// open makes the endpoint usable: a TCP dial, a serial open. It is a
	// no-op while open. Its error means nothing was sent.
	open() error
	// client returns the goburrow client for one exchange with unit, with
	// the request timeout applied.
	client(unit byte, timeout time.Duration) gb.Client
	// broken is called after any error that is not a Modbus exception. TCP
	// closes the connection: goburrow v0.1.0 otherwise stays one
	// transaction id behind after a timeout, or keeps a broken pipe after
	// a peer restart. RTU marks the line dirty.
	broken(err error)
	// settle runs after the callers of a request have been answered and
	// before the next request: RTU waits here for a silent line when it is
	// dirty, so the flush delays neither the failed caller's answer nor
	// eats into the next request's timeout. TCP has nothing to do.
	settle()
	// reused reports whether the last exchange ran on a connection that
	// existed before it (a stale-connection error then earns one retry).
	reused() bool
	close() error
}
