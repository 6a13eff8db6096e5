// Package gate is physd's phocinae approval gate: every do_<cap> actuation
// passes it before it touches hardware (docs/design.md, "The actuation path").
//
// The chain follows upstream phocinae-guard (phocinae notes A4, kept outside the repository) with the
// changes of Part B:
//
//	normalise → L0 deny (table, then shell blacklist) → L0 allow → grey:
//	L1 (/v1/systemone, off by default) or, when L1 is off or unreachable,
//	the configured fail_closed decision (deny by default, or ask).
//
// Invariants: only allow executes; deny is final; a human confirmation may
// only turn ask into allow (layer human_confirm, see Approvals); no error,
// malformed answer, timeout or panic inside the gate ever yields allow.
package gate

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"reflect"
	"strconv"
	"strings"

	"github.com/physd/physd/strictyaml"
	"gopkg.in/yaml.v3"
)

// Decision is the gate verdict.
type Decision string

// Decisions.
const (
	Allow Decision = "allow"
	Ask   Decision = "ask"
	Deny  Decision = "deny"
)

// Layer names the part of the chain that decided.
type Layer string

// Layers.
const (
	LayerL0           Layer = "L0"
	LayerL1           Layer = "L1"
	LayerFailClosed   Layer = "fail_closed"
	LayerHumanConfirm Layer = "human_confirm"
)

// Defaults (upstream phocinae-guard BUILTIN_DEFAULTS, phocinae notes A4/B9).
const (
	DefaultServer        = "http://127.0.0.1:8155"
	DefaultModel         = "Phocinae-Largha-150M-v1"
	DefaultTimeoutMS     = 2000
	DefaultNoulThreshold = 0.65
	DefaultAskAt         = 4.0
	DefaultDenyAt        = 7.0
	// MaxStateChars bounds the state string sent to P0 (B4).
	MaxStateChars = 4096
	// MaxArgBytes bounds one string argument; longer strings are denied at L0.
	MaxArgBytes = 20000
	// MaxArgs bounds the number of arguments of one call.
	MaxArgs = 256
	// MaxTotalArgBytes bounds the tool name, argument names and string
	// values of one call together (bounds the blacklist work per call).
	MaxTotalArgBytes = 32 << 10
)

// Config is the gate: section of physmcp.policy.yml.
type Config struct {
	// FailClosed is the decision when L1 is disabled or unreachable (dial
	// error, timeout, non-2xx status): deny (default) or ask, never allow.
	// Any malformed, missing or out-of-range L1 answer is always deny.
	FailClosed Decision `yaml:"fail_closed" json:"fail_closed"`
	L0         Table    `yaml:"l0" json:"l0"`
	L1         L1Config `yaml:"l1" json:"l1"`
}

// Table is the L0 actuator table: deny rules first (first match wins), then
// allow rules, otherwise the call is grey.
type Table struct {
	Deny  []Rule `yaml:"deny" json:"deny"`
	Allow []Rule `yaml:"allow" json:"allow"`
}

// Rule is one L0 table entry. Every condition given must hold.
type Rule struct {
	Name  string         `yaml:"name" json:"name"`                       // required, unique
	Tool  string         `yaml:"tool" json:"tool"`                       // exact name or path.Match glob, e.g. do_heater_*
	Args  map[string]any `yaml:"args,omitempty" json:"args,omitempty"`   // listed args must be equal (numbers numerically)
	Range *RangeMatch    `yaml:"range,omitempty" json:"range,omitempty"` // numeric range on one argument
	Note  string         `yaml:"note,omitempty" json:"note,omitempty"`   // human reason shown to the caller
}

// RangeMatch matches when the numeric argument Arg lies inside [Min, Max]
// (a missing bound is open). With Outside it matches when the argument is
// outside the range — and also when it is missing or not a number, so a
// deny rule cannot be dodged by sending "200" as a string.
type RangeMatch struct {
	Arg     string   `yaml:"arg" json:"arg"`
	Min     *float64 `yaml:"min,omitempty" json:"min,omitempty"`
	Max     *float64 `yaml:"max,omitempty" json:"max,omitempty"`
	Outside bool     `yaml:"outside,omitempty" json:"outside,omitempty"`
}

