package modbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/physd/physd/strictyaml"
)

// The host heartbeat: Modbus I/O modules (Moxa ioThinx safe mode, ICP DAS
// safe value, Turck's watchdog register) put their outputs to safe values
// by themselves when the host stops writing a heartbeat register for the
// watchdog time. That covers what no code in physd can: a host that is
// gone (SIGKILL, a power cut of the gateway, a cut cable). The bus key
//
//	heartbeat: {unit: 1, register: 40022, every_ms: 1000, value: counter,
//	            timeout_register: 40021, timeout_ms: 5000, timeout_scale_ms: 100}
//
// writes the heartbeat register every every_ms through the bus's worker
// queue (one single-register write, serialized with the points' requests
// and bounded by the bus timeout_ms), and, with timeout_register, writes
// the watchdog time (timeout_ms / timeout_scale_ms) at open, after every
// reconnect and after heartbeats that failed, so the manifest states the
// device's timeout.

// heartbeatKeys are the heartbeat: mapping of a bus.
type heartbeatKeys struct {
	Unit            *int    `yaml:"unit"`
	Register        *string `yaml:"register"`
	EveryMS         *int    `yaml:"every_ms"`
	Value           *string `yaml:"value"`
	TimeoutRegister *string `yaml:"timeout_register"`
	TimeoutMS       *int    `yaml:"timeout_ms"`
	TimeoutScaleMS  *int    `yaml:"timeout_scale_ms"`
}

// Heartbeat is a bus's host heartbeat (nil in Config: none).
type Heartbeat struct {
	Unit    byte
	Addr    uint16        // register: the holding register's 0-based protocol address
	Every   time.Duration // every_ms
	Counter bool          // value: counter (an incrementing 16-bit counter) ...
	Value   uint16        // ... else this fixed value

	// Timeout is the device's watchdog time (timeout_ms; 0: not stated).
	// With HasTimeoutReg physd writes TimeoutTicks (timeout_ms /
	// timeout_scale_ms) into TimeoutAddr.
	Timeout       time.Duration
	HasTimeoutReg bool
	TimeoutAddr   uint16
	TimeoutScale  time.Duration
	TimeoutTicks  uint16
}

// Heartbeat defaults and bounds.
const (
	defaultHeartbeatEvery = time.Second
	minHeartbeatEveryMS   = 100
	maxHeartbeatEveryMS   = 60_000
	heartbeatCounter      = "counter"
)

// parseHeartbeat validates the heartbeat: mapping; c.Timeout is the bus's
// timeout_ms (already parsed).
func parseHeartbeat(p *strictyaml.Problems, k *heartbeatKeys, kind string, c *Config) {
	if k == nil {
		return
	}
	h := &Heartbeat{Unit: 1, Every: defaultHeartbeatEvery, Counter: true}
	heartbeatUnit(p, k, kind, h)
	regOK := false
	if k.Register == nil {
		p.Add("a heartbeat needs the register it writes", "add register: the device's heartbeat (watchdog) holding register, e.g. register: 40022", hbKey, "register")
	} else {
		h.Addr, regOK = heartbeatReg(p, k.Register, "register")
	}
	heartbeatTiming(p, k, c, h)
	heartbeatWatchdogTime(p, k, h, regOK)
	c.Heartbeat = h
}

const hbKey = "heartbeat"

// heartbeatUnit: the unit id, required on a serial line.
func heartbeatUnit(p *strictyaml.Problems, k *heartbeatKeys, kind string, h *Heartbeat) {
	unitMin, unitMax := 0, 255
	if kind == TypeRTU {
		unitMin, unitMax = 1, 247 // 0 is broadcast (no reply); 248..255 are reserved
	}
	switch {
	case k.Unit != nil:
		if *k.Unit < unitMin || *k.Unit > unitMax {
			p.Add(fmt.Sprintf("heartbeat unit %d is outside %d..%d for %s", *k.Unit, unitMin, unitMax, kind),
				fmt.Sprintf("use the unit id of the device whose watchdog this feeds, %d..%d", unitMin, unitMax), hbKey, "unit")
		} else {
			h.Unit = byte(*k.Unit)
		}
	case kind == TypeRTU:
		p.Add("a modbus_rtu heartbeat needs its unit (slave) id", "add unit: N (1..247): the device whose watchdog this feeds", hbKey, "unit")
	}
}

