package opcua

import (
	"strings"
	"unicode"

	"golang.org/x/text/runes"
	"golang.org/x/text/transform"
	"golang.org/x/text/unicode/norm"
)

// uneceNamespace is the namespace of EUInformation unit ids that are
// UN/CEFACT Recommendation 20 codes (OPC UA Part 8 §5.6.3).
const uneceNamespace = "http://www.opcfoundation.org/UA/units/un/cefact"

// uneceUnits maps the common UNECE codes to the unit names physd's
// manifests, examples and profiles use (celsius, percent, volt …, the
// names the MQTT discovery and the console know). A code not here keeps
// the server's display name, with a DECIDE comment.
var uneceUnits = map[string]string{
	"CEL": "celsius", "FAH": "fahrenheit", "KEL": "kelvin",
	"P1":  "percent",
	"PAL": "pascal", "A97": "hPa", "KPA": "kPa", "BAR": "bar",
	"WTT": "watt", "KWT": "kW", "KWH": "kWh",
	"VLT": "volt", "AMP": "ampere", "HTZ": "hertz",
	"RPM": "rpm", "DD": "degree",
	"LTR": "litre", "HUR": "hour", "SEC": "second",
	"LUX": "lux", "59": "ppm",
}

// uneceCode is the UNECE code of a unit (its unit id holds the code's
// ASCII characters, one per byte: CEL is 0x43454C), or "" when the unit is
// not a UNECE one.
func uneceCode(u *EngineeringUnits) string {
	if u.UnitID <= 0 || (u.NamespaceURI != "" && !strings.EqualFold(strings.TrimSuffix(u.NamespaceURI, "/"), uneceNamespace)) {
		return ""
	}
	var b []byte
	for shift := 24; shift >= 0; shift -= 8 {
		c := byte(u.UnitID >> shift)
		if c == 0 && len(b) == 0 {
			continue
		}
		if c < '0' || c > 'Z' || (c > '9' && c < 'A') {
			return ""
		}
		b = append(b, c)
	}
	return string(b)
}

// fold drops accents (é → e) so that browse names in other languages
// still give readable capability names.
var fold = transform.Chain(norm.NFD, runes.Remove(runes.In(unicode.Mn)), norm.NFC)

// snake writes a browse name as a name or tag: lower case, words split
// where the case changes (FlowTemperature → flow_temperature,
// PT100Value → pt100_value), anything but a-z and 0-9 a single '_'.
func snake(s string) string {
	if f, _, err := transform.String(fold, s); err == nil {
		s = f
	}
	rs := []rune(s)
	upper := func(r rune) bool { return r >= 'A' && r <= 'Z' }
	lowerOrDigit := func(r rune) bool { return (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') }
	var b strings.Builder
	for i, r := range rs {
		switch {
		case upper(r):
			if i > 0 && (lowerOrDigit(rs[i-1]) || (upper(rs[i-1]) && i+1 < len(rs) && rs[i+1] >= 'a' && rs[i+1] <= 'z')) {
				b.WriteByte('_')
			}
			b.WriteRune(r + 'a' - 'A')
		case lowerOrDigit(r):
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	parts := strings.FieldsFunc(b.String(), func(r rune) bool { return r == '_' })
	return strings.Join(parts, "_")
}
