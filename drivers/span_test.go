package drivers_test

import (
	"context"
	"strings"
	"testing"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
)

type spanPoint struct {
	space        string
	start, count uint64
}

func (spanPoint) Read(context.Context) (drivers.Reading, error) { return drivers.Reading{}, nil }
func (spanPoint) Write(context.Context, any) error              { return nil }
func (p spanPoint) WriteSpan() (string, uint64, uint64, string) {
	return p.space, p.start, p.count, p.space
}

// TestSharedActuators: two do_ capabilities writing overlapping addresses of
// one space are refused; reads, other spaces and adjacent ranges are not.
func TestSharedActuators(t *testing.T) {
	do := func(name string) *manifest.Capability { return &manifest.Capability{Name: name, Kind: manifest.KindDo} }
	read := &manifest.Capability{Name: "r", Kind: manifest.KindRead}
	for _, tc := range []struct {
		name   string
		caps   []*manifest.Capability
		points []drivers.Point
		want   string
	}{
		{"float32 over an int16", []*manifest.Capability{do("sp"), do("raw")},
			[]drivers.Point{spanPoint{"unit 1 holding", 100, 2}, spanPoint{"unit 1 holding", 101, 1}}, "sp and raw"},
		{"same point", []*manifest.Capability{do("a"), do("b")},
			[]drivers.Point{spanPoint{"plant", 3, 1}, spanPoint{"plant", 3, 1}}, "a and b"},
		{"adjacent", []*manifest.Capability{do("a"), do("b")},
			[]drivers.Point{spanPoint{"unit 1 holding", 100, 2}, spanPoint{"unit 1 holding", 102, 2}}, ""},
		{"other unit", []*manifest.Capability{do("a"), do("b")},
			[]drivers.Point{spanPoint{"unit 1 holding", 100, 2}, spanPoint{"unit 2 holding", 100, 2}}, ""},
		{"a read beside", []*manifest.Capability{do("a"), read},
			[]drivers.Point{spanPoint{"plant", 3, 1}, spanPoint{"plant", 3, 1}}, ""},
	} {
		err := drivers.SharedActuators("bus", tc.caps, tc.points)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
}
