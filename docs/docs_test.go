package docs_test

// These tests fail when the documentation drifts from the code or from
// itself:
//
//   - TestLinks: every relative link and #anchor in README.md, docs/*.md
//     and examples/*/README* resolves (GitHub's heading slugs).
//   - TestCommandFlags: every flag of each physd command (from the built
//     binary's -h) has a row in its table in docs/operations.md, every row
//     names real flags, and every flag a documented physd command line uses
//     exists.
//   - TestMetricsTable: the metrics table in docs/operations.md against the
//     metric names the code registers; no doc names a metric that does not
//     exist.
//   - TestManifestKeyIndex: the key index in docs/manifest.md against
//     schemas/physmcp.manifest.schema.json (top-level and capability keys),
//     and every key of the schema is named somewhere in the docs.
//   - TestWalkthroughTools: the tools the quickstart and the walkthrough
//     call exist in the greenhouse example, and the quickstart needs no role.
//
// TestCommandFlags builds cmd/physd once (CGO_ENABLED=0, as the release and
// .ci/run's cross-builds do, so the build cache is shared) and reads each
// command's -h; the other tests start nothing.

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode"

	"github.com/physd/physd/metrics"
)

// root is the repository root, relative to this package's directory.
const root = ".."

// docFiles lists the Markdown files the link check covers, relative to root.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	for _, pat := range []string{"docs/*.md", "examples/*/README*"} {
		m, err := filepath.Glob(filepath.Join(root, pat))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			rel, _ := filepath.Rel(root, f)
			files = append(files, filepath.ToSlash(rel))
		}
	}
	return files
}