// heartbeatReg parses a holding register in Modicon notation.
func heartbeatReg(p *strictyaml.Problems, s *string, field string) (uint16, bool) {
	const regFix = "write the holding register in Modicon notation, e.g. 40022 (holding address 21), or 6 digits (400022) past 49999"
	t, addr, err := parseModicon(strings.TrimSpace(*s))
	switch {
	case err != nil:
		p.Add(fmt.Sprintf("heartbeat %s %q is not a Modicon register number", field, *s), regFix, hbKey, field)
		return 0, false
	case t != tableHolding:
		p.Add(fmt.Sprintf("heartbeat %s %s names %s; physd writes it, so it must be a holding register (4xxxx)", field, strings.TrimSpace(*s), tableArticle[t]),
			regFix, hbKey, field)
		return 0, false
	}
	return addr, true
}

// heartbeatTiming: every_ms, value and timeout_ms, and how they relate to
// each other and to the bus timeout.
func heartbeatTiming(p *strictyaml.Problems, k *heartbeatKeys, c *Config, h *Heartbeat) {
	if k.EveryMS != nil {
		if *k.EveryMS < minHeartbeatEveryMS || *k.EveryMS > maxHeartbeatEveryMS {
			p.Add(fmt.Sprintf("heartbeat every_ms must be between %d and %d, got %d", minHeartbeatEveryMS, maxHeartbeatEveryMS, *k.EveryMS),
				"write the heartbeat period in ms, e.g. every_ms: 1000 (a third of the device's watchdog time or less)", hbKey, "every_ms")
		} else {
			h.Every = time.Duration(*k.EveryMS) * time.Millisecond
		}
	}
	if k.Value != nil {
		v := strings.TrimSpace(*k.Value)
		if strings.EqualFold(v, heartbeatCounter) {
			h.Counter = true
		} else if n, err := parseNumber(v, 0xFFFF); err == nil {
			h.Counter, h.Value = false, uint16(n)
		} else {
			p.Add(fmt.Sprintf("heartbeat value %q is neither counter nor a 16-bit integer", *k.Value),
				"write value: counter (an incrementing 16-bit counter, for devices that want the value to change) or the fixed value the device expects, 0..65535", hbKey, "value")
		}
	}
	if k.TimeoutMS != nil {
		if *k.TimeoutMS < 1 || *k.TimeoutMS > 3_600_000 {
			p.Add(fmt.Sprintf("heartbeat timeout_ms must be between 1 and 3600000, got %d", *k.TimeoutMS),
				"write the device's watchdog time in ms, e.g. timeout_ms: 5000", hbKey, "timeout_ms")
		} else {
			h.Timeout = time.Duration(*k.TimeoutMS) * time.Millisecond
		}
	}
	if h.Timeout <= 0 {
		return
	}
	every := h.Every.Milliseconds()
	if h.Timeout < 3*h.Every {
		p.Add(fmt.Sprintf("heartbeat timeout_ms (%d) is less than 3 × every_ms (%d): two late heartbeats would put the device in safe mode", h.Timeout.Milliseconds(), every),
			fmt.Sprintf("make timeout_ms at least %d, or every_ms at most %d", 3*every, h.Timeout.Milliseconds()/3), hbKey, "timeout_ms")
	} else if h.Timeout < h.Every+c.Timeout {
		p.Add(fmt.Sprintf("heartbeat timeout_ms (%d) is less than every_ms (%d) + the bus timeout_ms (%d): one heartbeat that waits out the bus timeout would put the device in safe mode",
			h.Timeout.Milliseconds(), every, c.Timeout.Milliseconds()),
			fmt.Sprintf("make heartbeat timeout_ms at least %d, or lower the bus timeout_ms", every+c.Timeout.Milliseconds()), hbKey, "timeout_ms")
	}
}

