package i2c

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/periphhost"
	"github.com/physd/physd/manifest"
	"periph.io/x/conn/v3/i2c/i2creg"
)

func init() { drivers.RegisterDriver("i2c", drivers.Driver{Open: Open, Check: CheckBinding}) }

// busConfig is the bus entry's own keys.
type busConfig struct {
	Bus       *string `yaml:"bus"`
	DownAfter *int    `yaml:"down_after"`
}

const defaultDownAfter = 3

// Open is the drivers.Factory for bus type "i2c". Configuration errors are
// manifest.Errors; a bus that is missing or cannot be opened is an error
// wrapping drivers.ErrOffline that says what to check on the gateway.
func Open(_ context.Context, b *manifest.Bus) (drivers.Bus, error) {
	if b == nil {
		return nil, errors.New("i2c: nil bus")
	}
	field := b.FieldPath()
	var cfg busConfig
	if errs := b.DecodeConfig(&cfg); len(errs) > 0 {
		return nil, errs
	}
	var bad manifest.Errors
	if cfg.Bus == nil || strings.TrimSpace(*cfg.Bus) == "" {
		bad = append(bad, &manifest.Error{Pos: b.Pos, Field: field + ".bus", Msg: "required: which I²C bus",
			Fix: `add bus: "1" for /dev/i2c-1 (the Raspberry Pi header pins 3 and 5)`})
	}
	downAfter := defaultDownAfter
	if cfg.DownAfter != nil {
		if downAfter = *cfg.DownAfter; downAfter < 1 || downAfter > 1000 {
			bad = append(bad, &manifest.Error{Pos: b.Pos, Field: field + ".down_after", Msg: fmt.Sprintf("down_after %d is outside 1..1000", downAfter),
				Fix: "use the number of failed transactions in a row after which a device is marked down, e.g. 3"})
		}
	}
	if len(bad) > 0 {
		return nil, bad
	}
	arg := strings.TrimSpace(*cfg.Bus)

	hostNote := initHost()
	ref := findRef(arg)
	if ref == nil {
		return nil, notFound(b.Name, arg, hostNote)
	}
	bc, err := ref.Open()
	if err != nil {
		return nil, fmt.Errorf("i2c bus %q (%s, buses.%s) cannot be opened: %v; check that this user may open it (sudo usermod -aG i2c $USER, then log in again): %w",
			arg, ref.Name, b.Name, err, drivers.ErrOffline)
	}
	return &Bus{
		name: b.Name, arg: arg, key: ref.Name, downAfter: downAfter,
		lock: lockFor(ref.Name), reviveEvery: time.Second, bc: bc,
	}, nil
}

// initHost initialises periph once per process (shared with the other
// periph drivers) and returns the reasons this driver's hardware is missing.
func initHost() string { return periphhost.Notes("i2c") }

// findRef resolves a bus argument the way i2creg.Open does (name, alias or
// number), but returns the registry entry so the bus's canonical name is
// known: it keys the per-bus lock and the "is it still there" check.
func findRef(arg string) *i2creg.Ref {
	num, numErr := strconv.Atoi(arg)
	for _, r := range i2creg.All() {
		if r.Name == arg || slices.Contains(r.Aliases, arg) || (numErr == nil && num >= 0 && r.Number == num) {
			return r
		}
	}
	return nil
}

// devExists reports whether a /dev node backing a bus is still present;
// buses that are not device files (fakes, USB bridges) count as present.
func devExists(name string) bool {
	if !strings.HasPrefix(name, "/dev/") {
		return true
	}
	_, err := os.Stat(name)
	return err == nil
}

// notFound explains a missing bus in terms of what to check on a Pi.
func notFound(busName, arg, note string) error {
	var have []string
	for _, r := range i2creg.All() {
		have = append(have, r.Name)
	}
	avail := "none"
	if len(have) > 0 {
		avail = strings.Join(have, ", ")
	}
	msg := fmt.Sprintf("i2c bus %q (buses.%s) not found: is dtparam=i2c_arm=on set in /boot/firmware/config.txt (then reboot) and is the i2c-dev module loaded (sudo modprobe i2c-dev)? available buses: %s",
		arg, busName, avail)
	if note != "" {
		msg += " (" + note + ")"
	}
	return fmt.Errorf("%s: %w", msg, drivers.ErrOffline)
}