func read(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// ---------------------------------------------------------------------------
// Markdown

type mdLine struct {
	n    int    // 1-based line number
	text string // the line
	code bool   // inside a fenced code block (the fences included)
}

// lines splits a Markdown file and marks fenced code blocks.
func lines(src string) []mdLine {
	var out []mdLine
	fence := ""
	for i, l := range strings.Split(src, "\n") {
		trim := strings.TrimLeft(l, " ")
		if fence == "" {
			if strings.HasPrefix(trim, "```") || strings.HasPrefix(trim, "~~~") {
				fence = trim[:3]
				out = append(out, mdLine{i + 1, l, true})
				continue
			}
			out = append(out, mdLine{i + 1, l, false})
			continue
		}
		out = append(out, mdLine{i + 1, l, true})
		if strings.HasPrefix(trim, fence) && strings.Trim(trim, fence[:1]) == "" {
			fence = ""
		}
	}
	return out
}

var (
	headingRE    = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	inlineLinkRE = regexp.MustCompile(`\[([^\]]*)\]\(([^)\s]*)(?:\s+"[^"]*")?\)`)
	refDefRE     = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*(\S+)`)
	htmlAnchorRE = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	codeSpanRE   = regexp.MustCompile("`[^`]*`")
	htmlTagRE    = regexp.MustCompile(`<[^>]+>`)
)

// slug is GitHub's anchor for a heading's text (github-slugger): lower
// case; letters, marks, decimal digits, '-' and '_' kept; a space becomes
// '-'; everything else (punctuation, symbols, ² and the like) dropped.
func slug(text string) string {
	// The rendered text: inline code keeps its content, a link its text,
	// emphasis and HTML tags go.
	text = inlineLinkRE.ReplaceAllString(text, "$1")
	text = htmlTagRE.ReplaceAllString(text, "")
	text = strings.NewReplacer("`", "", "*", "").Replace(text)
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_',
			unicode.IsLetter(r), unicode.Is(unicode.Mn, r), unicode.Is(unicode.Mc, r),
			unicode.Is(unicode.Nd, r), unicode.Is(unicode.Nl, r), unicode.Is(unicode.Pc, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

type heading struct {
	level int
	text  string
	line  int
}

func headings(src string) []heading {
	var out []heading
	for _, l := range lines(src) {
		if l.code {
			continue
		}
		if m := headingRE.FindStringSubmatch(l.text); m != nil {
			out = append(out, heading{len(m[1]), m[2], l.n})
		}
	}
	return out
}

// anchors are the ids GitHub gives a file's headings (a repeated slug gets
// -1, -2, …) and its explicit <a id/name> anchors.
func anchors(src string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, h := range headings(src) {
		s := slug(h.text)
		if n, ok := seen[s]; ok {
			seen[s] = n + 1
			s += "-" + strconv.Itoa(n+1)
		} else {
			seen[s] = 0
		}
		out[s] = true
	}
	for _, m := range htmlAnchorRE.FindAllStringSubmatch(src, -1) {
		out[m[1]] = true
	}
	return out
}

// section is the text under the first heading whose text is title, up to
// the next heading of the same or a higher level.
func section(t *testing.T, src, file, title string) []mdLine {
	t.Helper()
	ls := lines(src)
	start, level := -1, 0
	for i, l := range ls {
		if l.code {
			continue
		}
		m := headingRE.FindStringSubmatch(l.text)
		if m == nil {
			continue
		}
		if start < 0 {
			if m[2] == title {
				start, level = i+1, len(m[1])
			}
			continue
		}
		if len(m[1]) <= level {
			return ls[start:i]
		}
	}
	if start < 0 {
		t.Errorf("%s: no heading %q", file, title)
		return nil
	}
	return ls[start:]
}

// tableRows are the body rows of the Markdown tables in ls, as trimmed
// cells (the header row and the delimiter row left out).
func tableRows(ls []mdLine) [][]string {
	var rows [][]string
	inTable := false
	for i, l := range ls {
		s := strings.TrimSpace(l.text)
		if l.code || !strings.HasPrefix(s, "|") {
			inTable = false
			continue
		}
		if !inTable {
			// A header row: the next line must be the delimiter row.
			inTable = i+1 < len(ls) && isDelimiterRow(ls[i+1].text)
			continue
		}
		if isDelimiterRow(s) {
			continue
		}
		rows = append(rows, splitRow(s))
	}
	return rows
}

func isDelimiterRow(s string) bool {
	s = strings.TrimSpace(s)
	return strings.HasPrefix(s, "|") && strings.Trim(s, "|-: ") == ""
}

// splitRow splits a table row at the pipes that are not escaped (\|).
func splitRow(s string) []string {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "|")
	s = strings.TrimSuffix(s, "|")
	var cells []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s) && s[i+1] == '|':
			cur.WriteByte('|')
			i++
		case s[i] == '|':
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(s[i])
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

// ---------------------------------------------------------------------------
// TestLinks

func TestLinks(t *testing.T) {
	files := docFiles(t)
	anchorCache := map[string]map[string]bool{}
	anchorsOf := func(rel string) map[string]bool {
		if a, ok := anchorCache[rel]; ok {
			return a
		}
		a := anchors(read(t, rel))
		anchorCache[rel] = a
		return a
	}
	checked := 0
	for _, file := range files {
		for _, l := range lines(read(t, file)) {
			if l.code {
				continue
			}
			prose := codeSpanRE.ReplaceAllString(l.text, "``")
			var targets []string
			for _, m := range inlineLinkRE.FindAllStringSubmatch(prose, -1) {
				targets = append(targets, m[2])
			}
			if m := refDefRE.FindStringSubmatch(prose); m != nil {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				path, frag, _ := strings.Cut(target, "#")
				dest := file
				if path != "" {
					dest = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(file), path)))
					if strings.HasPrefix(dest, "../") {
						t.Errorf("%s:%d: %s points outside the repository", file, l.n, target)
						continue
					}
					if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
						t.Errorf("%s:%d: %s: no such file or directory (%s)", file, l.n, target, dest)
						continue
					}
				}
				if frag == "" {
					continue
				}
				if !strings.HasSuffix(dest, ".md") {
					t.Errorf("%s:%d: %s: an anchor into a file that is not Markdown", file, l.n, target)
					continue
				}
				if !anchorsOf(dest)[frag] {
					t.Errorf("%s:%d: %s: %s has no heading with the anchor #%s", file, l.n, target, dest, frag)
				}
			}
		}
	}
	t.Logf("%d relative links in %d files", checked, len(files))
	if checked < 50 {
		t.Errorf("only %d relative links found: is the link pattern still right?", checked)
	}
}

