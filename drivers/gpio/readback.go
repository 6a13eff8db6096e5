package gpio

import (
	"periph.io/x/conn/v3/gpio"
	"periph.io/x/host/v3/bcm283x"
	"periph.io/x/host/v3/gpioioctl"
)

// outputReadable reports whether Read on p, while p drives an output,
// returns the driven level without side effects. It is a variable so that
// tests can exercise the other branch with fake pins.
//
// periph host v3.8.5's gpioioctl.GPIOLine.Read reconfigures any line that
// is not an input as an input with pull-up before reading (and Func calls
// Read): reading back a relay output would release it. bcm283x pins read
// the level register directly when /dev/gpiomem is mapped (valid for
// outputs too) but fall back to their gpioioctl line when it is not. Other
// backends (sysfs, allwinner, fakes) read outputs safely.
var outputReadable = func(p gpio.PinIO) bool {
	switch realPin(p).(type) {
	case *gpioioctl.GPIOLine:
		return false
	case *bcm283x.Pin:
		return bcmMapped()
	}
	return true
}

// bcmMapped reports whether bcm283x mapped the GPIO registers. The driver
// does not export that; PinsRead0To31 dereferences the mapping and panics
// (nil pointer) when there is none, so probe it under recover.
func bcmMapped() (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	_ = bcm283x.PinsRead0To31()
	return true
}
