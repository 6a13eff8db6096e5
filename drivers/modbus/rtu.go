package modbus

import (
	"time"

	gb "github.com/goburrow/modbus"
	"github.com/goburrow/serial"
)

// rtuLink is Modbus RTU: goburrow's client and RTU packager (PDU encoding,
// CRC, response checks) over our own transport, rtuTransport, on a
// goburrow/serial port. goburrow's own RTU transport is not used; see the
// package doc for why.
type rtuLink struct {
	pk *gb.RTUClientHandler // only its packager half (SlaveId, Encode, Verify, Decode) is used
	t  *rtuTransport
	c  gb.Client
}

func newRTULink(cfg serial.Config, timeout, silence time.Duration, st *counters, stop <-chan struct{}) *rtuLink {
	pk := gb.NewRTUClientHandler(cfg.Address)
	t := newRTUTransport(cfg, timeout, silence, st, stop)
	return &rtuLink{pk: pk, t: t, c: gb.NewClient2(pk, t)}
}

func (l *rtuLink) open() error {
	if l.t.port != nil {
		return nil
	}
	return l.t.openPort()
}

// client ignores the timeout the worker offers: on a serial line a request
// always waits the bus's full timeout_ms (plus the frames' time on the
// wire). A caller whose deadline ends sooner stops waiting, but the line
// is not handed to the next request while this one's reply may still
// come: that is how a late reply became the next request's answer.
func (l *rtuLink) client(unit byte, _ time.Duration) gb.Client {
	l.pk.SlaveId = unit
	return l.c
}

// broken also covers errors goburrow finds after the transport returned a
// frame (an echo that does not match): the line is suspect either way.
func (l *rtuLink) broken(error) { l.t.suspect(l.pk.SlaveId) }

// settle quarantines and re-synchronises a suspect line before the worker
// takes the next request (see rtuTransport).
func (l *rtuLink) settle() {
	if l.t.port != nil {
		_ = l.t.recover()
	}
}

func (l *rtuLink) reused() bool { return false }
func (l *rtuLink) close() error { return l.t.closePort() }
