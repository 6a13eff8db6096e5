package node_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/internal/testrig"
	"github.com/physd/physd/manifest"
)

// doubtful is a device that reports its value uncertain while told to (an
// OPC UA Uncertain status code).
var doubtful atomic.Value // string: the reason; "" vouches for the value

func init() {
	drivers.Register("doubtful", func(context.Context, *manifest.Bus) (drivers.Bus, error) { return doubtfulBus{}, nil })
}

type doubtfulBus struct{}

func (doubtfulBus) Point(*manifest.Capability) (drivers.Point, error) { return doubtfulPoint{}, nil }
func (doubtfulBus) Health() error                                     { return nil }
func (doubtfulBus) Close() error                                      { return nil }

type doubtfulPoint struct{}

func (doubtfulPoint) Read(context.Context) (drivers.Reading, error) {
	why, _ := doubtful.Load().(string)
	return drivers.Reading{Value: 19.75, Uncertain: why}, nil
}
func (doubtfulPoint) Write(context.Context, any) error { return drivers.ErrReadOnly }

// TestReadUncertain: a reading the device does not vouch for is served
// with quality degraded and the device's reason; the next one it vouches
// for is good again.
func TestReadUncertain(t *testing.T) {
	m, err := manifest.Parse("doubtful.yml", []byte(`physmcp_version: "0.1"
device: {id: doubtful_node, type: test, location: {zone: lab}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  dev: {type: doubtful}
capabilities:
  - name: temperature
    kind: read
    description: A temperature the device may doubt.
    binding: {type: virtual, bus: dev, address: t}
    data_type: float
    unit: celsius
    cache_ttl_ms: 0
    semantic_tags: [temperature]
`))
	if err != nil {
		t.Fatal(err)
	}
	n := testrig.OpenManifest(t, m, "", nil).Node

	doubtful.Store("OPC UA status UncertainLastUsableValue")
	o, err := n.Read(t.Context(), "read_temperature", 0)
	if err != nil {
		t.Fatal(err)
	}
	if o.Quality != "degraded" || o.Value != 19.75 || !strings.Contains(o.Reason, "UncertainLastUsableValue") {
		t.Fatalf("uncertain reading: %+v, want degraded with the device's reason", o)
	}
	doubtful.Store("")
	if o, err = n.Read(t.Context(), "read_temperature", 0); err != nil || o.Quality != "good" || o.Reason != "" {
		t.Fatalf("vouched reading: %+v %v, want good", o, err)
	}
}
