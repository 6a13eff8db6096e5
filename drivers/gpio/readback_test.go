package gpio

import (
	"testing"

	"periph.io/x/conn/v3/gpio"
	"periph.io/x/conn/v3/gpio/gpioreg"
	"periph.io/x/host/v3/bcm283x"
	"periph.io/x/host/v3/gpioioctl"
)

func TestOutputReadable(t *testing.T) {
	if bcmMapped() {
		t.Skip("bcm283x registers are mapped: this is a Raspberry Pi")
	}
	fake := &testPin{N: "TREADABLE"}
	for _, tc := range []struct {
		name string
		pin  gpio.PinIO
		want bool
	}{
		{"gpioioctl line", &gpioioctl.GPIOLine{}, false},
		{"bcm283x without /dev/gpiomem", &bcm283x.Pin{}, false},
		{"fake", fake, true},
	} {
		if got := outputReadable(tc.pin); got != tc.want {
			t.Errorf("%s: outputReadable = %v, want %v", tc.name, got, tc.want)
		}
	}
	// Aliases are unwrapped to the real pin.
	register(t, fake)
	if err := gpioreg.RegisterAlias("TREADABLE_ALIAS", "TREADABLE"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gpioreg.Unregister("TREADABLE_ALIAS") })
	if p := gpioreg.ByName("TREADABLE_ALIAS"); realPin(p) != gpio.PinIO(fake) || !outputReadable(p) {
		t.Errorf("alias not unwrapped: %v", p)
	}
}
