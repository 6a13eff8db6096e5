package lint

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Protocol versions tried, newest first.
var Versions = []string{"2026-07-28", "2025-11-25"}

// Target is the server to lint: a Streamable HTTP endpoint or a stdio
// command.
type Target struct {
	URL     string
	Command []string
	Header  http.Header // added to every HTTP request (e.g. Authorization)
}

func (t Target) String() string {
	if t.URL != "" {
		return t.URL
	}
	return strings.Join(t.Command, " ")
}

// Options tune a live run.
type Options struct {
	// AllowDo calls each do_ tool once, with the capability's current value
	// when one is obvious. Without it no do_ tool is ever called.
	AllowDo bool
	// Timeout bounds the whole run (default 30 s).
	Timeout time.Duration
	// MaxDoProbes bounds the can_do probes built from do_ tool names
	// (default 8; every do_ tool with AllowDo).
	MaxDoProbes int
	// ClientName is sent as clientInfo (default physd-lint).
	ClientName, ClientVersion string
}

// ConnectError means the server could not be reached or listed: exit 2.
type ConnectError struct{ Err error }

func (e *ConnectError) Error() string { return e.Err.Error() }
func (e *ConnectError) Unwrap() error { return e.Err }

// headerTransport adds fixed headers to every request and keeps the
// first refusal the server explained (refused).
type headerTransport struct {
	h       http.Header
	rt      http.RoundTripper
	refused *refusal
}

func (t headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, vs := range t.h {
		r.Header.Del(k)
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	resp, err := t.rt.RoundTrip(r)
	if err == nil && resp.StatusCode >= 400 && t.refused != nil {
		t.refused.keep(resp)
	}
	return resp, err
}

// refusal is an HTTP error answer's status and body. The MCP client
// reports only the status text ("Unauthorized"); the body says why (a
// token not accepted here, a Host not allowed), which is what the person
// running lint needs.
type refusal struct {
	mu     sync.Mutex
	status string
	code   int
	body   string
}

// keep records resp's status and the start of its body (the first
// refusal only), and gives the body back to the caller intact.
func (f *refusal) keep(resp *http.Response) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body = readCloser{io.MultiReader(bytes.NewReader(b), resp.Body), resp.Body}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.status == "" {
		f.status, f.code = resp.Status, resp.StatusCode
		f.body = strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0])
		// "Unauthorized: the bearer token is not accepted here" after a
		// status that already says Unauthorized.
		f.body = strings.TrimPrefix(f.body, http.StatusText(resp.StatusCode)+": ")
	}
}

// err is the refusal as one line with its fix, or nil when none came;
// whole says it explains the failure by itself (a refused credential, a
// wrong URL) rather than one protocol version's.
func (f *refusal) err(url string) (whole bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.status == "" {
		return false, nil
	}
	msg := fmt.Sprintf("%s answered %s", url, f.status)
	if f.body != "" {
		msg += ": " + f.body
	}
	switch f.code {
	case http.StatusUnauthorized, http.StatusForbidden:
		msg += `; fix: send a credential the server accepts, e.g. --header "Authorization: Bearer <token>" with a token the server's policy lists`
	case http.StatusNotFound:
		msg += "; fix: give the MCP endpoint's URL (physd serves it at /mcp)"
	default:
		return false, errors.New(msg)
	}
	return true, errors.New(msg)
}

type readCloser struct {
	io.Reader
	io.Closer
}

// lockedBuffer keeps a stdio server's stderr for error reports.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 64<<10 {
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// connect opens a session, trying each protocol version in turn.
func connect(ctx context.Context, t Target, o Options) (*mcp.ClientSession, string, error) {
	var errs []error
	refused := &refusal{}
	for _, v := range Versions {
		c := mcp.NewClient(&mcp.Implementation{Name: o.ClientName, Version: o.ClientVersion},
			&mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}}) // no elicitation, sampling or roots
		var (
			tr     mcp.Transport
			stderr *lockedBuffer
		)
		if t.URL != "" {
			hc := &http.Client{Transport: headerTransport{t.Header, http.DefaultTransport, refused}}
			tr = &mcp.StreamableClientTransport{Endpoint: t.URL, HTTPClient: hc, MaxRetries: 1}
		} else {
			cmd := exec.CommandContext(ctx, t.Command[0], t.Command[1:]...)
			stderr = &lockedBuffer{}
			cmd.Stderr = stderr
			tr = &mcp.CommandTransport{Command: cmd, TerminateDuration: 5 * time.Second}
		}
		cs, err := c.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: v})
		if err == nil {
			got := v
			if ir := cs.InitializeResult(); ir != nil && ir.ProtocolVersion != "" {
				got = ir.ProtocolVersion
			}
			return cs, got, nil
		}
		msg := fmt.Errorf("MCP %s: %w", v, err)
		if stderr != nil {
			if s := strings.TrimSpace(stderr.String()); s != "" {
				msg = fmt.Errorf("%w\nserver stderr:\n%s", msg, lastLines(s, 15))
			}
		}
		errs = append(errs, msg)
		if ctx.Err() != nil {
			break
		}
	}
	if whole, err := refused.err(t.URL); whole {
		// A credential or the URL is wrong, whatever the version: say
		// it once.
		return nil, "", err
	} else if err != nil {
		errs = append(errs, err)
	}
	return nil, "", errors.Join(errs...)
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// listTools returns every tool as its JSON object, following cursors.
func listTools(ctx context.Context, cs *mcp.ClientSession) ([]map[string]any, error) {
	var out []map[string]any
	params := &mcp.ListToolsParams{}
	for range 1000 {
		res, err := cs.ListTools(ctx, params)
		if err != nil {
			return nil, err
		}
		for _, t := range res.Tools {
			m, err := toMap(t)
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		}
		if res.NextCursor == "" {
			return out, nil
		}
		params = &mcp.ListToolsParams{Cursor: res.NextCursor}
	}
	return nil, errors.New("tools/list: more than 1000 pages")
}

