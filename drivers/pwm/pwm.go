// Package pwm is physd's PWM driver: bus type "pwm" on the Linux kernel's
// PWM sysfs interface (/sys/class/pwm/pwmchipN), which is how a Raspberry
// Pi exposes its hardware PWM (dtoverlay=pwm or pwm-2chan in
// /boot/firmware/config.txt: GPIO18 is channel 0, GPIO19 channel 1) and
// how most PWM expander drivers do:
//
//	buses:
//	  pwm0: {type: pwm, chip: 0}                 # path: /sys/class/pwm/pwmchip0 by default
//	capabilities:
//	  - name: fan_speed                           # kind do, data_type float (or int), percent
//	    binding: {type: pwm, bus: pwm0, channel: 0, frequency_hz: 25000, duty_min: 20, duty_max: 100, initial: 0}
//
// The capability's value is a percentage 0..100 mapped linearly onto the
// duty cycle duty_min..duty_max (percent; defaults 0 and 100): a 4-wire
// PC fan that needs 20 % to spin takes duty_min: 20. duty_min above
// duty_max inverts the output, for a transistor stage between the pin and
// the load (an NPN or N-MOSFET pulling a fan's PWM wire low while the pin
// is high): duty_min: 80, duty_max: 0 is the fan at 20 % for value 0. A read reads the
// kernel's period, duty_cycle and enable back (a disabled channel reads
// 0 % duty), so a do_ is verified against what the kernel drives, not
// against what physd remembers. Open exports the channel if needed, sets
// the period, the duty for initial (default 0, so a restart leaves the
// output at its lowest) and enables it.
//
// Source: Linux Documentation/driver-api/pwm.rst, "Using PWMs with the
// sysfs interface" (export, period and duty_cycle in nanoseconds, enable).
package pwm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
)

func init() { drivers.RegisterDriver("pwm", drivers.Driver{Open: Open, Check: CheckBinding}) }

type busConfig struct {
	Chip *int    `yaml:"chip"`
	Path *string `yaml:"path"`
}

// Bus is one PWM chip.
type Bus struct {
	name string
	path string
	mu   sync.Mutex // one sysfs sequence at a time
	// exportWait bounds the wait for udev to create pwmN after an export.
	exportWait time.Duration
}

// Open is the drivers.Factory for bus type "pwm".
func Open(_ context.Context, b *manifest.Bus) (drivers.Bus, error) {
	if b == nil {
		return nil, errors.New("pwm: nil bus")
	}
	var cfg busConfig
	if errs := b.DecodeConfig(&cfg); len(errs) > 0 {
		return nil, errs
	}
	chip := 0
	if cfg.Chip != nil {
		if chip = *cfg.Chip; chip < 0 || chip > 63 {
			return nil, manifest.Errors{&manifest.Error{Pos: b.Pos, Field: b.FieldPath() + ".chip", Msg: fmt.Sprintf("chip %d is outside 0..63", chip),
				Fix: "use the N of /sys/class/pwm/pwmchipN (ls /sys/class/pwm)"}}
		}
	}
	path := fmt.Sprintf("/sys/class/pwm/pwmchip%d", chip)
	if cfg.Path != nil && strings.TrimSpace(*cfg.Path) != "" {
		path = strings.TrimSpace(*cfg.Path)
	}
	bus := &Bus{name: b.Name, path: path, exportWait: time.Second}
	if err := bus.Health(); err != nil {
		return nil, err
	}
	return bus, nil
}

// Health is nil while the chip's directory exists.
func (b *Bus) Health() error {
	if st, err := os.Stat(b.path); err != nil || !st.IsDir() {
		return fmt.Errorf("pwm bus %q: %s is missing: add dtoverlay=pwm (GPIO18) or dtoverlay=pwm-2chan (GPIO18, GPIO19) to /boot/firmware/config.txt and reboot: %w",
			b.name, b.path, drivers.ErrOffline)
	}
	return nil
}

// Close leaves the outputs as they are (as a GPIO output stays driven).
func (b *Bus) Close() error { return nil }

type bindingKeys struct {
	Channel     *int     `yaml:"channel"`
	FrequencyHz *float64 `yaml:"frequency_hz"`
	DutyMin     *float64 `yaml:"duty_min"`
	DutyMax     *float64 `yaml:"duty_max"`
	Initial     *float64 `yaml:"initial"`
}

type pointSpec struct {
	channel          int
	periodNS         int64
	dutyMin, dutyMax float64 // percent
	initial          float64 // value, percent
	dataType         string
	writable         bool
	tol              float64
}

func parseBinding(c *manifest.Capability) (*pointSpec, error) {
	p := manifest.NewBindingErrors(c)
	if c.Binding.Type != "pwm" {
		p.Add("type", fmt.Sprintf("binding type %q on a pwm bus", c.Binding.Type), "use type: pwm")
	}
	if strings.TrimSpace(c.Binding.Address) != "" {
		p.Add("address", "a pwm binding names its output with channel:, not an address", "remove address; add channel: N (GPIO18 is channel 0 with dtoverlay=pwm)")
	}
	var k bindingKeys
	if errs := p.DecodeBinding(nil, &k); len(errs) > 0 {
		return nil, errs
	}
	s := &pointSpec{dutyMax: 100, dataType: c.DataType, writable: c.Kind == manifest.KindDo, tol: c.Tolerance}
	switch {
	case k.Channel == nil:
		p.Add("channel", "required: which PWM output of the chip", "add channel: 0 (ls /sys/class/pwm/pwmchipN shows npwm)")
	case *k.Channel < 0 || *k.Channel > 255:
		p.Add("channel", fmt.Sprintf("channel %d is outside 0..255", *k.Channel), "use the channel number, e.g. 0")
	default:
		s.channel = *k.Channel
	}
	switch {
	case k.FrequencyHz == nil:
		p.Add("frequency_hz", "required: the PWM frequency", "add frequency_hz: 25000 for a 4-wire fan, 1000 for an LED dimmer, 50 for a servo")
	case *k.FrequencyHz < 0.1 || *k.FrequencyHz > 100e6 || math.IsNaN(*k.FrequencyHz):
		p.Add("frequency_hz", fmt.Sprintf("frequency_hz %v is outside 0.1..100000000", *k.FrequencyHz), "use the frequency the load expects, e.g. 25000")
	default:
		s.periodNS = int64(math.Round(1e9 / *k.FrequencyHz))
	}
	if k.DutyMin != nil {
		s.dutyMin = *k.DutyMin
	}
	if k.DutyMax != nil {
		s.dutyMax = *k.DutyMax
	}
	dutyOK := true
	for _, d := range []struct {
		key string
		v   float64
	}{{"duty_min", s.dutyMin}, {"duty_max", s.dutyMax}} {
		if d.v < 0 || d.v > 100 || math.IsNaN(d.v) {
			p.Add(d.key, fmt.Sprintf("%s %v is outside 0..100 (percent of the period)", d.key, d.v),
				"give the duty cycle in percent that value 0 (duty_min) and value 100 (duty_max) drive, e.g. duty_min: 20, duty_max: 100")
			dutyOK = false
		}
	}
	if dutyOK && s.dutyMin == s.dutyMax {
		p.Add("duty_max", fmt.Sprintf("duty_min and duty_max are both %v: every value would drive the same duty", s.dutyMin),
			"give the duty for value 100, e.g. duty_max: 100 (duty_max below duty_min inverts the output, for a transistor stage that pulls the line low)")
	}
	if k.Initial != nil {
		if !s.writable {
			p.Add("initial", "initial applies to do capabilities (outputs physd drives)", "remove initial")
		} else if *k.Initial < 0 || *k.Initial > 100 {
			p.Add("initial", fmt.Sprintf("initial %v is outside 0..100", *k.Initial), "use the percentage to drive at start, e.g. 0")
		} else {
			s.initial = *k.Initial
		}
	}
	if c.DataType != manifest.TypeFloat && c.DataType != manifest.TypeInt {
		p.AddCap("data_type", fmt.Sprintf("data_type %q: a PWM output takes a percentage", c.DataType), "use data_type float (or int), unit percent, range {min: 0, max: 100}")
	}
	if r := c.Range; r != nil && (r.Min < 0 || r.Max > 100) {
		p.AddCap("range", "a PWM output takes 0..100 (percent of duty_min..duty_max)", "use range: {min: 0, max: 100} or narrower")
	}
	if len(p.Errs) > 0 {
		return nil, p.Errs
	}
	return s, nil
}

// CheckBinding validates a pwm binding without touching sysfs, for
// `physd validate`.
func CheckBinding(c *manifest.Capability) error {
	_, err := parseBinding(c)
	return err
}

type point struct {
	b    *Bus
	s    *pointSpec
	dir  string
	what string
}

// Point opens a capability's binding: exports the channel if needed and,
// for a do capability, sets the period, the initial duty and enables it.
func (b *Bus) Point(c *manifest.Capability) (drivers.Point, error) {
	if c == nil {
		return nil, errors.New("pwm: nil capability")
	}
	s, err := parseBinding(c)
	if err != nil {
		return nil, err
	}
	p := &point{b: b, s: s, dir: filepath.Join(b.path, fmt.Sprintf("pwm%d", s.channel)), what: fmt.Sprintf("pwm %s channel %d", b.name, s.channel)}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := p.export(); err != nil {
		return nil, err
	}
	if s.writable {
		if err := p.apply(s.initial); err != nil {
			return nil, fmt.Errorf("%s: setting the initial duty: %w", p.what, err)
		}
	}
	return p, nil
}

