package strictyaml

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Pos is a position in a source file. Line and Col are 1-based; 0 means
// unknown.
type Pos struct {
	File string `json:"-"`
	Line int    `json:"-"`
	Col  int    `json:"-"`
}

// String formats the position as file:line:col (file alone when the line is
// unknown).
func (p Pos) String() string {
	file := p.File
	if file == "" {
		file = "<input>"
	}
	if p.Line <= 0 {
		return file
	}
	col := p.Col
	if col <= 0 {
		col = 1
	}
	return file + ":" + strconv.Itoa(p.Line) + ":" + strconv.Itoa(col)
}

// Error is one problem found in a YAML file (or in a node handed to
// Decode), with the position of the offending text and a hint saying how to
// fix it.
type Error struct {
	Pos   Pos
	Field string // dotted path, e.g. capabilities[2].binding.bus
	Msg   string
	Fix   string
}

// Error formats the problem as `file:line:col: field: msg; fix: fix`. Parts
// that are unknown (no line, no field, no fix) are left out.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Pos.String())
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	if e.Fix != "" {
		b.WriteString("; fix: ")
		b.WriteString(e.Fix)
	}
	return b.String()
}

// Errors is every problem found. A nil or empty Errors means no problem; use
// Err to turn it into a plain error safely.
type Errors []*Error

// Error returns one line per problem.
func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap exposes the individual errors to errors.Is / errors.As.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// Err returns es as an error, or nil when there are no problems. Use it
// instead of assigning an Errors to an error variable directly (a nil Errors
// in an error interface is not == nil).
func (es Errors) Err() error {
	if len(es) == 0 {
		return nil
	}
	return es
}

// Sorted orders the errors (in place) by file, line, column, field and
// message, and drops exact duplicates. It returns nil for no errors.
func (es Errors) Sorted() Errors {
	if len(es) == 0 {
		return nil
	}
	sort.SliceStable(es, func(i, j int) bool {
		a, b := es[i], es[j]
		if a.Pos.File != b.Pos.File {
			return a.Pos.File < b.Pos.File
		}
		if a.Pos.Line != b.Pos.Line {
			return a.Pos.Line < b.Pos.Line
		}
		if a.Pos.Col != b.Pos.Col {
			return a.Pos.Col < b.Pos.Col
		}
		if a.Field != b.Field {
			return a.Field < b.Field
		}
		return a.Msg < b.Msg
	})
	out := es[:1]
	for _, e := range es[1:] {
		if *e != *out[len(out)-1] {
			out = append(out, e)
		}
	}
	return out
}

// SortByLine orders the errors (in place, stably) by line and column only,
// keeping duplicates and the order of problems at the same position.
func (es Errors) SortByLine() Errors {
	sort.SliceStable(es, func(i, j int) bool {
		a, b := es[i].Pos, es[j].Pos
		return a.Line < b.Line || a.Line == b.Line && a.Col < b.Col
	})
	return es
}

// Closest returns the option nearest to s when it is an obvious typo, or "":
// case-insensitive edit distance ≤ 2 (≤ 1 for words of 4 letters or fewer),
// or one word being a prefix of the other ("timeout" for "timeout_ms").
func Closest(s string, options []string) string {
	best, bestD := "", 3
	ls := strings.ToLower(s)
	for _, o := range options {
		d := levenshtein(ls, strings.ToLower(o))
		limit := 2
		if min(len(ls), len(o)) <= 4 {
			limit = 1
		}
		if len(ls) >= 3 && (strings.HasPrefix(strings.ToLower(o), ls) || strings.HasPrefix(ls, strings.ToLower(o))) {
			d = min(d, limit) // "tau" for "tau_s", "timeout" for "timeout_ms"
		}
		if d < bestD && d <= limit {
			best, bestD = o, d
		}
	}
	return best
}

// levenshtein is the optimal-string-alignment edit distance: insertions,
// deletions, substitutions and transpositions of neighbours each cost 1.
func levenshtein(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	if len(ra) > 64 || len(rb) > 64 {
		// Long strings are never "obvious typos" of a key; skip the work.
		if a == b {
			return 0
		}
		return 1 << 10
	}
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// OneOf is the fix for a value outside a set of options: "use one of a, b,
// c", with a "did you mean" first when the value looks like a typo of one.
func OneOf(got string, options []string) string {
	fix := "use one of " + strings.Join(options, ", ")
	if s := Closest(got, options); s != "" && s != got {
		fix = fmt.Sprintf("did you mean %q? %s", s, fix)
	}
	return fix
}

// UnknownKeyFix is the fix for a key that is not one of known: "remove it;
// valid keys: a, b", or "did you mean "x"? valid keys: a, b" when the key
// looks like a typo of one.
func UnknownKeyFix(key string, known []string) string {
	valid := "valid keys: " + strings.Join(known, ", ")
	if len(known) == 0 {
		valid = "no keys are accepted here"
	}
	if s := Closest(key, known); s != "" {
		return fmt.Sprintf("did you mean %q? %s", s, valid)
	}
	return "remove it; " + valid
}

// Quote quotes s for a message, cutting it when it is long.
func Quote(s string) string {
	const max = 40
	r := []rune(s)
	if len(r) > max {
		return strconv.Quote(string(r[:max])) + "…"
	}
	return strconv.Quote(s)
}

// Join appends key to a dotted field path.
func Join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// Index appends a list index to a field path: path[i].
func Index(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }
