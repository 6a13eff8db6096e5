package policy

import (
	"fmt"
	"strings"
	"time"
	"unicode"
)

// Window is a named time window: the days it starts on, a start and end
// wall-clock time, in an IANA time zone. A window whose end is not after
// its start crosses midnight and ends on the next day. Wall-clock times are
// resolved in the zone on each day, so a window keeps its local meaning
// across DST changes (a 01:00–05:00 window lasts 3 hours on the night the
// clocks spring forward).
type Window struct {
	Name     string
	Days     [7]bool // indexed by time.Weekday
	StartMin int     // minutes after local midnight
	EndMin   int
	Loc      *time.Location
}

var dayNames = map[string]time.Weekday{
	"sun": time.Sunday, "mon": time.Monday, "tue": time.Tuesday, "wed": time.Wednesday,
	"thu": time.Thursday, "fri": time.Friday, "sat": time.Saturday,
}

// zoneFix is the fix for an unknown time zone: the IANA name when only the
// capitalisation is wrong (europe/amsterdam), else how to name a zone.
// (Go's embedded zone data cannot be listed, so there is no spelling
// suggestion beyond case.)
func zoneFix(name string) string {
	const fix = "name an IANA zone, e.g. Europe/Berlin or UTC"
	parts := strings.FieldsFunc(strings.ToLower(name), func(r rune) bool { return r == '/' || r == '_' || r == '-' })
	cased := []rune(strings.ToLower(name))
	start := true
	for i, r := range cased {
		if start {
			cased[i] = unicode.ToUpper(r)
		}
		start = r == '/' || r == '_' || r == '-'
	}
	if c := string(cased); len(parts) > 0 && c != name {
		if _, err := time.LoadLocation(c); err == nil {
			return fmt.Sprintf("did you mean %q? %s", c, fix)
		}
	}
	return fix
}

func parseClock(s string) (int, error) {
	var h, m int
	if len(s) != 5 || s[2] != ':' {
		return 0, fmt.Errorf("%q is not HH:MM", s)
	}
	if _, err := fmt.Sscanf(s, "%02d:%02d", &h, &m); err != nil || h > 24 || m > 59 || (h == 24 && m != 0) {
		return 0, fmt.Errorf("%q is not a time of day (00:00–24:00)", s)
	}
	return h*60 + m, nil
}

// occurrence returns the window instance that starts on the local day of
// day (which must be local midnight in w.Loc).
func (w *Window) occurrence(y int, mo time.Month, d int) (start, end time.Time) {
	start = time.Date(y, mo, d, w.StartMin/60, w.StartMin%60, 0, 0, w.Loc)
	ed := d
	if w.EndMin <= w.StartMin {
		ed++ // crosses midnight
	}
	end = time.Date(y, mo, ed, w.EndMin/60, w.EndMin%60, 0, 0, w.Loc)
	return start, end
}

// span returns the instance of the window containing t, if any.
func (w *Window) span(t time.Time) (start, end time.Time, ok bool) {
	lt := t.In(w.Loc)
	// An instance containing t started today or (crossing midnight) yesterday.
	for back := 0; back <= 1; back++ {
		day := time.Date(lt.Year(), lt.Month(), lt.Day()-back, 12, 0, 0, 0, w.Loc)
		if !w.Days[day.Weekday()] {
			continue
		}
		s, e := w.occurrence(day.Year(), day.Month(), day.Day())
		if !t.Before(s) && t.Before(e) {
			return s, e, true
		}
	}
	return time.Time{}, time.Time{}, false
}

// Contains reports whether t falls inside the window.
func (w *Window) Contains(t time.Time) bool {
	_, _, ok := w.span(t)
	return ok
}

// End returns when the instance containing t ends (zero if t is outside).
func (w *Window) End(t time.Time) time.Time {
	_, e, _ := w.span(t)
	return e
}

// NextStart returns the start of the next instance after t (within 8 days).
func (w *Window) NextStart(t time.Time) time.Time {
	lt := t.In(w.Loc)
	for ahead := 0; ahead <= 8; ahead++ {
		day := time.Date(lt.Year(), lt.Month(), lt.Day()+ahead, 12, 0, 0, 0, w.Loc)
		if !w.Days[day.Weekday()] {
			continue
		}
		s, _ := w.occurrence(day.Year(), day.Month(), day.Day())
		if s.After(t) {
			return s
		}
	}
	return time.Time{}
}

func (w *Window) String() string {
	var days []string
	for _, n := range []string{"mon", "tue", "wed", "thu", "fri", "sat", "sun"} {
		if w.Days[dayNames[n]] {
			days = append(days, n)
		}
	}
	return fmt.Sprintf("%s (%s %02d:%02d–%02d:%02d %s)", w.Name, strings.Join(days, ","),
		w.StartMin/60, w.StartMin%60, w.EndMin/60, w.EndMin%60, w.Loc)
}