func toMap(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(&m); err != nil {
		return nil, err
	}
	return m, nil
}

// newKey returns a UUIDv4 idempotency key.
func newKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// runner holds one live run's state.
type runner struct {
	cs      *mcp.ClientSession
	tools   map[string]map[string]any
	names   map[string]bool
	schemas map[string]*jsonschema.Resolved
	out     []RuntimeResult
}

// Run connects to t, lints the listed tools and makes the runtime checks.
// A *ConnectError means nothing could be linted (exit 2).
func Run(ctx context.Context, t Target, o Options) (*Report, error) {
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.MaxDoProbes <= 0 {
		o.MaxDoProbes = 8
	}
	if o.ClientName == "" {
		o.ClientName, o.ClientVersion = "physd-lint", "1"
	}
	if t.URL == "" && len(t.Command) == 0 {
		return nil, &ConnectError{errors.New("no target: give an http(s) URL, -- a stdio command, or a tools.json file")}
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	cs, version, err := connect(ctx, t, o)
	if err != nil {
		return nil, &ConnectError{fmt.Errorf("cannot connect to %s: %w", t, err)}
	}
	defer cs.Close()
	tools, err := listTools(ctx, cs)
	if err != nil {
		return nil, &ConnectError{fmt.Errorf("tools/list on %s: %w", t, err)}
	}
	if len(tools) == 0 {
		return nil, &ConnectError{fmt.Errorf("%s lists no tools", t)}
	}
	rep := LintTools(tools)
	rep.Target = t.String()
	rep.Transport = "http"
	if t.URL == "" {
		rep.Transport = "stdio"
	}
	rep.ProtocolVersion = version
	if ir := cs.InitializeResult(); ir != nil && ir.ServerInfo != nil {
		rep.ServerName, rep.ServerVersion = ir.ServerInfo.Name, ir.ServerInfo.Version
	}

	r := &runner{cs: cs, tools: map[string]map[string]any{}, names: map[string]bool{}, schemas: map[string]*jsonschema.Resolved{}}
	var names []string
	for _, tl := range tools {
		if n, ok := nameOf(tl); ok {
			r.tools[n] = tl
			r.names[n] = true
			names = append(names, n)
		}
	}
	sort.Strings(names)
	maxDo := o.MaxDoProbes
	if o.AllowDo {
		maxDo = len(names)
	}
	reports := r.canDoProbes(ctx, Probes(names, maxDo))
	reads := r.reads(ctx, names)
	r.dos(ctx, names, o.AllowDo, reads, reports)
	rep.Runtime = r.out
	rep.finish()
	return rep, nil
}

// call invokes a tool and returns its answer as a JSON object. A non-nil
// finding means there is no answer to check.
func (r *runner) call(ctx context.Context, name string, args map[string]any, failCode string) (map[string]any, *Finding) {
	res, err := r.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		fd := f(SevError, failCode, "%s: protocol error: %v", name, err)
		return nil, &fd
	}
	txt := textOf(res)
	if res.IsError {
		fd := f(SevError, failCode, "%s: tool error: %s", name, oneLine(txt, 300))
		return nil, &fd
	}
	var m map[string]any
	if res.StructuredContent != nil {
		m, err = toMap(res.StructuredContent)
	} else {
		err = json.Unmarshal([]byte(txt), &m)
	}
	if err != nil || m == nil {
		fd := f(SevError, "RT021", "%s: the answer is not a JSON object (structuredContent %T, text %q)", name, res.StructuredContent, oneLine(txt, 120))
		return nil, &fd
	}
	return m, nil
}