// TestSlug pins the slug rules on the headings the docs use.
func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Walkthrough: can_do → read → do → read":                       "walkthrough-can_do--read--do--read",
		"MQTT northbound (Home Assistant, Node-RED, historians)":       "mqtt-northbound-home-assistant-node-red-historians",
		"What each agent is shown: roles and views":                    "what-each-agent-is-shown-roles-and-views",
		"`physd scan modbus`":                                          "physd-scan-modbus",
		"physd — design (what the code is today)":                      "physd--design-what-the-code-is-today",
		"Packages (each folder one job; arrows point at what it uses)": "packages-each-folder-one-job-arrows-point-at-what-it-uses",
		"I²C":                       "ic",
		"The simulator bus (`sim`)": "the-simulator-bus-sim",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}

// ---------------------------------------------------------------------------
// TestCommandFlags

var (
	buildOnce sync.Once
	physdBin  string
	buildErr  error
	buildOut  []byte
)

// physd builds cmd/physd once for the tests that ask the binary.
func physd(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "physd-docs-test")
		if err != nil {
			buildErr = err
			return
		}
		physdBin = filepath.Join(dir, "physd")
		cmd := exec.Command("go", "build", "-o", physdBin, "github.com/physd/physd/cmd/physd")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("go build ./cmd/physd: %v\n%s", buildErr, buildOut)
	}
	return physdBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if physdBin != "" {
		os.RemoveAll(filepath.Dir(physdBin))
	}
	os.Exit(code)
}

// mustDocument are the commands whose flags the docs must list even if the
// usage text stops naming them.
var mustDocument = []string{"run", "validate", "scan modbus", "scan i2c", "scan opcua", "lint", "client-config", "audit verify"}

var (
	commandWordRE = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	helpFlagRE    = regexp.MustCompile(`^  -([A-Za-z0-9][A-Za-z0-9_-]*)(?:\s|$)`)
	docFlagRE     = regexp.MustCompile(`--([a-z0-9][a-z0-9-]*)`)
)

// commands are the commands `physd help` lists ("physd scan modbus …" is
// "scan modbus"), with mustDocument.
func commands(t *testing.T, bin string) []string {
	t.Helper()
	out, _ := exec.Command(bin, "help").CombinedOutput() // the usage, whatever the exit status
	if len(out) == 0 {
		t.Fatal("physd help printed nothing")
	}
	set := map[string]bool{}
	for _, c := range mustDocument {
		set[c] = true
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "physd" {
			continue
		}
		var words []string
		for _, w := range f[1:] {
			if !commandWordRE.MatchString(w) {
				break
			}
			words = append(words, w)
		}
		if len(words) > 0 {
			set[strings.Join(words, " ")] = true
		}
	}
	var cmds []string
	for c := range set {
		cmds = append(cmds, c)
	}
	sort.Strings(cmds)
	return cmds
}

// helpFlags are the flags `physd CMD -h` prints (flag.PrintDefaults).
func helpFlags(t *testing.T, bin, command string) map[string]bool {
	t.Helper()
	args := append(strings.Fields(command), "-h")
	out, _ := exec.Command(bin, args...).CombinedOutput() // -h exits 0 or 2 by command
	if len(out) == 0 {
		t.Fatalf("physd %s -h printed nothing", command)
	}
	flags := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if m := helpFlagRE.FindStringSubmatch(l); m != nil {
			flags[m[1]] = true
		}
	}
	return flags
}

