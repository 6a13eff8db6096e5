// Command modbus-sim is a small Modbus TCP boiler controller for trying
// physd without hardware:
//
//	go run ./examples/modbus/modbus-sim &
//	physd run --manifest examples/modbus/physmcp.manifest.yml
//
// With -pty it serves the same boiler as Modbus RTU too, on a new
// pseudo-terminal whose path it logs ("RTU on /dev/pts/N"): a serial line
// without an RS-485 adapter, for physd scan modbus --rtu /dev/pts/N and a
// modbus_rtu bus (any baud rate and framing; the pty ignores them).
//
// It serves unit 1 on 127.0.0.1:5020 (502 needs root; other unit ids draw
// exception 11, as from a gateway) with the register map below, through
// github.com/simonvetter/modbus, and runs a first-order thermal model:
// with the burner enabled and a heating mode, the flow temperature
// approaches its setpoint; otherwise it cools to the room.
//
//	coil      00001  burner enable                 (rw)
//	coil      00002  circulation pump enable       (rw)
//	discrete  10001  flame detected                (r)
//	input     30001  flow temperature   float32 ABCD, °C
//	input     30003  return temperature float32 CDAB (word-swapped), °C
//	input     30005  outdoor temperature int16 ×0.1 °C
//	input     30006  burner hours       uint32 ABCD
//	holding   40001  flow setpoint      int16 ×0.1 °C, 30.0..80.0 (else exception 3)
//	holding   40002  pump speed         uint16 %, 0..100 (else exception 3)
//	holding   40003  operating mode     0 off, 1 heating, 2 hot water, 3 frost protection
//	holding   40011  status word        bit 0 burner on, bit 1 pump running, bit 3 alarm (flow > 85 °C),
//	                                    bit 4 watchdog safe mode; read-only (writes draw exception 2)
//	holding   40021  watchdog time      uint16 × 100 ms, 0..600 (0: off; else exception 3)
//	holding   40022  watchdog heartbeat any value; every write restarts the watchdog time
//
// The host watchdog is the one Modbus I/O modules have (Moxa ioThinx safe
// mode, ICP DAS safe value, Turck's watchdog register): once the watchdog
// time is set, a host that stops writing the heartbeat for that long —
// physd killed, hung, or cut off — finds the controller in safe mode: the
// burner disabled (coil 00001 off) and the mode off (40003 = 0), status
// bit 4 set. The next heartbeat clears bit 4; the outputs stay safe until
// written again, so nothing restarts by itself. -watchdog sets the time at
// start, as a module's stored configuration would; a host may write it
// itself (physd's bus key heartbeat: with timeout_register: 40021 does, at
// every connect). The watchdog keeps its own 100 ms clock, apart from the
// model's -step.
//
// With -points N it is also a large device for load tests (physd's
// bench/scale10k.sh runs 20 of them): N input registers from 30101 whose
// int16 values (×0.1) move on sines of their own, and -setpoints M holding
// registers from 40101 that keep any value a host writes (points.go). The
// boiler's registers stay as above.
package main

import (
	"flag"
	"log"
	"math"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"github.com/physd/physd/drivers/modbus/modbustest"
)

const unit = 1