func textOf(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len([]rune(s)) > n {
		s = string([]rune(s)[:n]) + "…"
	}
	return s
}

// validate checks an answer against the tool's outputSchema (RT027).
func (r *runner) validate(tool string, answer map[string]any) []Finding {
	rs, ok := r.schemas[tool]
	if !ok {
		rs = nil
		if raw := asMap(r.tools[tool]["outputSchema"]); len(raw) > 0 {
			b, _ := json.Marshal(raw)
			var s jsonschema.Schema
			if json.Unmarshal(b, &s) == nil {
				rs, _ = s.Resolve(nil)
			}
		}
		r.schemas[tool] = rs
	}
	if rs == nil {
		return nil
	}
	if err := rs.Validate(answer); err != nil {
		return []Finding{f(SevError, "RT027", "structuredContent does not match outputSchema: %s", oneLine(err.Error(), 300))}
	}
	return nil
}

func (r *runner) add(tool, check, summary string, fs ...Finding) {
	if fs == nil {
		fs = []Finding{}
	}
	r.out = append(r.out, RuntimeResult{Tool: tool, Check: check, Summary: summary, Findings: fs})
}

func (r *runner) canDoProbes(ctx context.Context, probes []Probe) []map[string]any {
	if !r.names[canDo] {
		return nil
	}
	var reports []map[string]any
	seenIDs := map[string]bool{}
	for _, p := range probes {
		sent := time.Now()
		ans, fail := r.call(ctx, canDo, p.Args, "RT001")
		if fail != nil {
			r.add(canDo, p.Label, "no answer", *fail)
			continue
		}
		fs := CheckCanDo(CanDoCheck{Report: ans, SentAt: sent, Nonsense: p.Nonsense, Tools: r.names})
		fs = append(fs, r.validate(canDo, ans)...)
		if id, _ := ans["query_id"].(string); id != "" {
			if seenIDs[id] {
				fs = append(fs, f(SevWarning, "RT017", "query_id %s was already used by an earlier answer", id))
			}
			seenIDs[id] = true
		}
		r.add(canDo, p.Label, summarizeCanDo(ans), fs...)
		reports = append(reports, ans)
	}
	return reports
}

func summarizeCanDo(ans map[string]any) string {
	cands, _ := ans["candidates"].([]any)
	blocked, _ := ans["blocked"].([]any)
	unr, _ := ans["unroutable"].([]any)
	var parts []string
	parts = append(parts, fmt.Sprintf("feasible=%v", ans["feasible"]))
	if len(cands) > 0 {
		var cs []string
		for _, c := range cands {
			m := asMap(c)
			cs = append(cs, fmt.Sprintf("%v(%v)", m["capability"], m["permission"]))
		}
		parts = append(parts, "candidates "+strings.Join(cs, ", "))
	}
	if len(blocked) > 0 {
		var bs []string
		for _, b := range blocked {
			m := asMap(b)
			bs = append(bs, fmt.Sprintf("%v(%v)", m["capability"], m["permission"]))
		}
		parts = append(parts, "blocked "+strings.Join(bs, ", "))
	}
	if len(unr) > 0 {
		var us []string
		for _, u := range unr {
			us = append(us, fmt.Sprint(asMap(u)["reason"]))
		}
		parts = append(parts, "unroutable "+strings.Join(us, ", "))
	}
	return strings.Join(parts, "; ")
}

// requiredArgs lists the required input properties of a tool.
func requiredArgs(tool map[string]any) []string {
	req, _ := asMap(tool["inputSchema"])["required"].([]any)
	var out []string
	for _, v := range req {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// reads calls every read_ tool that needs no arguments and returns the
// answers by tool.
func (r *runner) reads(ctx context.Context, names []string) map[string]map[string]any {
	got := map[string]map[string]any{}
	for _, n := range names {
		if !strings.HasPrefix(n, "read_") {
			continue
		}
		if req := requiredArgs(r.tools[n]); len(req) > 0 {
			r.add(n, "read", "not called", f(SevInfo, "RT029", "needs arguments %v; not guessed", req))
			continue
		}
		ans, fail := r.call(ctx, n, map[string]any{}, "RT020")
		if fail != nil {
			r.add(n, "read", "no answer", *fail)
			continue
		}
		fs := CheckRead(ans, time.Now())
		fs = append(fs, r.validate(n, ans)...)
		unit := ""
		if u, ok := ans["unit"].(string); ok && u != "" {
			unit = " " + u
		}
		r.add(n, "read", fmt.Sprintf("%s%s, quality %v", fmtValue(ans["value"]), unit, ans["quality"]), fs...)
		got[n] = ans
	}
	return got
}

func fmtValue(v any) string {
	if v == nil {
		return "null"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// dos calls each do_ tool once with its capability's current value, only
// when allowed and when that value is obvious: the read_ of the same
// capability, or can_do's current_state for exactly that tool.
func (r *runner) dos(ctx context.Context, names []string, allow bool, reads map[string]map[string]any, reports []map[string]any) {
	var dos []string
	for _, n := range names {
		if strings.HasPrefix(n, "do_") {
			dos = append(dos, n)
		}
	}
	if len(dos) == 0 {
		return
	}
	if !allow {
		r.add("do_*", "do", "not called", f(SevInfo, "RT029", "%d do_ tool(s) not called: physd lint never actuates without --allow-do", len(dos)))
		return
	}
	for _, n := range dos {
		req := requiredArgs(r.tools[n])
		props := propsOf(asMap(r.tools[n]["inputSchema"]))
		if _, ok := props["value"]; !ok {
			r.add(n, "do", "not called", f(SevInfo, "RT029", "no 'value' argument; not guessed"))
			continue
		}
		if extra := without(req, "value", "idempotency_key"); len(extra) > 0 {
			r.add(n, "do", "not called", f(SevInfo, "RT029", "needs arguments %v; not guessed", extra))
			continue
		}
		value, source, ok := r.currentValue(ctx, n, reads, reports)
		if !ok {
			r.add(n, "do", "not called", f(SevInfo, "RT029", "no obvious current value (no read_%s, and can_do gave no good current_state for %s)", strings.TrimPrefix(n, "do_"), n))
			continue
		}
		key := "physd-lint-" + newKey()
		ans, fail := r.call(ctx, n, map[string]any{"value": value, "idempotency_key": key}, "RT030")
		check := fmt.Sprintf("do value=%s (current, from %s)", fmtValue(value), source)
		if fail != nil {
			r.add(n, check, "no answer", *fail)
			continue
		}
		fs := CheckDo(ans, key)
		fs = append(fs, r.validate(n, ans)...)
		sum := fmt.Sprintf("status %v", ans["status"])
		if p, _ := ans["permission"].(string); p != "" && ans["status"] != "success" {
			sum += ", permission " + p
		}
		if h, _ := ans["compensation_hint"].(string); h != "" {
			sum += fmt.Sprintf(", compensation_hint %q", h)
		}
		r.add(n, check, sum, fs...)
	}
}

func without(list []string, drop ...string) []string {
	var out []string
	for _, s := range list {
		if !contains(drop, s) {
			out = append(out, s)
		}
	}
	return out
}

// currentValue finds a do_ tool's current value: read_<cap>, then the
// probes' can_do answers, then a can_do scoped to the tool.
func (r *runner) currentValue(ctx context.Context, tool string, reads map[string]map[string]any, reports []map[string]any) (any, string, bool) {
	read := "read_" + strings.TrimPrefix(tool, "do_")
	if ans := reads[read]; ans != nil && ans["quality"] == "good" && ans["value"] != nil {
		return ans["value"], read, true
	}
	if v, ok := CurrentValue(reports, tool); ok {
		return v, "can_do current_state", true
	}
	if !r.names[canDo] {
		return nil, "", false
	}
	words := capWords(tool)
	if len(words) == 0 {
		return nil, "", false
	}
	ans, fail := r.call(ctx, canDo, map[string]any{"intent": map[string]any{"semantic_tags": []any{words[0]}}, "scope": []any{tool}}, "RT001")
	if fail != nil {
		return nil, "", false
	}
	if v, ok := CurrentValue([]map[string]any{ans}, tool); ok {
		return v, "can_do current_state", true
	}
	return nil, "", false
}

// LintTools applies the static rules to a tool list (a file, or what a
// server listed).
func LintTools(tools []map[string]any) *Report {
	res, server := LintServer(tools)
	rep := &Report{PromcpVersion: PromcpVersion, Server: server, Tools: res, Runtime: []RuntimeResult{}}
	rep.finish()
	return rep
}

// LoadTools reads a tools file: a JSON array of tool objects, or
// {"tools": [...]} (an MCP tools/list result).
func LoadTools(r io.Reader) ([]map[string]any, error) {
	var raw any
	d := json.NewDecoder(r)
	if err := d.Decode(&raw); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	var list []any
	switch v := raw.(type) {
	case []any:
		list = v
	case map[string]any:
		t, ok := v["tools"].([]any)
		if !ok {
			return nil, errors.New(`JSON must be an array of tool objects or {"tools": [...]}`)
		}
		list = t
	default:
		return nil, errors.New(`JSON must be an array of tool objects or {"tools": [...]}`)
	}
	out := make([]map[string]any, 0, len(list))
	for i, e := range list {
		m, ok := e.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("tools[%d] is not an object", i)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, errors.New("no tools found")
	}
	return out, nil
}