func TestCommandFlags(t *testing.T) {
	bin := physd(t)
	const opsFile = "docs/operations.md"
	ops := read(t, opsFile)
	cmds := commands(t, bin)
	real := map[string]map[string]bool{}
	for _, c := range cmds {
		real[c] = helpFlags(t, bin, c)
	}
	if len(real["run"]) < 20 {
		t.Fatalf("physd run -h lists %d flags: is the -h format still flag.PrintDefaults?", len(real["run"]))
	}

	// 1. Each command's table against its -h.
	for _, c := range cmds {
		title := "`physd " + c + "`"
		sec := section(t, ops, opsFile, title)
		if sec == nil {
			continue
		}
		documented := map[string]int{}
		t.Logf("physd %s: %d flags", c, len(real[c]))
		for _, row := range tableRows(sec) {
			for _, m := range docFlagRE.FindAllStringSubmatch(row[0], -1) {
				documented[m[1]]++
			}
		}
		for f := range real[c] {
			if documented[f] == 0 {
				t.Errorf("%s, %s: --%s (physd %s -h) has no row in the table", opsFile, title, f, c)
			}
		}
		for f, n := range documented {
			switch {
			case !real[c][f]:
				t.Errorf("%s, %s: the table has a row for --%s, which physd %s does not have", opsFile, title, f, c)
			case n > 1:
				t.Errorf("%s, %s: --%s is in %d rows", opsFile, title, f, n)
			}
		}
	}

	// 2. Every physd command line in the docs (code blocks, inline code)
	// uses flags its command has.
	known := map[string]bool{}
	for _, c := range cmds {
		known[c] = true
	}
	uses := 0
	for _, file := range docFiles(t) {
		for _, use := range commandLines(read(t, file)) {
			c, flags := parseCommandLine(use.text, known)
			for ; c != ""; c, flags = parseCommandLine(flags.rest, known) {
				uses++
				for _, f := range flags.flags {
					if !real[c][f] {
						t.Errorf("%s:%d: `physd %s … --%s`: physd %s has no flag --%s", file, use.n, c, f, c, f)
					}
				}
			}
		}
	}
	t.Logf("%d physd command lines in the docs", uses)
	if uses < 20 {
		t.Errorf("only %d physd command lines found in the docs: is the parser still right?", uses)
	}
}