func main() {
	addr := flag.String("addr", "127.0.0.1:5020", "listen address (host:port)")
	step := flag.Duration("step", 200*time.Millisecond, "model time step")
	rtu := flag.Bool("pty", false, "also serve unit 1 as Modbus RTU on a new pseudo-terminal (its path is logged)")
	watchdog := flag.Duration("watchdog", 0, "host watchdog time at start (40021; 100 ms steps, at most 60s; 0: off until a host writes it)")
	npoints := flag.Int("points", 0, "also serve this many moving int16 input registers from 30101 (a load test's device)")
	setpoints := flag.Int("setpoints", 8, "with -points: holding registers from 40101 that keep any value written")
	flag.Parse()

	b := newBoiler()
	var bank *pointBank
	if *npoints > 0 {
		var err error
		if bank, err = newPointBank(b, *npoints, *setpoints, time.Now()); err != nil {
			log.Fatalf("modbus-sim: %v", err)
		}
	}
	if *watchdog > 0 {
		if *watchdog > 60*time.Second {
			log.Fatalf("modbus-sim: -watchdog %v: at most 60s", *watchdog)
		}
		b.bank.SetHolding(unit, regWatchdogTime, uint16(*watchdog/(100*time.Millisecond)))
		b.heartbeat()
		log.Printf("modbus-sim: host watchdog %v: write 40022 at least that often or the burner goes to safe mode", *watchdog)
	}
	srv, err := modbustest.StartTCP(*addr, b.bank)
	if err != nil {
		log.Fatalf("modbus-sim: %v", err)
	}
	log.Printf("modbus-sim: boiler controller, unit %d, on %s", unit, srv.Addr)
	if bank != nil {
		log.Printf("modbus-sim: %d moving points from input 30101, %d setpoints from holding 40101", bank.n, b.setpoints)
	}
	if *rtu {
		// The sim keeps the terminal side open too, so the line stays up
		// between the masters that open and close it (else the master
		// side reads EIO when the last of them closes).
		ptmx, tty, err := pty.Open()
		if err != nil {
			log.Fatalf("modbus-sim: -pty: %v", err)
		}
		defer tty.Close()
		defer ptmx.Close()
		modbustest.ServeRTU(ptmx, b.bank, unit)
		log.Printf("modbus-sim: boiler controller, unit %d, RTU on %s", unit, tty.Name())
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	tick := time.NewTicker(*step)
	defer tick.Stop()
	// The watchdog keeps its own 100 ms clock, apart from the model's
	// step (which tests hold still with -step 1h), as a module's does.
	wd := time.NewTicker(watchdogStep)
	defer wd.Stop()
	for {
		select {
		case <-stop:
			_ = srv.Stop()
			return
		case now := <-tick.C:
			b.step(step.Seconds())
			bank.step(b.bank, now)
			if b.bank.Count() > maxLoggedRequests {
				b.bank.ResetCount() // a long run must not keep every request it served
			}
		case <-wd.C:
			b.watch()
		}
	}
}

// maxLoggedRequests bounds the bank's request log (kept for tests; the
// simulator reads it nowhere).
const maxLoggedRequests = 100_000

// The host watchdog's registers (0-based holding addresses).
const (
	regWatchdogTime  = 20 // 40021
	regWatchdogBeat  = 21 // 40022
	regStatus        = 10 // 40011
	statusSafeMode   = 1 << 4
	maxWatchdogTicks = 600 // 60 s in 100 ms steps
	watchdogStep     = 100 * time.Millisecond
)

// boiler is the plant model behind the registers.
type boiler struct {
	bank                  *modbustest.Bank
	flow, ret, outdoor    float64 // °C
	burnerSeconds         float64
	roomC, tauS, maxFlowC float64

	setpoints int // -setpoints: holding registers from pointsBase that take any value

	now      func() time.Time // the watchdog's clock (tests replace it)
	mu       sync.Mutex       // guards lastBeat and safeMode: requests arrive on the server's goroutines
	lastBeat time.Time        // the last heartbeat (or watchdog time) write
	safeMode bool             // the watchdog tripped; cleared by the next heartbeat
}

func newBoiler() *boiler {
	b := &boiler{bank: modbustest.NewBank(64), flow: 35, ret: 30, outdoor: 4.5, roomC: 18, tauS: 40, maxFlowC: 95, now: time.Now}
	b.bank.SetHolding(unit, 0, 550) // 55.0 °C
	b.bank.SetHolding(unit, 1, 60)  // 60 %
	b.bank.SetHolding(unit, 2, 1)   // heating
	b.bank.SetCoil(unit, 0, true, true)
	// Like a Modbus TCP gateway, other unit ids get exception 11 (gateway
	// target failed to respond), so physd scan modbus finds unit 1 only.
	for u := range 256 {
		b.bank.Absent(byte(u), u != unit)
	}
	// The controller's own limits: out-of-range writes draw exception 3
	// (illegal data value), which physd reports as "nothing changed".
	b.bank.SetFault(func(r modbustest.Request) error {
		if !r.Write || r.Table != modbustest.HoldingRegisters {
			return nil
		}
		for i, v := range r.Regs {
			if a := int(r.Addr) + i; a >= pointsBase && a < pointsBase+b.setpoints {
				continue // a load test's setpoint: any value
			}
			switch r.Addr + uint16(i) {
			case 0:
				if c := int16(v); c < 300 || c > 800 {
					return modbustest.IllegalDataValue
				}
			case 1:
				if v > 100 {
					return modbustest.IllegalDataValue
				}
			case 2:
				if v > 3 {
					return modbustest.IllegalDataValue
				}
			case regWatchdogTime:
				if v > maxWatchdogTicks {
					return modbustest.IllegalDataValue
				}
				if old := b.bank.Holding(unit, regWatchdogTime, 1)[0]; old != v {
					log.Printf("modbus-sim: host watchdog time set to %v (was %v)", time.Duration(v)*watchdogStep, time.Duration(old)*watchdogStep)
				}
				b.heartbeat()
			case regWatchdogBeat:
				b.heartbeat()
			default:
				return modbustest.IllegalDataAddress // read-only status and spare registers
			}
		}
		return nil
	})
	b.publish()
	return b
}

// heartbeat restarts the watchdog time and leaves safe mode.
func (b *boiler) heartbeat() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.safeMode {
		b.setStatus(0, statusSafeMode)
		log.Printf("modbus-sim: host watchdog: heartbeat; safe mode left (the outputs stay safe until written)")
	}
	b.lastBeat, b.safeMode = b.now(), false
}