// L1Config configures the P0 /v1/systemone client.
type L1Config struct {
	Enabled bool   `yaml:"enabled" json:"enabled"`
	Server  string `yaml:"server" json:"server"` // default http://127.0.0.1:8155
	Model   string `yaml:"model" json:"model"`   // default Phocinae-Largha-150M-v1
	// TokenEnv / TokenFile name the bearer token source (at most one). The
	// token is read once by Validate; never put the token in the policy.
	TokenEnv      string  `yaml:"token_env" json:"token_env,omitempty"`
	TokenFile     string  `yaml:"token_file" json:"token_file,omitempty"`
	TimeoutMS     int     `yaml:"timeout_ms" json:"timeout_ms"`         // default 2000
	NoulThreshold float64 `yaml:"noul_threshold" json:"noul_threshold"` // default 0.65, in [0.5, 1]
	AskAt         float64 `yaml:"ask_at" json:"ask_at"`                 // default 4
	DenyAt        float64 `yaml:"deny_at" json:"deny_at"`               // default 7
	// AllowRemote permits a non-loopback server.
	AllowRemote bool `yaml:"allow_remote" json:"allow_remote,omitempty"`
	// AcceptNested also accepts the legacy nested answer shape
	// {"type":"noul","noul":0.9} of the upstream guard mock (B2). Off: only
	// the flat P0 shape is accepted, anything else is deny.
	AcceptNested bool `yaml:"accept_nested" json:"accept_nested,omitempty"`

	// Transport replaces the HTTP transport (tests: p0test in-memory mode).
	Transport http.RoundTripper `yaml:"-" json:"-"`

	token *secret // behind a pointer: fmt prints an address, never the token
}

type secret struct{ v string }

func (s *secret) String() string { return "[redacted]" }

func (s *secret) value() string {
	if s == nil {
		return ""
	}
	return s.v
}

// HasToken reports whether a bearer token was loaded.
func (c *L1Config) HasToken() bool { return c.token.value() != "" }

// DecodeConfig decodes a gate: YAML node strictly and validates it, like
// DecodeConfigFile with no file name (positions print as <input>:line:col).
func DecodeConfig(node *yaml.Node) (Config, error) { return DecodeConfigFile("", node) }

// DecodeConfigFile decodes the gate: node of file strictly (unknown keys are
// errors with a "did you mean" from Config's own keys, which also catches a
// token pasted into the policy) and validates it. Every problem is a
// strictyaml.Error at the offending text (file:line:col, the gate.* field and
// the fix); a problem with a default is reported at the nearest key written.
func DecodeConfigFile(file string, node *yaml.Node) (Config, error) {
	var c Config
	if node != nil && node.Kind != 0 && !strictyaml.IsNull(node) {
		n, errs := strictyaml.Normalize(file, node)
		if len(errs) > 0 {
			return c, errs
		}
		compat(n, reflect.TypeFor[Config]())
		if errs := strictyaml.Decode(file, n, "gate", &c); len(errs) > 0 {
			return c, errs
		}
		node = n
	} else {
		node = nil
	}
	p := &strictyaml.Problems{File: file, Root: "gate", Top: node}
	c.validate(func(field, msg string) { p.AddAt(locate(p.Top, field), "gate."+field, msg, "") })
	return c, p.Errs.Sorted().Err()
}

// locate returns the node a Validate field path (l0.deny[2].range.min)
// names in the gate: node, or the nearest one written on the way (the gate:
// node itself when none is; nil without a node).
func locate(n *yaml.Node, field string) *yaml.Node {
	cur := strictyaml.Resolve(n)
	for _, part := range strings.Split(field, ".") {
		key, idx := part, -1
		if k, rest, ok := strings.Cut(part, "["); ok {
			key = k
			if i, err := strconv.Atoi(strings.TrimSuffix(rest, "]")); err == nil {
				idx = i
			}
		}
		next := strictyaml.Resolve(strictyaml.ValueOf(cur, key))
		if next == nil {
			return cur
		}
		if idx >= 0 {
			if next.Kind != yaml.SequenceNode || idx >= len(next.Content) {
				return next
			}
			next = strictyaml.Resolve(next.Content[idx])
		}
		if next == nil {
			return cur
		}
		cur = next
	}
	return cur
}

// Validate fills defaults, checks every field and loads the bearer token.
// Errors name the field and the fix; all problems are reported together.
func (c *Config) Validate() error {
	var errs []error
	c.validate(func(field, msg string) { errs = append(errs, fmt.Errorf("gate.%s: %s", field, msg)) })
	return errors.Join(errs...)
}

