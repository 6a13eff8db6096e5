package gpio

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/periphhost"
	"github.com/physd/physd/manifest"
	"periph.io/x/conn/v3/gpio/gpioreg"
)

func init() { drivers.RegisterDriver("gpio", drivers.Driver{Open: Open, Check: CheckBinding}) }

// busConfig is the bus entry's own keys: none yet, decoded strictly so a
// stray key is reported rather than ignored.
type busConfig struct{}

// Open is the drivers.Factory for bus type "gpio". A host without any GPIO
// line is an error wrapping drivers.ErrOffline that says what to check.
func Open(_ context.Context, b *manifest.Bus) (drivers.Bus, error) {
	if b == nil {
		return nil, errors.New("gpio: nil bus")
	}
	field := b.FieldPath()
	var cfg busConfig
	if errs := b.DecodeConfig(&cfg); len(errs) > 0 {
		return nil, errs
	}
	note := initHost()
	if len(gpioreg.All()) == 0 {
		msg := fmt.Sprintf("gpio bus %q (%s): no GPIO lines on this host: is /dev/gpiochip0 present and readable by this user (sudo usermod -aG gpio $USER)?", b.Name, field)
		if note != "" {
			msg += " (" + note + ")"
		}
		return nil, fmt.Errorf("%s: %w", msg, drivers.ErrOffline)
	}
	return &Bus{name: b.Name, pins: map[string]*pinState{}, poll: 250 * time.Millisecond, retryEvery: time.Second}, nil
}

// initHost initialises periph once per process (shared with the other
// periph drivers) and returns the reasons this driver's hardware is missing.
func initHost() string { return periphhost.Notes("gpio", "bcm283x") }
