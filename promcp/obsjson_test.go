package promcp

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestAppendJSONMatchesMarshal: the direct encoding and json.Marshal agree
// byte for byte, on the values a plant gives and on the edges of the
// formats (exponents, negative zero, escapes, odd timestamps).
func TestAppendJSONMatchesMarshal(t *testing.T) {
	ts := time.Date(2026, 12, 5, 13, 1, 2, 345678900, time.UTC)
	values := []any{nil, 0.0, math.Copysign(0, -1), 1.0, -1.5, 21.35, 1e-6, 9.99e-7, 1e-7, 1e20, 1e21, 1.5e300, -2.5e-300,
		math.SmallestNonzeroFloat64, math.MaxFloat64, 123456789.125, int64(-42), 7, true, false, "auto", "<b>", "é", "a\"b",
		math.NaN(), math.Inf(1), float32(1.25), []int{1}, uint8(3)}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		values = append(values, (r.Float64()-0.5)*math.Pow(10, float64(r.IntN(60)-30)))
	}
	obs := []Observation{
		{Unit: "celsius", Timestamp: ts, Quality: QualityGood, Capability: "read_t", Source: "gw1", AgeMS: 12},
		{Unit: "", Timestamp: ts.In(time.FixedZone("x", 3600)), Quality: QualityError, Capability: "read_t", Source: "gw1", Site: "s1", AgeMS: -1, Cached: true, Reason: "timeout: device did not answer"},
		{Unit: "°C", Timestamp: time.Time{}, Quality: QualityStale, Capability: "read_t", Source: "gw<1>"},
		{Timestamp: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), Capability: "read_t"},
		{Timestamp: ts, Capability: "read_t", Reason: "line\nbreak"},
	}
	for _, o := range obs {
		for _, v := range values {
			o.Value = v
			want, werr := json.Marshal(o)
			got, gerr := o.AppendJSON([]byte("prefix"))
			if (werr != nil) != (gerr != nil) {
				t.Fatalf("%#v: Marshal error %v, AppendJSON error %v", o, werr, gerr)
			}
			if werr == nil && !bytes.Equal(got, append([]byte("prefix"), want...)) {
				t.Fatalf("%#v:\nAppendJSON %s\nMarshal          %s", o, got, want)
			}
		}
	}
}

func BenchmarkObservationJSON(b *testing.B) {
	o := Observation{Value: 21.35, Unit: "celsius", Timestamp: time.Now().UTC(), Quality: QualityGood, Capability: "read_m01_p001", Source: "plant"}
	b.Run("Marshal", func(b *testing.B) {
		for b.Loop() {
			_, _ = json.Marshal(o)
		}
	})
	b.Run("AppendJSON", func(b *testing.B) {
		for b.Loop() {
			_, _ = o.AppendJSON(nil)
		}
	})
}