// validate is Validate reporting each problem as a field below gate. and
// its message (which ends with the fix).
func (c *Config) validate(report func(field, msg string)) {
	bad := func(field, format string, a ...any) { report(field, fmt.Sprintf(format, a...)) }
	switch c.FailClosed {
	case "":
		c.FailClosed = Deny
	case Deny, Ask:
	case Allow:
		bad("fail_closed", `"allow" is never permitted (a gate failure must not actuate); use deny (default) or ask`)
	default:
		bad("fail_closed", "%q is not a decision; use deny (default) or ask", c.FailClosed)
	}
	names := map[string]string{}
	for _, r := range shellRules {
		names[r.Name] = "the built-in shell blacklist"
	}
	for i := range c.L0.Deny {
		validateRule(&c.L0.Deny[i], fmt.Sprintf("l0.deny[%d]", i), false, names, bad)
	}
	for i := range c.L0.Allow {
		validateRule(&c.L0.Allow[i], fmt.Sprintf("l0.allow[%d]", i), true, names, bad)
	}
	l := &c.L1
	l.defaults()
	l.validateRanges(bad)
	u, err := l.validateServer(bad)
	l.loadToken(bad)
	if l.HasToken() && err == nil && u != nil && u.Scheme == "http" && !isLoopbackHost(u.Hostname()) {
		bad("l1.server", "a bearer token must not travel over plain http to a non-loopback host; use https://")
	}
}

type badFunc = func(field, format string, a ...any)

func (l *L1Config) defaults() {
	if l.Server == "" {
		l.Server = DefaultServer
	}
	if l.Model == "" {
		l.Model = DefaultModel
	}
	if l.TimeoutMS == 0 {
		l.TimeoutMS = DefaultTimeoutMS
	}
	if l.NoulThreshold == 0 {
		l.NoulThreshold = DefaultNoulThreshold
	}
	if l.AskAt == 0 {
		l.AskAt = DefaultAskAt
	}
	if l.DenyAt == 0 {
		l.DenyAt = DefaultDenyAt
	}
}

func (l *L1Config) validateRanges(bad badFunc) {
	if l.TimeoutMS < 100 || l.TimeoutMS > 60000 {
		bad("l1.timeout_ms", "%d is out of range; use 100..60000 (default 2000)", l.TimeoutMS)
	}
	if !finite(l.NoulThreshold) || l.NoulThreshold < 0.5 || l.NoulThreshold > 1 {
		bad("l1.noul_threshold", "%v is out of range; use 0.5..1 (default 0.65; below 0.5 the allow and deny bands overlap)", l.NoulThreshold)
	}
	if !finite(l.AskAt) || l.AskAt < 2 || l.AskAt > 10 {
		bad("l1.ask_at", "%v is out of range; use 2..10 (default 4)", l.AskAt)
	}
	if !finite(l.DenyAt) || l.DenyAt < 2 || l.DenyAt > 10 {
		bad("l1.deny_at", "%v is out of range; use 2..10 (default 7)", l.DenyAt)
	} else if l.DenyAt < l.AskAt {
		bad("l1.deny_at", "%v is below ask_at %v; deny_at must be >= ask_at", l.DenyAt, l.AskAt)
	}
	if strings.TrimSpace(l.Model) != l.Model {
		bad("l1.model", "%q has surrounding spaces; the server compares the name exactly", l.Model)
	}
}

// validateServer checks the server URL; it returns what url.Parse did.
func (l *L1Config) validateServer(bad badFunc) (*url.URL, error) {
	u, err := url.Parse(l.Server)
	switch {
	case err != nil:
		bad("l1.server", "%q is not a URL (%v); use e.g. %s", l.Server, err, DefaultServer)
	case u.Scheme != "http" && u.Scheme != "https":
		bad("l1.server", "scheme %q is not supported; use http:// or https://", u.Scheme)
	case u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "":
		bad("l1.server", "%q must be a plain base URL like %s (no credentials, query or fragment)", l.Server, DefaultServer)
	case !l.AllowRemote && !isLoopbackHost(u.Hostname()):
		bad("l1.server", "%q is not a loopback address; run the P0 service on 127.0.0.1 or set l1.allow_remote: true", u.Host)
	}
	return u, err
}

// loadToken reads the bearer token from token_env or token_file.
func (l *L1Config) loadToken(bad badFunc) {
	l.token = nil
	switch {
	case l.TokenEnv != "" && l.TokenFile != "":
		bad("l1.token_env", "both token_env and token_file are set; keep one")
	case l.TokenEnv != "":
		v, ok := os.LookupEnv(l.TokenEnv)
		v = strings.TrimSpace(v)
		if !ok || v == "" {
			bad("l1.token_env", "environment variable %s is unset or empty; export it or remove token_env", l.TokenEnv)
		}
		l.token = &secret{v}
	case l.TokenFile != "":
		l.token = readTokenFile(l.TokenFile, bad)
	}
	if strings.ContainsAny(l.token.value(), "\r\n") {
		bad("l1.token_env", "the bearer token contains a line break; store a single-line token")
	}
}

