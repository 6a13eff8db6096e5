package gpio

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"periph.io/x/conn/v3/gpio/gpioreg"
	"periph.io/x/host/v3"
)

func init() { drivers.Register("gpio", Open) }

// busConfig is the bus entry's own keys: none yet, decoded strictly so a
// stray key is reported rather than ignored.
type busConfig struct{}

// Open is the drivers.Factory for bus type "gpio". A host without any GPIO
// line is an error wrapping drivers.ErrOffline that says what to check.
func Open(_ context.Context, b *manifest.Bus) (drivers.Bus, error) {
	if b == nil {
		return nil, errors.New("gpio: nil bus")
	}
	field := b.Field
	if field == "" {
		field = "buses." + b.Name
	}
	var cfg busConfig
	if errs := manifest.DecodeNode(b.Pos.File, b.Config, field, &cfg); len(errs) > 0 {
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

var (
	hostOnce sync.Once
	hostNote string
)

// initHost runs periph's host.Init once per process (it is idempotent and
// shared with the i2c driver) and keeps the GPIO drivers' skip or failure
// reasons for error messages: Init itself only fails on driver-graph bugs.
func initHost() string {
	hostOnce.Do(func() {
		st, err := host.Init()
		if err != nil {
			hostNote = "periph host.Init: " + err.Error()
			return
		}
		var notes []string
		for _, f := range slices.Concat(st.Failed, st.Skipped) {
			if n := f.D.String(); strings.Contains(n, "gpio") || strings.Contains(n, "bcm283x") {
				notes = append(notes, f.String())
			}
		}
		hostNote = strings.Join(notes, "; ")
	})
	return hostNote
}
