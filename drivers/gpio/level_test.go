package gpio

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/physd/physd/drivers"
	"periph.io/x/conn/v3/gpio"
	"periph.io/x/conn/v3/gpio/gpioreg"
)

func TestRegistered(t *testing.T) {
	if _, ok := drivers.Lookup("gpio"); !ok {
		t.Fatal(`bus type "gpio" is not registered`)
	}
}

func TestInputLevelsWithActiveLow(t *testing.T) {
	door := newPin(t, "TIN_DOOR")
	plain := newPin(t, "TIN_PLAIN")
	_, pts := open(t, parse(t,
		readCap("door_open", "bool", `{type: gpio, bus: gpio, pin: TIN_DOOR, pull: up, active_low: true}`)+
			readCap("plain", "bool", `{type: gpio, bus: gpio, address: "pin=TIN_PLAIN:mode=digital"}`)))

	// A contact to ground with a pull-up: open circuit reads high, which
	// active_low makes inactive (false).
	if pull(door) != gpio.PullUp || level(door) != gpio.High {
		t.Fatalf("door pin: pull %s level %s, want PullUp/High", pull(door), level(door))
	}
	if got := read(t, pts["door_open"]); got != false {
		t.Fatalf("door at High = %v, want false (active_low)", got)
	}
	setLevel(door, gpio.Low)
	if got := read(t, pts["door_open"]); got != true {
		t.Fatalf("door at Low = %v, want true (active_low)", got)
	}

	if pull(plain) != gpio.PullNoChange {
		t.Errorf("no pull: key passed %s, want PullNoChange (leave the board's setting)", pull(plain))
	}
	for _, l := range []gpio.Level{gpio.Low, gpio.High} {
		setLevel(plain, l)
		if got := read(t, pts["plain"]); got != bool(l) {
			t.Errorf("plain at %s = %v", l, got)
		}
	}
	if err := pts["plain"].Write(context.Background(), true); !errors.Is(err, drivers.ErrReadOnly) {
		t.Errorf("write to an input: %v", err)
	}
}

func TestPullPassedThrough(t *testing.T) {
	want := map[string]gpio.Pull{"up": gpio.PullUp, "down": gpio.PullDown, "none": gpio.Float, "float": gpio.Float}
	caps := ""
	pins := map[string]*testPin{}
	for k := range want {
		name := "TPULL_" + strings.ToUpper(k)
		pins[k] = newPin(t, name)
		caps += readCap("c_"+k, "bool", `{type: gpio, bus: gpio, pin: `+name+`, pull: `+k+`}`)
	}
	open(t, parse(t, caps))
	for k, w := range want {
		if got := pull(pins[k]); got != w {
			t.Errorf("pull: %s gave %s, want %s", k, got, w)
		}
	}
}

func TestOutputsInitialWriteAndReadBack(t *testing.T) {
	relay := newPin(t, "TOUT_RELAY")
	heater := newPin(t, "TOUT_HEATER")
	lamp := newPin(t, "TOUT_LAMP")
	setLevel(relay, gpio.Low) // whatever the line was before the daemon
	_, pts := open(t, parse(t,
		doCap("pump", `{type: gpio, bus: gpio, pin: TOUT_RELAY, active_low: true}`)+
			readCap("pump_state", "bool", `{type: gpio, bus: gpio, pin: TOUT_RELAY, direction: out, active_low: true}`)+
			doCap("heater", `{type: gpio, bus: gpio, pin: TOUT_HEATER, initial: high}`)+
			doCap("lamp", `{type: gpio, bus: gpio, address: "TOUT_LAMP:direction=out:active_low=true:initial=on"}`)))

	// initial defaults to low (inactive): an active-low relay is driven high.
	if level(relay) != gpio.High || read(t, pts["pump"]) != false || read(t, pts["pump_state"]) != false {
		t.Fatalf("relay at open: level %s, pump %v", level(relay), read(t, pts["pump"]))
	}
	if level(heater) != gpio.High || read(t, pts["heater"]) != true {
		t.Fatalf("heater initial high: level %s", level(heater))
	}
	if level(lamp) != gpio.Low || read(t, pts["lamp"]) != true {
		t.Fatalf("lamp initial on, active low: level %s", level(lamp))
	}

	write(t, pts["pump"], true)
	if level(relay) != gpio.Low {
		t.Fatalf("pump on: the active-low relay pin is %s, want Low", level(relay))
	}
	if read(t, pts["pump"]) != true || read(t, pts["pump_state"]) != true {
		t.Fatal("pump on does not read back on")
	}
	write(t, pts["pump"], false)
	if level(relay) != gpio.High || read(t, pts["pump"]) != false {
		t.Fatal("pump off does not read back off")
	}

	if err := pts["pump"].Write(context.Background(), "on"); !errors.Is(err, drivers.ErrBadValue) {
		t.Errorf(`Write("on"): %v, want ErrBadValue`, err)
	}
	if err := pts["pump_state"].Write(context.Background(), true); !errors.Is(err, drivers.ErrReadOnly) {
		t.Errorf("write through a read capability: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := pts["pump"].Write(ctx, true); !errors.Is(err, drivers.ErrTimeout) || level(relay) != gpio.High {
		t.Errorf("write with a dead ctx: %v, level %s", err, level(relay))
	}
}

// Where reading an output would reconfigure it (periph's gpioioctl), the
// driver reads back the level it drove and never calls Read.
func TestOutputReadBackWithoutReadingThePin(t *testing.T) {
	old := outputReadable
	outputReadable = func(gpio.PinIO) bool { return false }
	t.Cleanup(func() { outputReadable = old })
	p := &readCounter{testPin: newPin(t, "TSHADOW")}
	_ = gpioreg.Unregister("TSHADOW")
	register(t, p)

	_, pts := open(t, parse(t, doCap("fan", `{type: gpio, bus: gpio, pin: TSHADOW, active_low: true}`)))
	write(t, pts["fan"], true)
	if got := read(t, pts["fan"]); got != true {
		t.Fatalf("read-back = %v", got)
	}
	write(t, pts["fan"], false)
	if got := read(t, pts["fan"]); got != false {
		t.Fatalf("read-back = %v", got)
	}
	if p.reads != 0 {
		t.Fatalf("Read called %d times on an output whose backend reconfigures on Read", p.reads)
	}
}

// readCounter counts Read calls on a fake pin.
type readCounter struct {
	*testPin
	reads int
}

func (r *readCounter) Read() gpio.Level {
	r.reads++
	return r.testPin.Read()
}

func TestPinByNumberAndAlias(t *testing.T) {
	pin := newPin(t, "GPIO17")
	if err := gpioreg.RegisterAlias("PUMP_RELAY", "GPIO17"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gpioreg.Unregister("PUMP_RELAY") })
	b, pts := open(t, parse(t,
		doCap("pump", `{type: gpio, bus: gpio, pin: 17}`)+
			readCap("by_name", "bool", `{type: gpio, bus: gpio, pin: GPIO17, direction: out}`)+
			readCap("by_alias", "bool", `{type: gpio, bus: gpio, pin: PUMP_RELAY, direction: out}`)+
			readCap("physmcp", "bool", `{type: gpio, bus: gpio, address: "pin=17:mode=output"}`)))
	if len(b.pins) != 1 {
		t.Fatalf("%d pin states, want one shared by four spellings", len(b.pins))
	}
	write(t, pts["pump"], true)
	for _, n := range []string{"by_name", "by_alias", "physmcp"} {
		if read(t, pts[n]) != true {
			t.Errorf("%s does not see the pump on", n)
		}
	}
	if level(pin) != gpio.High {
		t.Fatal("GPIO17 not driven")
	}
}

