package i2c

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/physd/physd/drivers"
	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/i2c/i2creg"
)

func TestRegistered(t *testing.T) {
	if _, ok := drivers.Lookup("i2c"); !ok {
		t.Fatal(`bus type "i2c" is not registered`)
	}
}

// A gateway without the bus still runs: Open returns an error that names
// the bus and says what to check, and the node marks the bus unavailable.
func TestMissingBus(t *testing.T) {
	m := parse(t, `{type: i2c, bus: "7"}`, readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0}`))
	b, err := drivers.Open(context.Background(), m.Buses["i2c1"])
	if err == nil {
		b.Close()
		t.Skip("this machine has an I²C bus 7")
	}
	if !errors.Is(err, drivers.ErrOffline) {
		t.Errorf("err does not wrap ErrOffline: %v", err)
	}
	for _, want := range []string{`i2c bus "7" (buses.i2c1) not found`, "dtparam=i2c_arm=on", "i2c-dev", "available buses:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	t.Log(err)
}

func TestBusResolvesNameAliasAndNumber(t *testing.T) {
	fb := newFakeBus()
	fb.add(0x48, &fakeRegs{})
	const name = "fake-resolve"
	if err := i2creg.Register(name, []string{"FAKEBUS"}, 97, func() (i2c.BusCloser, error) { return &fakeHandle{bus: fb}, nil }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = i2creg.Unregister(name) })
	for _, arg := range []string{name, "FAKEBUS", "97"} {
		m := parse(t, `{type: i2c, bus: "`+arg+`"}`, readCap("c", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0}`))
		b := openBus(t, m)
		if got := b.(*Bus).key; got != name {
			t.Errorf("bus %q resolved to %q", arg, got)
		}
		if b.(*Bus).lock != lockFor(name) {
			t.Errorf("bus %q does not share the physical bus's lock", arg)
		}
	}
}

// An adapter that disappears takes the bus down (Health names it, points
// fail with ErrOffline without touching the wire) and the bus reopens
// once it is back.
func TestBusGoneAndBack(t *testing.T) {
	fb := newFakeBus()
	fb.add(0x48, &fakeRegs{})
	const name = "fake-unplug"
	register := func() {
		t.Helper()
		if err := i2creg.Register(name, nil, -1, func() (i2c.BusCloser, error) {
			fb.opens.Add(1)
			return &fakeHandle{bus: fb}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	register()
	t.Cleanup(func() { _ = i2creg.Unregister(name) })
	m := parse(t, "{type: i2c, bus: "+name+"}", readCap("t", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0}`))
	bus := openBus(t, m)
	p := points(t, m, bus)["t"]
	mustRead(t, p)

	// Unplug: the registry entry goes and every Tx fails.
	_ = i2creg.Unregister(name)
	fb.setUnplugged(true)
	if _, err := readCtx(t, p); !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("read on an unplugged bus: %v", err)
	}
	h := bus.Health()
	if !errors.Is(h, drivers.ErrOffline) || !strings.Contains(h.Error(), "is gone") || !strings.Contains(h.Error(), "buses.i2c1") {
		t.Fatalf("Health = %v", h)
	}
	txs := fb.txs
	if _, err := readCtx(t, p); !errors.Is(err, drivers.ErrOffline) || fb.txs != txs {
		t.Fatalf("a gone bus must fail fast without Tx: %v (%d Tx)", err, fb.txs-txs)
	}
	if err := p.Write(context.Background(), 1.0); !errors.Is(err, drivers.ErrReadOnly) {
		t.Fatalf("write: %v", err)
	}

	// Plug back in: the next Health (or read) after reviveEvery reopens.
	fb.setUnplugged(false)
	register()
	bus.(*Bus).reviveEvery = 0
	if h := bus.Health(); h != nil {
		t.Fatalf("Health after replug = %v", h)
	}
	mustRead(t, p)
	if n := fb.opens.Load(); n != 2 {
		t.Fatalf("%d opens, want 2 (initial + reopen)", n)
	}
}

// A do point on a gone bus refuses with ErrOffline: nothing was written.
func TestWriteOnGoneBus(t *testing.T) {
	fb := newFakeBus()
	regs := &fakeRegs{}
	fb.add(0x48, regs)
	name := registerFake(t, fb)
	m := parse(t, "{type: i2c, bus: "+name+"}", doCap("sp", "int", `{type: i2c, bus: i2c1, address: 0x48, register: 1}`, ""))
	bus := openBus(t, m)
	p := points(t, m, bus)["sp"]
	_ = i2creg.Unregister(name)
	fb.setUnplugged(true)
	if err := p.Write(context.Background(), int64(5)); err == nil || errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("first write hits the wire and fails with an unknown outcome: %v", err)
	}
	if err := p.Write(context.Background(), int64(5)); !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("write on a known-gone bus: %v", err)
	}
	if regs.writes != 0 {
		t.Fatal("a write reached the device")
	}
}

func TestCheckBindingNeedsNoBus(t *testing.T) {
	m := parse(t, `{type: i2c, bus: "does-not-exist"}`, readCap("c", "float", shtTemp))
	if err := CheckBinding(m.Capabilities[0]); err != nil {
		t.Fatal(err)
	}
}
