package modbus

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"testing"

	"github.com/physd/physd/drivers"
)

// Quantize says what the device holds after a write, and a refusal names
// values that are themselves writable. Each accepted value is written to
// the server and read back: the read-back equals Quantize's answer.
func TestQuantize(t *testing.T) {
	srv, _ := peer(t)
	b := openTCP(t, srv.Addr, "")
	type tc struct {
		capType, binding string
		v, want          any
		refused          string // non-empty: refused, message contains it
	}
	f32 := func(x float64) float64 { return float64(float32(x)) }
	tenth := 0.1 // a variable: constant arithmetic would be exact
	cases := []tc{
		{"float", "data_type: float32", 0.1, f32(0.1), ""},
		{"float", "data_type: float32", 21.5, 21.5, ""},
		{"float", "data_type: float32, scale: 0.1", 0.1, f32(1) * tenth, ""},
		{"float", "data_type: float32", 1e39, nil, "beyond the float32 range"},
		{"float", "data_type: float32", 1e-50, nil, "too small for a float32"},
		{"float", "data_type: int16, scale: 0.1", 21.5, 21.5, ""},
		{"float", "data_type: int16, scale: 0.1", 0.3, 3 * tenth, ""}, // 0.30000000000000004, what a read returns
		{"float", "data_type: int16, scale: 0.1", 21.55, nil, "nearest writable values are 21.5 and 21.6"},
		{"float", "data_type: uint16, scale: 0.1, offset: -40", 7000.0, nil, "nearest writable value is 6513.5"},
		{"float", "data_type: int64", 9.3e18, nil, "nearest writable value is 9223372036854775000"},
		{"float", "data_type: uint64", -5.0, nil, "nearest writable value is 0"},
		{"float", "data_type: float64, scale: 0.1", 0.7, 0.7 / tenth * tenth, ""},
		{"int", "data_type: int64", int64(math.MaxInt64), int64(math.MaxInt64), ""},
		{"int", "data_type: int64", int64(math.MinInt64), int64(math.MinInt64), ""},
		{"int", "data_type: uint64", int64(math.MaxInt64), int64(math.MaxInt64), ""},
		{"int", "data_type: uint64", int64(1<<53 + 1), int64(1<<53 + 1), ""},
		{"int", "data_type: uint64", int64(-1), nil, "nearest writable value is 0"},
		{"int", "data_type: int16", int64(40000), nil, "nearest writable value is 32767"},
		{"int", "data_type: uint32, scale: 10, offset: 5", int64(27), nil, "nearest writable values are 25 and 35"},
		{"int", "data_type: uint16, scale: 10, offset: 5", int64(1_000_000), nil, "nearest writable value is 655355"},
		{"int", "data_type: int32", 2.5, nil, "nearest writable values are 2 and 3"},
		{"bool", "data_type: uint16", true, true, ""},
	}
	num := regexp.MustCompile(`-?[0-9][0-9.e+-]*`)
	for i, c := range cases {
		t.Run(fmt.Sprintf("%s_%s_%v", c.capType, c.binding, c.v), func(t *testing.T) {
			p := pointOn(t, b, fmt.Sprintf(`{name: q, kind: do, data_type: %s, binding: {type: modbus, table: holding, address: %d, %s}}`, c.capType, 8*i, c.binding))
			q := p.(drivers.Quantizer)
			got, err := q.Quantize(c.v)
			if c.refused != "" {
				if !errors.Is(err, drivers.ErrBadValue) {
					t.Fatalf("Quantize(%v) = %v, %v; want a refusal", c.v, got, err)
				}
				mustContain(t, err, c.refused)
				if werr := writeCtx(p, c.v); !errors.Is(werr, drivers.ErrBadValue) {
					t.Fatalf("Write(%v) = %v, want the same refusal", c.v, werr)
				}
				// Every value the refusal names is writable.
				_, tail, _ := cutAfter(err.Error(), "nearest writable")
				for _, s := range num.FindAllString(tail, -1) {
					var sv any = s
					if c.capType == "int" {
						n, perr := strconv.ParseInt(s, 10, 64)
						if perr != nil {
							t.Fatalf("suggestion %q: %v", s, perr)
						}
						sv = n
					} else {
						f, _ := strconv.ParseFloat(s, 64)
						sv = f
					}
					if _, err := q.Quantize(sv); err != nil {
						t.Errorf("suggested %v is not writable: %v", sv, err)
					}
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("Quantize(%v) = %v (%T), %v; want %v", c.v, got, got, err, c.want)
			}
			if err := writeCtx(p, c.v); err != nil {
				t.Fatal(err)
			}
			if rb := readOK(t, p); rb != got {
				t.Fatalf("read back %v, Quantize said %v", rb, got)
			}
		})
	}
}

func cutAfter(s, sep string) (string, string, bool) {
	for i := 0; i+len(sep) <= len(s); i++ {
		if s[i:i+len(sep)] == sep {
			return s[:i], s[i+len(sep):], true
		}
	}
	return s, "", false
}