// commandLines are the shell lines of fenced code blocks (continuations
// joined) and the inline code spans of the prose.
func commandLines(src string) []mdLine {
	var out []mdLine
	var prose strings.Builder
	proseLine := map[int]int{} // offset in prose → line number
	ls := lines(src)
	for i := 0; i < len(ls); i++ {
		l := ls[i]
		if !l.code {
			proseLine[prose.Len()] = l.n
			prose.WriteString(l.text + "\n")
			continue
		}
		text, n := l.text, l.n
		for strings.HasSuffix(text, `\`) && i+1 < len(ls) && ls[i+1].code {
			i++
			text = strings.TrimSuffix(text, `\`) + " " + ls[i].text
		}
		out = append(out, mdLine{n, text, true})
	}
	p := prose.String()
	for _, loc := range codeSpanRE.FindAllStringIndex(p, -1) {
		n := 0
		for off, ln := range proseLine {
			if off <= loc[0] && ln > n {
				n = ln
			}
		}
		out = append(out, mdLine{n, strings.ReplaceAll(p[loc[0]+1:loc[1]-1], "\n", " "), false})
	}
	return out
}

type usedFlags struct {
	flags []string
	rest  string // the text after this command (a nested physd, as in lint -- physd run …)
}

// parseCommandLine finds the first `physd CMD` in s (physd, ./cmd/physd,
// /usr/bin/physd …) whose command is known, and the --flags given to it up
// to the end of the command (a comment, ;, &&, a pipe outside brackets, or
// "--" before another command).
func parseCommandLine(s string, known map[string]bool) (string, usedFlags) {
	tok := strings.Fields(s)
	for i := 0; i < len(tok); i++ {
		w := strings.Trim(tok[i], "([])")
		if w != "physd" && !strings.HasSuffix(w, "/physd") {
			continue
		}
		// The longest known command from the words that follow.
		cmd, j := "", i+1
		for k := i + 1; k < len(tok) && k <= i+2; k++ {
			cand := strings.Join(tok[i+1:k+1], " ")
			if known[cand] {
				cmd, j = cand, k+1
			}
		}
		if cmd == "" {
			continue
		}
		var uf usedFlags
		depth := 0
		for ; j < len(tok); j++ {
			t := tok[j]
			if strings.HasPrefix(t, "#") || t == ";" || t == "&&" || t == "||" || t == "&" || t == "--" || (t == "|" && depth == 0) {
				break
			}
			depth += strings.Count(t, "[") + strings.Count(t, "(") - strings.Count(t, "]") - strings.Count(t, ")")
			f := strings.TrimLeft(t, "[(")
			f = strings.TrimRight(f, "]),")
			if m := regexp.MustCompile(`^--([a-z0-9][a-z0-9-]*)(?:=.*)?$`).FindStringSubmatch(f); m != nil {
				uf.flags = append(uf.flags, m[1])
			}
		}
		uf.rest = strings.Join(tok[min(j, len(tok)):], " ")
		return cmd, uf
	}
	return "", usedFlags{}
}

// ---------------------------------------------------------------------------
// TestMetricsTable

// notMetrics are physd_ string literals in the code that name no series.
var notMetrics = map[string]string{
	"physd_memberlist_sink": "the go-metrics Prometheus sink's name (its Describe names a dummy gauge that is never collected)",
}

var metricNameRE = regexp.MustCompile(`^physd_[a-z][a-z0-9_]*[a-z0-9]$`) // not a prefix such as "physd_process_resident_"

// registeredMetrics are the physd_ metric names in the code: every such
// string literal in the module's non-test Go files, and the names a fresh
// metrics.New() registry gathers (which covers names built at run time).
func registeredMetrics(t *testing.T) map[string]string {
	t.Helper()
	names := map[string]string{} // name → where
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "testdata", "e2e", "bench":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err == nil && metricNameRE.MatchString(s) {
				if _, skip := notMetrics[s]; !skip {
					names[s] = fset.Position(lit.Pos()).String()
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	fams, err := metrics.New().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if n := f.GetName(); strings.HasPrefix(n, "physd_") {
			if _, ok := names[n]; !ok {
				names[n] = "metrics.New()"
			}
		}
	}
	return names
}

func TestMetricsTable(t *testing.T) {
	const opsFile = "docs/operations.md"
	registered := registeredMetrics(t)
	if len(registered) < 20 {
		t.Fatalf("only %d metric names found in the code: is the scan still right?", len(registered))
	}
	t.Logf("%d metric names in the code", len(registered))
	table := map[string]int{}
	for _, row := range tableRows(section(t, read(t, opsFile), opsFile, "Metrics")) {
		name := strings.Trim(row[0], "`")
		if !metricNameRE.MatchString(name) {
			t.Errorf("%s, Metrics: %q is not a metric name", opsFile, row[0])
			continue
		}
		table[name]++
	}
	for name, where := range registered {
		if table[name] == 0 {
			t.Errorf("%s, Metrics: no row for %s (registered at %s)", opsFile, name, where)
		}
	}
	for name, n := range table {
		if _, ok := registered[name]; !ok {
			t.Errorf("%s, Metrics: %s is not a metric physd registers", opsFile, name)
		}
		if n > 1 {
			t.Errorf("%s, Metrics: %s is in %d rows", opsFile, name, n)
		}
	}
	// No page names a metric that does not exist.
	mention := regexp.MustCompile(`\bphysd_[a-z][a-z0-9_]*`)
	for _, file := range docFiles(t) {
		for _, l := range lines(read(t, file)) {
			for _, m := range mention.FindAllString(l.text, -1) {
				if _, ok := registered[m]; !ok {
					t.Errorf("%s:%d: %s is not a metric physd registers", file, l.n, m)
				}
			}
		}
	}
}

// ---------------------------------------------------------------------------
// TestManifestKeyIndex

type schemaNode struct {
	Properties           map[string]*schemaNode `json:"properties"`
	Items                *schemaNode            `json:"items"`
	AdditionalProperties json.RawMessage        `json:"additionalProperties"`
	OneOf                []*schemaNode          `json:"oneOf"`
	AnyOf                []*schemaNode          `json:"anyOf"`
	AllOf                []*schemaNode          `json:"allOf"`
}

// allKeys adds every property name at any depth of n.
func allKeys(n *schemaNode, into map[string]bool) {
	if n == nil {
		return
	}
	for k, v := range n.Properties {
		into[k] = true
		allKeys(v, into)
	}
	allKeys(n.Items, into)
	if len(n.AdditionalProperties) > 0 && n.AdditionalProperties[0] == '{' {
		var ap schemaNode
		if json.Unmarshal(n.AdditionalProperties, &ap) == nil {
			allKeys(&ap, into)
		}
	}
	for _, s := range slices.Concat(n.OneOf, n.AnyOf, n.AllOf) {
		allKeys(s, into)
	}
}

func TestManifestKeyIndex(t *testing.T) {
	var schema schemaNode
	if err := json.Unmarshal([]byte(read(t, "schemas/physmcp.manifest.schema.json")), &schema); err != nil {
		t.Fatal(err)
	}
	caps := schema.Properties["capabilities"]
	if caps == nil || caps.Items == nil || len(caps.Items.Properties) == 0 || len(schema.Properties) == 0 {
		t.Fatal("the schema has no properties or no capabilities.items.properties: is its shape still the same?")
	}
	const file = "docs/manifest.md"
	src := read(t, file)
	for _, part := range []struct {
		title  string
		schema map[string]*schemaNode
	}{
		{"Top-level keys", schema.Properties},
		{"Capability keys", caps.Items.Properties},
	} {
		doc := map[string]int{}
		for _, row := range tableRows(section(t, src, file, part.title)) {
			doc[strings.Trim(row[0], "`")]++
		}
		for k := range part.schema {
			if doc[k] == 0 {
				t.Errorf("%s, %s: no row for %s, which the schema has", file, part.title, k)
			}
		}
		for k, n := range doc {
			if _, ok := part.schema[k]; !ok {
				t.Errorf("%s, %s: %s is not a key of the schema", file, part.title, k)
			}
			if n > 1 {
				t.Errorf("%s, %s: %s is in %d rows", file, part.title, k, n)
			}
		}
	}

	// Every key of the schema, at any depth (device.location.zone,
	// network.mesh.mdns.interface, views.*.kinds …), is named in the docs.
	keys := map[string]bool{}
	allKeys(&schema, keys)
	t.Logf("%d top-level, %d capability and %d keys in all", len(schema.Properties), len(caps.Items.Properties), len(keys))
	var all strings.Builder
	for _, f := range docFiles(t) {
		all.WriteString(read(t, f))
	}
	text := all.String()
	for k := range keys {
		if !regexp.MustCompile(`(^|[^A-Za-z0-9_])` + regexp.QuoteMeta(k) + `($|[^A-Za-z0-9_])`).MatchString(text) {
			t.Errorf("the manifest schema's key %s is named nowhere in README.md or docs/", k)
		}
	}
}

// ---------------------------------------------------------------------------
// TestWalkthroughTools

// TestWalkthroughTools: the tools the quickstart (README.md) and the
// walkthrough (docs/tools.md) call are tools of the greenhouse example, and
// the quickstart, which runs without a policy or a token, calls no do_ tool
// that needs a role.
func TestWalkthroughTools(t *testing.T) {
	const example = "examples/greenhouse/physmcp.manifest.yml"
	type capability struct{ role string }
	tools := map[string]capability{"can_do": {}}
	var cur, kind, role string
	flush := func() {
		if cur != "" && kind != "" {
			tools[kind+"_"+cur] = capability{role}
		}
		cur, kind, role = "", "", ""
	}
	nameRE := regexp.MustCompile(`^  - name:\s*([a-z][a-z0-9_]*)`)
	keyRE := regexp.MustCompile(`^    (kind|requires_permission):\s*([a-z]+)`)
	for _, l := range strings.Split(read(t, example), "\n") {
		if m := nameRE.FindStringSubmatch(l); m != nil {
			flush()
			cur = m[1]
		} else if m := keyRE.FindStringSubmatch(l); m != nil && cur != "" {
			if m[1] == "kind" {
				kind = m[2]
			} else {
				role = m[2]
			}
		}
	}
	flush()
	if len(tools) < 10 {
		t.Fatalf("%s: found %d tools: is the scan still right?", example, len(tools))
	}
	callRE := regexp.MustCompile(`tools/call (\S+) '"name":"([^"]+)"`)
	for _, file := range []string{"README.md", "docs/tools.md"} {
		calls := 0
		for _, l := range lines(read(t, file)) {
			m := callRE.FindStringSubmatch(l.text)
			if !l.code || m == nil {
				continue
			}
			calls++
			c, ok := tools[m[1]]
			switch {
			case m[1] != m[2]:
				t.Errorf("%s:%d: the Mcp-Name header says %s, the body %s", file, l.n, m[1], m[2])
			case !ok:
				t.Errorf("%s:%d: %s is not a tool of %s", file, l.n, m[1], example)
			case file == "README.md" && c.role != "" && c.role != "none":
				t.Errorf("%s:%d: %s needs the %s role, which the quickstart (no policy, no token) does not have", file, l.n, m[1], c.role)
			}
		}
		if calls == 0 {
			t.Errorf("%s: no tools/call in a code block", file)
		}
	}
}

// TestPolicyKeys: every key of the policy schema, at any depth (identity.
// providers.*.hs256_secret_file, gate.l1.accept_nested …), is named in
// docs/policy.md, the policy's reference page.
func TestPolicyKeys(t *testing.T) {
	var schema schemaNode
	if err := json.Unmarshal([]byte(read(t, "schemas/physmcp.policy.schema.json")), &schema); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	allKeys(&schema, keys)
	if len(keys) < 20 {
		t.Fatalf("the policy schema has %d keys: is its shape still the same?", len(keys))
	}
	const file = "docs/policy.md"
	text := read(t, file)
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if !regexp.MustCompile(`(^|[^A-Za-z0-9_])` + regexp.QuoteMeta(k) + `($|[^A-Za-z0-9_])`).MatchString(text) {
			t.Errorf("%s: the policy schema's key %s is named nowhere; document it", file, k)
		}
	}
}

