package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
)

// Values as they cross the node: a capability's data type decides the Go
// type (float64, int64, bool, string), its range and precision what is a
// sane value. Both paths use these: read checks what a driver returned,
// do checks what a caller sent and what the device shows afterwards.

// DecodeValueFor decodes a do_ value for a tool (see DecodeValue).
func (n *Node) DecodeValueFor(tool string, raw json.RawMessage) (any, error) {
	cs, err := n.capability(tool)
	if err != nil {
		return nil, err
	}
	return DecodeValue(cs.cap, raw)
}

// DecodeValue checks a do_ value against the capability's data type and
// returns it normalised (float64, int64, bool or string). Integers are
// exact over the whole int64 range (a JSON integer is parsed as text, not
// through a float64). Errors name the field and the fix.
func DecodeValue(c *manifest.Capability, raw json.RawMessage) (any, error) {
	raw = bytes.TrimSpace(raw)
	bad := func(msg string) error {
		return &InputError{Field: "value", Msg: msg + "; " + exampleFor(c)}
	}
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, bad("required")
	}
	kind := jsonKind(raw)
	switch c.DataType {
	case manifest.TypeFloat:
		if kind != "number" {
			return nil, bad("must be a JSON number (data_type float), got " + kind)
		}
		f, err := strconv.ParseFloat(string(raw), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, bad("number " + truncate(string(raw)) + " is not finite")
		}
		return f, nil
	case manifest.TypeInt:
		if kind != "number" {
			return nil, bad("must be a JSON number (data_type int), got " + kind)
		}
		return decodeInt(string(raw), bad)
	case manifest.TypeBool:
		if kind != "boolean" {
			return nil, bad("must be true or false (data_type bool), got " + kind)
		}
		return bytes.Equal(raw, []byte("true")), nil
	case manifest.TypeEnum, manifest.TypeString:
		if kind != "string" {
			return nil, bad("must be a string (data_type " + c.DataType + "), got " + kind)
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, bad("invalid string")
		}
		if c.DataType == manifest.TypeEnum {
			for _, e := range c.EnumValues {
				if s == e {
					return s, nil
				}
			}
			return nil, bad(fmt.Sprintf("%q is not one of %v", truncate(s), c.EnumValues))
		}
		return s, nil
	}
	return nil, bad("unsupported data_type " + c.DataType)
}

// decodeInt parses a JSON number as an exact int64: "42", "-7", and forms
// such as "1e3" or "42.0" when they are whole and fit.
func decodeInt(s string, bad func(string) error) (any, error) {
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return i, nil
	} else if errors.Is(err, strconv.ErrRange) {
		return nil, bad("integer " + truncate(s) + " is too large for 64 bits")
	}
	f, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil || math.IsInf(f, 0) || math.IsNaN(f):
		return nil, bad("number " + truncate(s) + " is not finite")
	case f != math.Trunc(f):
		return nil, bad("must be a whole number (data_type int), got " + truncate(s))
	case math.Abs(f) >= 1<<63:
		return nil, bad("integer " + truncate(s) + " is too large for 64 bits")
	case math.Abs(f) > 1<<53:
		// 1.5e17 names no exact integer: the caller must write it out.
		return nil, bad("integer " + truncate(s) + " is not exact in this notation; write it out in digits")
	}
	return int64(f), nil
}

func exampleFor(c *manifest.Capability) string {
	switch c.DataType {
	case manifest.TypeFloat, manifest.TypeInt:
		ex := "21"
		if c.Range != nil {
			ex = promcp.FormatValue(math.Round((c.Range.Min + c.Range.Max) / 2))
		}
		return "fix: send e.g. {\"value\": " + ex + "} within " + rangeText(c) + " " + c.Unit
	case manifest.TypeBool:
		return "fix: send {\"value\": true} or {\"value\": false}"
	case manifest.TypeEnum:
		return fmt.Sprintf("fix: send one of %v", c.EnumValues)
	}
	return "fix: send a string"
}

func jsonKind(raw []byte) string {
	switch raw[0] {
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	return "number"
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func inRange(c *manifest.Capability, v any) bool {
	f, ok := asFloat(v)
	if !ok || c.Range == nil {
		return true
	}
	return c.Range.Contains(f)
}

func rangeText(c *manifest.Capability) string {
	if c.Range == nil {
		return ""
	}
	return "[" + promcp.FormatValue(c.Range.Min) + ", " + promcp.FormatValue(c.Range.Max) + "]"
}

func rangeDetails(c *manifest.Capability, v any) string {
	if c.Range == nil {
		return ""
	}
	d := "min=" + promcp.FormatValue(c.Range.Min) + "; max=" + promcp.FormatValue(c.Range.Max)
	if v != nil {
		d += "; requested=" + promcp.FormatValue(v)
	}
	return d
}

func asFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, !math.IsNaN(x) && !math.IsInf(x, 0)
	case int64:
		return float64(x), true
	}
	return 0, false
}

// checkValueType rejects a driver value that does not match the data type,
// so a driver bug can never reach an agent as a good observation.
func checkValueType(c *manifest.Capability, v any) error {
	ok := false
	switch c.DataType {
	case manifest.TypeFloat:
		f, isF := v.(float64)
		ok = isF && !math.IsNaN(f) && !math.IsInf(f, 0)
	case manifest.TypeInt:
		_, ok = v.(int64)
	case manifest.TypeBool:
		_, ok = v.(bool)
	case manifest.TypeString, manifest.TypeEnum:
		_, ok = v.(string)
	}
	if !ok {
		return errors.New("driver returned a value that does not match data_type " + c.DataType)
	}
	return nil
}

// quantise rounds a float reading to the capability's precision: the
// manifest states the sensor's resolution, and digits beyond it are noise
// an agent should not reason about.
func quantise(c *manifest.Capability, v any) any {
	f, ok := v.(float64)
	if !ok || c.Precision <= 0 {
		return v
	}
	q := math.Round(f/c.Precision) * c.Precision
	// Trim binary representation noise (0.1*175 = 17.500000000000004).
	digits := max(0, int(math.Ceil(-math.Log10(c.Precision))))
	p := math.Pow10(digits)
	return math.Round(q*p) / p
}

// expected is the value a read-back shows when v landed: what the point's
// encoding can hold (a float32 register holds 0.1 as 0.100000001…), seen
// through the capability's precision like every reading.
func (cs *capState) expected(v any) any {
	if q, ok := cs.point.(drivers.Quantizer); ok {
		if qv, err := q.Quantize(v); err == nil {
			v = qv
		}
	}
	return quantise(cs.cap, v)
}

// matches reports whether a reading shows want (an expected value or an
// earlier reading) within the manifest's tolerance; a relative 1e-9 absorbs
// float noise, never a real step.
func (cs *capState) matches(got, want any) bool {
	gf, gok := asFloat(got)
	wf, wok := asFloat(want)
	if gok && wok {
		return math.Abs(gf-wf) <= cs.cap.Tolerance+1e-9*max(1, math.Abs(wf))
	}
	return got == want
}
