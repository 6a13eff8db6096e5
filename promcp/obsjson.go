package promcp

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"time"
)

// AppendJSON appends o as json.Marshal encodes it. The observation stream
// encodes thousands a second for MQTT and the fleet uplink at a plant's
// rate of changes, and reflection made that most of their cost; the
// common observation (a number, bool or plain string value, ASCII names)
// is written directly, anything else through json.Marshal. The two agree
// byte for byte (TestAppendJSONMatchesMarshal).
func (o Observation) AppendJSON(b []byte) ([]byte, error) {
	if !o.plain() {
		j, err := json.Marshal(o)
		return append(b, j...), err
	}
	b = append(b, `{"value":`...)
	switch v := o.Value.(type) {
	case nil:
		b = append(b, "null"...)
	case float64:
		b = appendFloat(b, v)
	case int64:
		b = strconv.AppendInt(b, v, 10)
	case int:
		b = strconv.AppendInt(b, int64(v), 10)
	case bool:
		b = strconv.AppendBool(b, v)
	case string:
		b = appendString(b, v)
	}
	b = appendString(append(b, `,"unit":`...), o.Unit)
	b = append(b, `,"timestamp":"`...)
	b = append(o.Timestamp.AppendFormat(b, time.RFC3339Nano), '"')
	b = appendString(append(b, `,"quality":`...), string(o.Quality))
	b = appendString(append(b, `,"capability":`...), o.Capability)
	b = appendString(append(b, `,"source":`...), o.Source)
	if o.Site != "" {
		b = appendString(append(b, `,"site":`...), o.Site)
	}
	b = strconv.AppendInt(append(b, `,"age_ms":`...), o.AgeMS, 10)
	b = strconv.AppendBool(append(b, `,"cached":`...), o.Cached)
	if o.Reason != "" {
		b = appendString(append(b, `,"reason":`...), o.Reason)
	}
	return append(b, '}'), nil
}

// JSON is o encoded as json.Marshal does, in a slice of its own size (a
// publisher keeps it as the topic's retained value), built in a buffer on
// the stack.
func (o Observation) JSON() ([]byte, error) {
	var scratch [320]byte
	b, err := o.AppendJSON(scratch[:0])
	if err != nil {
		return nil, err
	}
	return bytes.Clone(b), nil
}

// plain reports whether AppendJSON may write o directly: its value of a
// kind it writes (a finite float), every string free of what JSON escapes,
// and a timestamp MarshalJSON accepts.
func (o Observation) plain() bool {
	switch v := o.Value.(type) {
	case nil, int64, int, bool:
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return false
		}
	case string:
		if !plainString(v) {
			return false
		}
	default:
		return false
	}
	if y := o.Timestamp.Year(); y < 0 || y > 9999 {
		return false
	}
	for _, s := range [...]string{o.Unit, string(o.Quality), o.Capability, o.Source, o.Site, o.Reason} {
		if !plainString(s) {
			return false
		}
	}
	return true
}

// plainString: printable ASCII without the characters json.Marshal
// escapes (the quote, the backslash, and <, > and & for HTML).
func plainString(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

func appendString(b []byte, s string) []byte {
	return append(append(append(b, '"'), s...), '"')
}

// appendFloat writes a finite float64 as encoding/json does: the shortest
// representation, in exponent form below 1e-6 and from 1e21 (its exponent
// without a leading zero).
func appendFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}