// setStatus sets and clears bits of the status word at once, between the
// model's steps (which write all of it).
func (b *boiler) setStatus(set, clear uint16) {
	s := b.bank.Holding(unit, regStatus, 1)[0]
	b.bank.SetHolding(unit, regStatus, s&^clear|set)
}

// watch trips the host watchdog when the host has not written the
// heartbeat within the watchdog time: the burner off, the mode off.
func (b *boiler) watch() bool {
	ticks := b.bank.Holding(unit, regWatchdogTime, 1)[0]
	b.mu.Lock()
	defer b.mu.Unlock()
	if ticks == 0 || b.safeMode {
		return b.safeMode
	}
	if b.now().Sub(b.lastBeat) >= time.Duration(ticks)*100*time.Millisecond {
		b.safeMode = true
		b.bank.SetCoil(unit, 0, false)
		b.bank.SetHolding(unit, 2, 0)
		b.setStatus(statusSafeMode, 1) // bit 0: the burner is off now
		log.Printf("modbus-sim: host watchdog: no heartbeat for %v; safe mode (burner off, mode off)", time.Duration(ticks)*100*time.Millisecond)
	}
	return b.safeMode
}

// step advances the model by dt seconds and refreshes the registers.
func (b *boiler) step(dt float64) {
	safe := b.watch()
	hold := b.bank.Holding(unit, 0, 3)
	setpoint := float64(int16(hold[0])) / 10
	speed := float64(hold[1])
	mode := hold[2]
	burnerOn := b.bank.Coil(unit, 0) && (mode == 1 || mode == 2 || (mode == 3 && b.flow < 10))
	pumpOn := b.bank.Coil(unit, 1) && speed > 0

	target := b.roomC
	if burnerOn {
		target = setpoint
		b.burnerSeconds += dt
	}
	b.flow += (target - b.flow) * (1 - math.Exp(-dt/b.tauS))
	drop := 2.0
	if pumpOn {
		drop = 2 + 10*speed/100
	}
	b.ret = b.flow - drop
	b.outdoor = 4.5 + 3*math.Sin(float64(time.Now().Unix()%86400)/86400*2*math.Pi)
	var status uint16
	if burnerOn {
		status |= 1 << 0
	}
	if pumpOn {
		status |= 1 << 1
	}
	if b.flow > 85 {
		status |= 1 << 3
	}
	if safe {
		status |= statusSafeMode
	}
	b.bank.SetHolding(unit, regStatus, status)
	b.bank.SetDiscrete(unit, 0, burnerOn)
	b.publish()
}

func (b *boiler) publish() {
	f := math.Float32bits(float32(b.flow))
	r := math.Float32bits(float32(b.ret))
	h := uint32(b.burnerSeconds / 3600)
	b.bank.SetInput(unit, 0,
		uint16(f>>16), uint16(f), // 30001-30002 ABCD
		uint16(r), uint16(r>>16), // 30003-30004 CDAB
		uint16(int16(math.Round(b.outdoor*10))), // 30005
		uint16(h>>16), uint16(h), // 30006-30007
	)
}