// readTokenFile reads a token file that only its owner (and group) can read;
// nil when it cannot be used.
func readTokenFile(name string, bad badFunc) *secret {
	fi, err := os.Stat(name)
	if err != nil {
		bad("l1.token_file", "%v; point it at a readable file holding the bearer token", err)
		return nil
	}
	if fi.Mode().Perm()&0o007 != 0 {
		bad("l1.token_file", "%s is accessible by other users (mode %v); chmod 600 it", name, fi.Mode().Perm())
		return nil
	}
	b, err := os.ReadFile(name)
	if err != nil {
		bad("l1.token_file", "%v", err)
		return nil
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		bad("l1.token_file", "%s is empty; write the bearer token into it", name)
	}
	return &secret{v}
}

func validateRule(r *Rule, field string, allow bool, names map[string]string, bad badFunc) {
	if r.Name == "" {
		bad(field+".name", "is required; give every rule a unique name")
	} else if prev, dup := names[r.Name]; dup {
		bad(field+".name", "%q is already used by %s; names must be unique", r.Name, prev)
	} else {
		names[r.Name] = "gate." + field
	}
	switch {
	case r.Tool == "":
		bad(field+".tool", "is required; name the tool exactly (do_set_fan) or with a glob (do_heater_*)")
	case allow && strings.Trim(r.Tool, "*?") == "":
		bad(field+".tool", "%q would allow every tool; name the tools (a prefix glob such as do_fan_* at most)", r.Tool)
	default:
		if _, err := path.Match(r.Tool, "do_x"); err != nil {
			bad(field+".tool", "%q is not a valid glob (%v); use * and ? only, brackets closed", r.Tool, err)
		}
	}
	for k, v := range r.Args {
		if !isScalar(v) {
			bad(field+".args."+k, "must be a scalar (string, number, bool or null), got %T", v)
		}
	}
	if rg := r.Range; rg != nil {
		switch {
		case rg.Arg == "":
			bad(field+".range.arg", "is required; name the numeric argument, e.g. value")
		case rg.Min == nil && rg.Max == nil:
			bad(field+".range", "needs min, max or both")
		case rg.Min != nil && !finite(*rg.Min), rg.Max != nil && !finite(*rg.Max):
			bad(field+".range", "min and max must be finite numbers")
		case rg.Min != nil && rg.Max != nil && *rg.Min > *rg.Max:
			bad(field+".range", "min %v is above max %v; swap them", *rg.Min, *rg.Max)
		}
	}
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

func isLoopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// compat rewrites, in the normalised copy n, what yaml.v3 (which decoded the
// gate: section before strictyaml) accepted and strictyaml refuses, so every
// gate that loaded still loads the same: a null value of a struct, string,
// number or bool key (the field's zero value: the key is dropped), a YAML
// 1.1 boolean (yes/no/on/off/y/n) for a bool, and a number for an int
// (truncated, as yaml.v3 did).
func compat(n *yaml.Node, t reflect.Type) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n == nil {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return
		}
		_, index := strictyaml.StructKeys(t)
		kept := n.Content[:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if idx, ok := index[k.Value]; ok {
				ft := t.FieldByIndex(idx).Type
				if strictyaml.IsNull(v) && zeroOnNull(ft) {
					continue
				}
				compat(v, ft)
			}
			kept = append(kept, k, v)
		}
		n.Content = kept
	case reflect.Slice:
		if n.Kind == yaml.SequenceNode {
			for _, e := range n.Content {
				compat(e, t.Elem())
			}
		}
	case reflect.Bool:
		if b, ok := yaml11Bool[n.Value]; ok && n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" {
			n.Tag, n.Value = "!!bool", strconv.FormatBool(b)
		}
	case reflect.Int, reflect.Int64:
		if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" {
			var f float64
			if n.Decode(&f) == nil && f <= math.MaxInt64 && f >= math.MinInt64 {
				n.Tag, n.Value = "!!int", strconv.FormatInt(int64(f), 10)
			}
		}
	}
}

// zeroOnNull reports whether yaml.v3 decoded a null into t as t's zero
// value where strictyaml refuses it (pointers, slices, maps and interfaces
// are nil in both).
func zeroOnNull(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Map, reflect.Interface:
		return false
	}
	return true
}

// yaml11Bool is what yaml.v3 accepts for a Go bool besides true and false.
var yaml11Bool = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}
