package manifest

import (
	"strings"
	"testing"
)

// TestExposeKeys: expose defaults to true, defaults: {expose: false} flips
// the default, a capability's own expose wins, and each mistake is
// reported at its file:line:col with a fix.
func TestExposeKeys(t *testing.T) {
	u := strings.Replace(okCap, "name: t", "name: u", 1)
	m, err := Parse("t.yml", []byte(header+okCap+u+"    expose: false\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !m.Capabilities[0].Exposed() || m.Capabilities[1].Exposed() || len(m.ExposedCapabilities()) != 1 || !m.Defaults.Expose {
		t.Errorf("expose: t %v, u %v", m.Capabilities[0].Exposed(), m.Capabilities[1].Exposed())
	}
	withDefaults := strings.Replace(header, "capabilities:\n", "defaults: {expose: false}\ncapabilities:\n", 1)
	m, err = Parse("t.yml", []byte(withDefaults+okCap+u+"    expose: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if m.Capabilities[0].Exposed() || !m.Capabilities[1].Exposed() || m.Defaults.Expose {
		t.Errorf("defaults: {expose: false}: t %v, u %v", m.Capabilities[0].Exposed(), m.Capabilities[1].Exposed())
	}
	if c := m.Tool("read_u"); c == nil || c.Name != "u" || m.Tool("do_u") != nil || m.Tool("read_x") != nil {
		t.Errorf("Tool lookups: %v", c)
	}
	if (&Capability{}).Exposed() != true {
		t.Error("a Capability built without the parser is not exposed")
	}

	for _, tc := range []struct{ name, doc, at, msg, fix string }{
		{"not a bool", header + okCap + "    expose: sometimes\n",
			"18:13: capabilities[0].expose", `expected true or false`, ""},
		{"family on an unexposed point", header + okCap + "    family: temperature\n    expose: false\n",
			"18:5: capabilities[0].family", `family "temperature" on a capability that is not exposed (expose: false)`, "remove family, or add expose: true"},
		{"family under defaults", withDefaults + okCap + "    family: temperature\n",
			"19:5: capabilities[0].family", `(defaults: {expose: false})`, "add expose: true"},
		{"defaults typo", strings.Replace(header, "capabilities:\n", "defaults: {exposed: false}\ncapabilities:\n", 1) + okCap,
			"11:12: defaults.exposed", `unknown key "exposed"`, `did you mean "expose"?`},
		{"defaults key of a capability", strings.Replace(header, "capabilities:\n", "defaults: {poll_ms: 1000}\ncapabilities:\n", 1) + okCap,
			"11:12: defaults.poll_ms", `unknown key "poll_ms"`, "valid keys: expose"},
	} {
		_, err := Parse("t.yml", []byte(tc.doc))
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		if e := err.Error(); !strings.Contains(e, "t.yml:"+tc.at+": ") || !strings.Contains(e, tc.msg) || !strings.Contains(e, "fix: ") || !strings.Contains(e, tc.fix) {
			t.Errorf("%s:\n got %s\nwant t.yml:%s: %s; fix: …%s", tc.name, e, tc.at, tc.msg, tc.fix)
		}
	}
}