// TestPackageMap: docs/design.md's package map is the one map of the code.
// Every directory with Go code (tests aside: bench/, e2e/, docs/ and the
// examples are tools, not packages of the daemon) is on it, as a line of
// its own or named on its parent's line (drivers/sim is "sim/" on the
// drivers/ line), and every line names a directory that exists.
func TestPackageMap(t *testing.T) {
	const file = "docs/design.md"
	src := read(t, file)
	start := strings.Index(src, "## Packages")
	if start < 0 {
		t.Fatalf("%s: no \"## Packages\" section", file)
	}
	block := src[start:]
	if i := strings.Index(block, "```\n"); i >= 0 {
		block = block[i+4:]
	}
	if i := strings.Index(block, "```"); i >= 0 {
		block = block[:i]
	}
	lines := map[string]string{} // "drivers/" -> its line and the indented lines that continue it
	last := ""
	for _, l := range strings.Split(block, "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && strings.HasPrefix(l, " ") && last != "" {
			lines[last] += " " + l
			continue
		}
		if len(f) == 0 || !strings.HasSuffix(f[0], "/") {
			continue
		}
		last = f[0]
		dir := f[0]
		if fi, err := os.Stat(filepath.Join(root, dir)); err != nil || !fi.IsDir() {
			t.Errorf("%s: the package map names %s, which is not a directory", file, dir)
		}
		lines[dir] = l
	}
	if len(lines) < 10 {
		t.Fatalf("%s: %d lines in the package map: is its shape still the same?", file, len(lines))
	}
	skip := regexp.MustCompile(`^(bench|e2e|docs|examples|conformance|deploy)(/|$)|(^|/)testdata(/|$)`)
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "node_modules" || skip.MatchString(rel) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(rel))
		if dir == "." {
			return nil
		}
		if seen[dir] || packageOnMap(lines, dir) {
			return nil
		}
		seen[dir] = true
		t.Errorf("%s: package %s/ is not on the package map; add a line (or name it on its parent's line)", file, dir)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// packageOnMap: dir has its own line, or an ancestor's line names the
// next path element below that ancestor (as a word).
func packageOnMap(lines map[string]string, dir string) bool {
	if _, ok := lines[dir+"/"]; ok {
		return true
	}
	parts := strings.Split(dir, "/")
	for i := len(parts) - 1; i > 0; i-- {
		l, ok := lines[strings.Join(parts[:i], "/")+"/"]
		if !ok {
			continue
		}
		if regexp.MustCompile(`(^|[^A-Za-z0-9_])` + regexp.QuoteMeta(parts[i]) + `($|[^A-Za-z0-9_])`).MatchString(l) {
			return true
		}
	}
	return false
}