// export makes the kernel create pwmN, and waits for it (udev applies the
// permissions a moment later).
func (p *point) export() error {
	if _, err := os.Stat(p.dir); err == nil {
		return nil
	}
	if err := os.WriteFile(filepath.Join(p.b.path, "export"), []byte(strconv.Itoa(p.s.channel)), 0); err != nil {
		return fmt.Errorf("%s: export: %v (is channel %d below the chip's npwm, and may this user write %s? add it to the gpio group): %w",
			p.what, err, p.s.channel, p.b.path, drivers.ErrOffline)
	}
	deadline := time.Now().Add(p.b.exportWait)
	for {
		if _, err := os.Stat(filepath.Join(p.dir, "duty_cycle")); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: exported, but %s did not appear within %v: %w", p.what, p.dir, p.b.exportWait, drivers.ErrOffline)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p *point) readInt(name string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(p.dir, name))
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s reads %q, not a number", name, strings.TrimSpace(string(b)))
	}
	return n, nil
}

func (p *point) writeInt(name string, v int64) error {
	return os.WriteFile(filepath.Join(p.dir, name), []byte(strconv.FormatInt(v, 10)), 0)
}

// dutyNS is the duty cycle in ns for a value in percent.
func (p *point) dutyNS(v float64) int64 {
	pct := p.s.dutyMin + (p.s.dutyMax-p.s.dutyMin)*v/100
	return int64(math.Round(float64(p.s.periodNS) * pct / 100))
}

// apply drives value v: period first (after zeroing a duty the new period
// could not hold, which the kernel refuses), then the duty, then enable.
func (p *point) apply(v float64) error {
	period, err := p.readInt("period")
	if err != nil {
		return err
	}
	if period != p.s.periodNS {
		if duty, err := p.readInt("duty_cycle"); err == nil && duty > p.s.periodNS {
			if err := p.writeInt("duty_cycle", 0); err != nil {
				return fmt.Errorf("duty_cycle: %w", err)
			}
		}
		if err := p.writeInt("period", p.s.periodNS); err != nil {
			return fmt.Errorf("period %d ns: %w", p.s.periodNS, err)
		}
	}
	if err := p.writeInt("duty_cycle", p.dutyNS(v)); err != nil {
		return fmt.Errorf("duty_cycle: %w", err)
	}
	if err := p.writeInt("enable", 1); err != nil {
		return fmt.Errorf("enable: %w", err)
	}
	return nil
}

// Read reads the kernel's state back as a percentage of duty_min..duty_max.
func (p *point) Read(ctx context.Context) (drivers.Reading, error) {
	if err := ctx.Err(); err != nil {
		return drivers.Reading{}, fmt.Errorf("%s: %w (%w)", p.what, drivers.ErrTimeout, err)
	}
	p.b.mu.Lock()
	period, err1 := p.readInt("period")
	duty, err2 := p.readInt("duty_cycle")
	enable, err3 := p.readInt("enable")
	p.b.mu.Unlock()
	if err := errors.Join(err1, err2, err3); err != nil {
		return drivers.Reading{}, fmt.Errorf("%s: %w (%w)", p.what, drivers.ErrOffline, err)
	}
	if period <= 0 {
		return drivers.Reading{}, fmt.Errorf("%s: period is %d ns: the channel is not configured", p.what, period)
	}
	if enable == 0 {
		duty = 0
	}
	pct := float64(duty) / float64(period) * 100
	v := (pct - p.s.dutyMin) / (p.s.dutyMax - p.s.dutyMin) * 100
	v = min(max(v, 0), 100) // outside duty_min..duty_max (e.g. disabled) reads as the nearer end
	if p.s.dataType == manifest.TypeInt {
		return drivers.Reading{Value: int64(math.Round(v)), At: time.Now()}, nil
	}
	return drivers.Reading{Value: v, At: time.Now()}, nil
}

// Write drives a percentage. A value outside 0..100 is refused before
// anything is written.
func (p *point) Write(ctx context.Context, v any) error {
	if !p.s.writable {
		return fmt.Errorf("%s: opened for a read capability: %w", p.what, drivers.ErrReadOnly)
	}
	var x float64
	switch n := v.(type) {
	case float64:
		x = n
	case int64:
		x = float64(n)
	default:
		return fmt.Errorf("%s: want a number, got %T: %w", p.what, v, drivers.ErrBadValue)
	}
	if x < 0 || x > 100 || math.IsNaN(x) {
		return fmt.Errorf("%s: %v is outside 0..100 %%: %w", p.what, x, drivers.ErrBadValue)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w (%w)", p.what, drivers.ErrOffline, err)
	}
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	if err := p.apply(x); err != nil {
		return fmt.Errorf("%s: %w", p.what, err)
	}
	return nil
}