func TestConflictingBindingsOnOnePin(t *testing.T) {
	newPin(t, "TCONFLICT")
	m := parse(t, doCap("pump", `{type: gpio, bus: gpio, pin: TCONFLICT, active_low: true}`)+
		readCap("pump_state", "bool", `{type: gpio, bus: gpio, pin: TCONFLICT}`))
	db, err := drivers.Open(context.Background(), m.Buses["gpio"])
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Point(m.Capabilities[0]); err != nil {
		t.Fatal(err)
	}
	_, err = db.Point(m.Capabilities[1])
	if err == nil || !strings.Contains(err.Error(), "capabilities[1].binding.pin: pin TCONFLICT is also bound by [pump] as an output") {
		t.Fatalf("err = %v", err)
	}
}

// A pin that does not exist does not stop the daemon: the point reads
// ErrOffline with a message saying what to check, Health names the pin,
// and the pin is picked up when it appears.
func TestMissingPin(t *testing.T) {
	newPin(t, "TMISS_OTHER")
	b, pts := open(t, parse(t, readCap("ghost", "bool", `{type: gpio, bus: gpio, pin: TMISS_GHOST, pull: up}`)+
		doCap("ghost_out", `{type: gpio, bus: gpio, pin: TMISS_GHOST2}`)))
	p := pts["ghost"]
	_, err := p.Read(context.Background())
	if !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("read of a missing pin: %v", err)
	}
	for _, want := range []string{`gpio pin "TMISS_GHOST" (buses.gpio, used by ghost) not found`, "/dev/gpiochip0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if err := pts["ghost_out"].Write(context.Background(), true); !errors.Is(err, drivers.ErrOffline) {
		t.Errorf("write to a missing pin must say nothing was written: %v", err)
	}
	if h := p.(drivers.PointHealth).Health(); h == nil {
		t.Error("point Health is nil for a missing pin")
	}
	if h := b.Health(); h == nil || !strings.Contains(h.Error(), "TMISS_GHOST") || !strings.Contains(h.Error(), "TMISS_GHOST2") {
		t.Errorf("bus Health = %v, want both missing pins named", h)
	}

	ghost := newPin(t, "TMISS_GHOST")
	newPin(t, "TMISS_GHOST2")
	setLevel(ghost, gpio.Low)
	if got := read(t, p); got != true { // configured on discovery: pull-up applied
		t.Fatalf("read after the pin appeared = %v", got)
	}
	if h := b.Health(); h != nil {
		t.Fatalf("bus Health after the pins appeared = %v", h)
	}
}

func TestNoGPIOAtAll(t *testing.T) {
	if len(gpioreg.All()) > 0 {
		t.Skip("this host (or another test) has GPIO pins registered")
	}
	m := parse(t, readCap("c", "bool", `{type: gpio, bus: gpio, pin: GPIO17}`))
	_, err := drivers.Open(context.Background(), m.Buses["gpio"])
	if !errors.Is(err, drivers.ErrOffline) || !strings.Contains(err.Error(), `gpio bus "gpio" (buses.gpio): no GPIO lines on this host`) {
		t.Fatalf("err = %v", err)
	}
	t.Log(err)
}

func TestReadAfterClose(t *testing.T) {
	newPin(t, "TCLOSE")
	b, pts := open(t, parse(t, doCap("c", `{type: gpio, bus: gpio, pin: TCLOSE}`)))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := pts["c"].Read(context.Background()); !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("read after Close: %v", err)
	}
	if err := pts["c"].Write(context.Background(), true); !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("write after Close: %v", err)
	}
	if !errors.Is(b.Health(), drivers.ErrOffline) {
		t.Fatal("Health after Close is not ErrOffline")
	}
}
