package i2c

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/physd/physd/drivers"
)

// The fake's interleaving detector works: a Tx to another device between
// a sensor's command and its read is flagged.
func TestFakeDetectsInterleaving(t *testing.T) {
	fb := newFakeBus()
	fb.add(0x44, &fakeSHT{})
	fb.add(0x48, &fakeRegs{})
	_ = fb.tx(0x44, []byte{0x24, 0x00}, nil)
	_ = fb.tx(0x48, []byte{0}, make([]byte, 1))
	if len(fb.interleavings()) != 1 {
		t.Fatalf("interleavings = %v, want one", fb.interleavings())
	}
}

// Two command-style sensors and a register device on one physical bus,
// reached through two manifest bus entries, read from many goroutines:
// every command/wait/read stays atomic and every value is right.
func TestConcurrentDevicesStayAtomic(t *testing.T) {
	fb := newFakeBus()
	a := &fakeSHT{rawT: 0x6666, minWait: time.Millisecond}
	b := &fakeSHT{rawT: 0x0000, minWait: time.Millisecond}
	regs := &fakeRegs{}
	regs.poke(0, 0x19, 0x00)
	fb.add(0x44, a)
	fb.add(0x45, b)
	fb.add(0x48, regs)
	name := registerFake(t, fb)

	const cmd = `command: 0x2400, wait_ms: 1, read_bytes: 6, crc: sht3x, scale: 175/65535, offset: -45}`
	m := parse(t, "{type: i2c, bus: "+name+"}",
		readCap("ta", "float", `{type: i2c, bus: i2c1, address: 0x44, `+cmd)+
			readCap("tb", "float", `{type: i2c, bus: i2c1, address: 0x45, `+cmd)+
			readCap("reg", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0, width: 16, signed: true, scale: 0.00390625}`))
	bus1 := openBus(t, m)
	bus2 := openBus(t, m) // a second handle on the same wire shares its lock
	p1, p2 := points(t, m, bus1), points(t, m, bus2)
	want := map[string]float64{"ta": 25, "tb": -45, "reg": 25}

	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := range 8 {
		pts := p1
		if g%2 == 1 {
			pts = p2
		}
		wg.Go(func() {
			for i := range 10 {
				name := []string{"ta", "tb", "reg"}[(g+i)%3]
				v, err := readCtx(t, pts[name])
				if err != nil {
					errs <- fmt.Errorf("%s: %w", name, err)
					return
				}
				if f, _ := v.(float64); f != want[name] && !(name != "reg" && abs(f-want[name]) < 1e-9) {
					errs <- fmt.Errorf("%s = %v, want %v", name, v, want[name])
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if il := fb.interleavings(); len(il) > 0 {
		t.Fatalf("%d interleaved transactions, e.g. %s", len(il), il[0])
	}
	for _, p := range []drivers.Point{p1["ta"], p2["tb"]} {
		if h := p.(drivers.PointHealth).Health(); h != nil {
			t.Error(h)
		}
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}
