package manifest

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Error is one problem found in a manifest (or in a node handed to
// DecodeNode), with the position of the offending text and a hint saying how
// to fix it.
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

// Errors is every problem found, sorted by position. A nil or empty Errors
// means no problem; use Err to turn it into a plain error safely.
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

// sorted orders the errors by position and drops exact duplicates.
func (es Errors) sorted() Errors {
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

// closest returns the option nearest to s when it is an obvious typo, or "":
// case-insensitive edit distance ≤ 2 (≤ 1 for words of 4 letters or fewer),
// or one word being a prefix of the other ("timeout" for "timeout_ms").
func closest(s string, options []string) string {
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

// oneOf is the fix for a value outside an enum: "use one of a, b, c", with a
// suggestion first when the value looks like a typo of one of them.
func oneOf(got string, options []string) string {
	fix := "use one of " + strings.Join(options, ", ")
	if s := closest(got, options); s != "" && s != got {
		fix = fmt.Sprintf("did you mean %q? %s", s, fix)
	}
	return fix
}

// OneOf is the fix for a value outside a set of options, with a "did you
// mean" first when the value looks like a typo of one (for checks made
// outside this package, such as the bus type against the driver registry).
func OneOf(got string, options []string) string { return oneOf(got, options) }

// quoteShort quotes s for a message, cutting it when it is long.
func quoteShort(s string) string {
	const max = 40
	r := []rune(s)
	if len(r) > max {
		return strconv.Quote(string(r[:max])) + "…"
	}
	return strconv.Quote(s)
}