// heartbeatWatchdogTime: timeout_register and timeout_scale_ms, the
// device's watchdog time physd writes at open.
func heartbeatWatchdogTime(p *strictyaml.Problems, k *heartbeatKeys, h *Heartbeat, regOK bool) {
	if k.TimeoutScaleMS != nil && (*k.TimeoutScaleMS < 1 || *k.TimeoutScaleMS > 60_000) {
		p.Add(fmt.Sprintf("heartbeat timeout_scale_ms must be between 1 and 60000, got %d", *k.TimeoutScaleMS),
			"write what one count of the device's watchdog register means in ms, e.g. 100 for 100 ms steps, 1000 for seconds", hbKey, "timeout_scale_ms")
	}
	if k.TimeoutRegister == nil {
		if k.TimeoutScaleMS != nil {
			p.Add("heartbeat timeout_scale_ms without timeout_register: physd writes no watchdog time",
				"add timeout_register (the device's watchdog time register), or remove timeout_scale_ms", hbKey, "timeout_scale_ms")
		}
		return
	}
	h.HasTimeoutReg = true
	addr, ok := heartbeatReg(p, k.TimeoutRegister, "timeout_register")
	h.TimeoutAddr = addr
	if ok && regOK && addr == h.Addr {
		p.Add(fmt.Sprintf("heartbeat timeout_register is the heartbeat register (%s)", strings.TrimSpace(*k.TimeoutRegister)),
			"name the device's watchdog time register, which is not its heartbeat register", hbKey, "timeout_register")
	}
	if k.TimeoutMS == nil {
		p.Add("heartbeat timeout_register needs timeout_ms: the watchdog time physd writes there",
			"add timeout_ms, e.g. timeout_ms: 5000 (at least 3 × every_ms)", hbKey, "timeout_register")
	}
	if k.TimeoutScaleMS == nil {
		p.Add("heartbeat timeout_register needs timeout_scale_ms: what one count of that register means",
			"add timeout_scale_ms from the device's manual, e.g. 100 when it counts 100 ms steps, 1000 for seconds", hbKey, "timeout_register")
		return
	}
	if *k.TimeoutScaleMS < 1 || *k.TimeoutScaleMS > 60_000 || h.Timeout <= 0 {
		return
	}
	scale := time.Duration(*k.TimeoutScaleMS) * time.Millisecond
	h.TimeoutScale = scale
	ticks := h.Timeout / scale
	switch {
	case h.Timeout%scale != 0:
		lo, hi := ticks*scale, (ticks+1)*scale
		p.Add(fmt.Sprintf("heartbeat timeout_ms (%d) is not a whole number of timeout_scale_ms (%d)", h.Timeout.Milliseconds(), *k.TimeoutScaleMS),
			fmt.Sprintf("use timeout_ms %d or %d", lo.Milliseconds(), hi.Milliseconds()), hbKey, "timeout_ms")
	case ticks < 1 || ticks > 0xFFFF:
		p.Add(fmt.Sprintf("heartbeat timeout_ms / timeout_scale_ms = %d does not fit the 16-bit register", ticks),
			"check timeout_scale_ms against the device's manual", hbKey, "timeout_scale_ms")
	default:
		h.TimeoutTicks = uint16(ticks)
	}
}

var tableArticle = map[table]string{tableCoil: "a coil", tableDiscrete: "a discrete input", tableInput: "an input register"}

// what names the heartbeat register for logs: "unit 1 holding 40022 (address 21)".
func (h *Heartbeat) what() string {
	return fmt.Sprintf("unit %d %s", h.Unit, ref(tableHolding, h.Addr))
}

// heartbeat is the loop that feeds a device's watchdog. Only its own
// goroutine touches its fields.
type heartbeat struct {
	cfg  Heartbeat
	bus  string // the bus's name, for logs
	w    *worker
	st   *counters
	log  *slog.Logger
	stop chan struct{}
	done chan struct{} // closed when run returns

	opened    bool   // the first tick has run
	count     uint16 // value: counter
	armed     bool   // the watchdog time is written (since the last reconnect, and the device answered since)
	armedConn int64  // st.reconnects when it was written
	beat, arm writeState
}

// writeState is one kind of write's state, for logging its changes only.
type writeState struct {
	what    string // "heartbeat", "watchdog time"
	failing int    // consecutive failures
	started bool   // a first result was seen
}

// heartbeatCounters back the heartbeat fields of Stats.
type heartbeatCounters struct {
	hbSent, hbErrors, hbArmed atomic.Int64
	hbLast                    atomic.Int64 // unix nanoseconds of the last heartbeat written; 0: none
	hbErr                     atomic.Pointer[string]
}

func newHeartbeat(cfg Heartbeat, bus string, w *worker, st *counters, log *slog.Logger, stop chan struct{}) *heartbeat {
	if log == nil {
		log = slog.Default()
	}
	return &heartbeat{cfg: cfg, bus: bus, w: w, st: st, log: log, stop: stop, done: make(chan struct{}),
		beat: writeState{what: "heartbeat"}, arm: writeState{what: "watchdog time"}}
}

// run writes the watchdog time and a first heartbeat at once, then a
// heartbeat every Every until the bus closes. A write that takes longer
// than Every delays the next (ticks are dropped, never queued up).
func (h *heartbeat) run() {
	defer close(h.done)
	t := time.NewTicker(h.cfg.Every)
	defer t.Stop()
	for {
		h.tick()
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
	}
}

// tick writes one heartbeat. The watchdog time goes first at open, and
// after any heartbeat that the device answered when it may have lost its
// time: after a reconnect, or after heartbeats it did not answer (it may
// have restarted). So a silent device costs one timed-out write per tick,
// never two.
func (h *heartbeat) tick() {
	if !h.opened {
		h.opened = true
		if err := h.arming(); err != nil && !isExceptionErr(err) {
			return // no answer: a heartbeat now would only wait the timeout again
		}
	}
	v := h.cfg.Value
	if h.cfg.Counter {
		v = h.count
		h.count++
	}
	err := h.write(h.cfg.Addr, v)
	if h.closing() {
		return
	}
	if err == nil {
		h.st.hbSent.Add(1)
		h.st.hbLast.Store(time.Now().UnixNano())
	} else if !isExceptionErr(err) {
		h.armed = false // no answer: the device may restart without its watchdog time
	}
	h.result(&h.beat, err)
	if err == nil {
		_ = h.arming()
	}
}

// arming writes the watchdog time unless it is known to be in place.
func (h *heartbeat) arming() error {
	if !h.cfg.HasTimeoutReg || h.cfg.TimeoutTicks == 0 || h.closing() {
		return nil
	}
	if h.armed && h.st.reconnects.Load() == h.armedConn {
		return nil
	}
	err := h.write(h.cfg.TimeoutAddr, h.cfg.TimeoutTicks)
	if h.closing() {
		return nil
	}
	if err == nil {
		h.armed, h.armedConn = true, h.st.reconnects.Load()
		h.st.hbArmed.Add(1)
	}
	h.result(&h.arm, err)
	return err
}

func (h *heartbeat) closing() bool {
	select {
	case <-h.stop:
		return true
	default:
		return false
	}
}

// write sends one single-register write (function 6) through the worker's
// queue, waiting at most the longer of the bus timeout and the period.
func (h *heartbeat) write(addr uint16, v uint16) error {
	ctx, cancel := context.WithTimeout(context.Background(), max(h.cfg.Every, h.w.spec.Timeout))
	defer cancel()
	r := &request{op: opWrite, unit: h.cfg.Unit, table: tableHolding, addr: addr, fc: 6, regs: []uint16{v}, internal: true}
	_, err := h.w.call(ctx, r)
	return err
}

// result counts a write's outcome and logs only changes of state: the
// first result, the first failure after success, the first success after
// failures; never a line per tick.
func (h *heartbeat) result(s *writeState, err error) {
	if err != nil {
		h.st.hbErrors.Add(1)
		msg := s.what + ": " + err.Error()
		h.st.hbErr.Store(&msg)
		s.failing++
		if s.failing == 1 {
			h.log.Warn("modbus heartbeat failing: the device goes to its safe state when this lasts its watchdog time",
				"bus", h.bus, "register", h.cfg.what(), "write", s.what, "watchdog_ms", h.cfg.Timeout.Milliseconds(), "err", err.Error())
		}
		s.started = true
		return
	}
	switch {
	case s.failing > 0:
		h.log.Info("modbus heartbeat restored", "bus", h.bus, "register", h.cfg.what(), "write", s.what, "failed_writes", s.failing)
	case !s.started && s == &h.beat:
		h.log.Info("modbus heartbeat running", "bus", h.bus, "register", h.cfg.what(), "every_ms", h.cfg.Every.Milliseconds(),
			"watchdog_ms", h.cfg.Timeout.Milliseconds(), "watchdog_time_written", h.armed)
	}
	s.started, s.failing = true, 0
	if h.beat.failing == 0 && h.arm.failing == 0 {
		h.st.hbErr.Store(nil)
	}
}

func isExceptionErr(err error) bool {
	var ex *ExceptionError
	return errors.As(err, &ex)
}
