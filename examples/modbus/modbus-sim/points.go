package main

import (
	"fmt"
	"math"
	"time"

	"github.com/physd/physd/drivers/modbus/modbustest"
)

// The point bank (-points N): a large device for load tests, beside the
// boiler on the same unit. N input registers from 30101 (address
// pointsBase) hold int16 values (×0.1: 10.0 … 90.0) that move on a sine of
// their own: every fourth point swings ±40.0 with a period of 30 s to
// 2 min (a power reading), the others ±2.0 over 10 to 30 min (a voltage, a
// temperature). -setpoints M holding registers from 40101 keep what a host
// writes (any value), as a controller's setpoints do. The values depend
// only on the point's index and the time since start, so every instance
// serves the same plant.
const (
	pointsBase   = 100 // 30101 and 40101
	maxPoints    = 60_000
	maxSetpoints = 1_000
)

// pointBank moves the bank's point registers.
type pointBank struct {
	n      int
	start  time.Time
	amp    []float64 // register counts (0.1 of the value each)
	period []float64 // seconds
	phase  []float64 // radians
	regs   []uint16  // reused each step
}

// newPointBank sizes the boiler's bank for n points and setpoints holding
// registers, and lets writes to the setpoints through its write checks.
func newPointBank(b *boiler, n, setpoints int, now time.Time) (*pointBank, error) {
	if n < 0 || n > maxPoints {
		return nil, fmt.Errorf("-points %d: use 0 to %d", n, maxPoints)
	}
	if setpoints < 0 || setpoints > maxSetpoints {
		return nil, fmt.Errorf("-setpoints %d: use 0 to %d", setpoints, maxSetpoints)
	}
	b.bank.Size = max(b.bank.Size, pointsBase+max(n, setpoints))
	b.setpoints = setpoints
	p := &pointBank{n: n, start: now, amp: make([]float64, n), period: make([]float64, n), phase: make([]float64, n), regs: make([]uint16, n)}
	for i := range n {
		r := mix(uint64(i))
		frac := func(k int) float64 { return float64((r>>(16*k))&0xffff) / 0xffff }
		if i%4 == 0 {
			p.amp[i], p.period[i] = 400, 30+90*frac(0)
		} else {
			p.amp[i], p.period[i] = 20, 600+1200*frac(0)
		}
		p.phase[i] = 2 * math.Pi * frac(1)
	}
	p.step(b.bank, now)
	return p, nil
}

// step writes every point's value at now.
func (p *pointBank) step(bank *modbustest.Bank, now time.Time) {
	if p == nil || p.n == 0 {
		return
	}
	t := now.Sub(p.start).Seconds()
	for i := range p.n {
		v := 500 + p.amp[i]*math.Sin(2*math.Pi*t/p.period[i]+p.phase[i])
		p.regs[i] = uint16(int16(math.Round(v)))
	}
	bank.SetInput(unit, pointsBase, p.regs...)
}

// mix is splitmix64: a point's own pseudo-random numbers from its index.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
