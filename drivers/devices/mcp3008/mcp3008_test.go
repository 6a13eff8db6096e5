package mcp3008_test

import (
	"testing"

	"github.com/physd/physd/drivers/devices/mcp3008"
	"github.com/physd/physd/drivers/devices/mcp3008/mcp3008fake"
)

// TestRequest: the command bytes of Figure 6-1 / Table 5-2.
func TestRequest(t *testing.T) {
	for _, c := range []struct {
		ch   int
		diff bool
		want [3]byte
	}{{0, false, [3]byte{0x01, 0x80, 0}}, {7, false, [3]byte{0x01, 0xF0, 0}}, {0, true, [3]byte{0x01, 0x00, 0}}, {3, true, [3]byte{0x01, 0x30, 0}}} {
		w, err := mcp3008.Request(c.ch, c.diff)
		if err != nil || [3]byte(w) != c.want {
			t.Errorf("ch %d diff %v: % X %v", c.ch, c.diff, w, err)
		}
	}
	if _, err := mcp3008.Request(8, false); err == nil {
		t.Error("channel 8 accepted")
	}
}

func TestCode(t *testing.T) {
	for _, c := range []struct {
		r    []byte
		want int
	}{{[]byte{0, 0x03, 0xFF}, 1023}, {[]byte{0, 0x02, 0x00}, 512}, {[]byte{0xFF, 0xF8, 0x01}, 1}} {
		if got, err := mcp3008.Code(c.r); err != nil || got != c.want {
			t.Errorf("% X: %d %v, want %d", c.r, got, err, c.want)
		}
	}
	if _, err := mcp3008.Code([]byte{0xFF, 0xFF, 0xFF}); err == nil {
		t.Error("a floating MISO (null bit 1) accepted")
	}
	if v := mcp3008.Volts(512, 3.3); v != 1.65 {
		t.Errorf("512 at 3.3 V = %v, want 1.65", v)
	}
}

func TestFake(t *testing.T) {
	chip := mcp3008fake.New(3.3)
	conn, err := chip.Connect(mcp3008.MaxSpeed, mcp3008.Mode, 8)
	if err != nil {
		t.Fatal(err)
	}
	chip.SetInput(2, 1.65)
	chip.SetInput(3, 0.5)
	chip.SetInput(7, 5) // above VREF: full scale
	for _, c := range []struct {
		ch   int
		diff bool
		want int
	}{{2, false, 512}, {7, false, 1023}, {2, true, 356}, {3, true, 0}, {0, false, 0}} {
		if got, err := mcp3008.Read(conn, c.ch, c.diff); err != nil || got != c.want {
			t.Errorf("ch %d diff %v: %d %v, want %d", c.ch, c.diff, got, err, c.want)
		}
	}
	chip.SetAbsent(true)
	if _, err := mcp3008.Read(conn, 0, false); err == nil {
		t.Error("no chip: read succeeded")
	}
}
