package manifest

import (
	"strings"
	"testing"
)

// TestObserveKeys: poll_ms and deadband parse (absolute and percent of
// range), and each mistake is reported at its file:line:col with a fix.
func TestObserveKeys(t *testing.T) {
	m, err := Parse("t.yml", []byte(header+okCap+"    range: [0, 50]\n    poll_ms: 1000\n    deadband: \"2%\"\n"+
		strings.Replace(okCap, "name: t", "name: u", 1)+"    deadband: 0.25\n"))
	if err != nil {
		t.Fatal(err)
	}
	a, b := m.Capabilities[0], m.Capabilities[1]
	if a.PollMS != 1000 || a.PollInterval().Seconds() != 1 || a.Deadband.Band(a.Range) != 1 || !a.Deadband.Percent {
		t.Errorf("a = poll %d, deadband %+v", a.PollMS, a.Deadband)
	}
	if b.PollMS != 0 || b.Deadband.Band(b.Range) != 0.25 {
		t.Errorf("b = poll %d, deadband %+v", b.PollMS, b.Deadband)
	}
	if m2, err := Parse("t.yml", []byte(header+okCap+"    poll_ms: 1000\n    alarms: {high: 28, low: 5, hysteresis: 0.5, for_ms: 60000, quality: [error], stale_s: 10}\n")); err != nil {
		t.Error(err)
	} else if al := m2.Capabilities[0].Alarms; *al.High != 28 || *al.Low != 5 || al.Hysteresis != 0.5 || al.For().Minutes() != 1 || al.Quality[0] != "error" || al.StaleS != 10 {
		t.Errorf("alarms = %+v", al)
	}
	if a.Changed(20.0, 21.0) || !a.Changed(20.0, 21.5) || !a.Changed(nil, 1.0) || b.Changed(1.0, 1.25) || !b.Changed(1.0, 1.3) {
		t.Error("Changed ignores the deadband")
	}

	type want struct{ at, msg, fix string }
	for _, tc := range []struct {
		name, doc string
		want      want
	}{
		{"poll too fast", header + okCap + "    poll_ms: 10\n",
			want{"18:14: capabilities[0].poll_ms", "poll_ms 10 is out of range", "use a value from 100 to 86400000"}},
		{"percent without range", header + okCap + "    deadband: 5%\n",
			want{"18:15: capabilities[0].deadband", "a percent deadband needs the capability's range", "add range: {min, max}"}},
		{"negative", header + okCap + "    deadband: -1\n",
			want{"18:15: capabilities[0].deadband", "deadband must not be negative", "at least 0"}},
		{"garbage", header + okCap + "    deadband: lots\n",
			want{"18:15: capabilities[0].deadband", `invalid deadband "lots"`, `percent of range (e.g. "0.5%")`}},
		{"over 100%", header + okCap + "    range: [0, 1]\n    deadband: 120%\n",
			want{"19:15: capabilities[0].deadband", "deadband 120% is more than the whole range", "0% to 100%"}},
		{"on a bool", header + strings.Replace(okCap, "float", "bool", 1) + "    deadband: 1\n",
			want{"18:5: capabilities[0].deadband", "deadband applies only to data_type float or int, not bool", "remove deadband"}},
		{"mapping", header + okCap + "    deadband: {abs: 1}\n",
			want{"18:15: capabilities[0].deadband", "expected a number or a percent, got a mapping", "absolute band"}},
		{"alarm typo", header + okCap + "    alarms: {hgh: 3}\n",
			want{"18:14: capabilities[0].alarms.hgh", `unknown key "hgh"`, `did you mean "high"?`}},
		{"stale without poll", header + okCap + "    alarms: {stale_s: 30}\n",
			want{"18:14: capabilities[0].alarms.stale_s", "stale_s needs background polling", "add poll_ms"}},
		{"stale shorter than a poll", header + okCap + "    poll_ms: 5000\n    alarms: {stale_s: 5}\n",
			want{"19:23: capabilities[0].alarms.stale_s", "stale_s 5 is not longer than one poll", "e.g. stale_s: 15"}},
		{"overlap", header + okCap + "    alarms: {high: 10, low: 9, hysteresis: 1}\n",
			want{"18:24: capabilities[0].alarms.low", "low 9 and high 10 overlap with hysteresis 1", "keep low + hysteresis below high - hysteresis"}},
		{"bad quality", header + okCap + "    alarms: {quality: [bad]}\n",
			want{"18:24: capabilities[0].alarms.quality[0]", `invalid quality "bad"`, "stale, degraded, error"}},
		{"empty", header + okCap + "    alarms: {for_ms: 10}\n",
			want{"18:13: capabilities[0].alarms", "alarms declares no condition", "at least one of high, low, quality or stale_s"}},
		{"threshold on bool", header + strings.Replace(okCap, "float", "bool", 1) + "    alarms: {high: 1}\n",
			want{"18:14: capabilities[0].alarms.high", "high applies only to data_type float or int, not bool", "quality/stale_s"}},
	} {
		_, err := Parse("t.yml", []byte(tc.doc))
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		e := err.Error()
		if !strings.Contains(e, "t.yml:"+tc.want.at+": "+tc.want.msg) || !strings.Contains(e, tc.want.fix) {
			t.Errorf("%s:\n got %s\nwant t.yml:%s: %s; fix: …%s", tc.name, e, tc.want.at, tc.want.msg, tc.want.fix)
		}
	}
}
