package gate

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/physd/physd/promcp"
)

// Request is one actuation to decide on.
type Request struct {
	Tool     string         // the MCP tool name, e.g. do_set_valve
	Args     map[string]any // decoded JSON arguments, e.g. {"value": 42.0}
	DeviceID string         // the owner device; sent to L1 as cwd "device:<id>"
	Caller   string         // who asked (for audit)
	// Key is the call's idempotency key: it is not an argument (no
	// fingerprint or L1 command includes it), but the shell blacklist
	// applies to it as to every string the caller sent.
	Key string
}

// Thresholds are the L1 mapping thresholds.
type Thresholds struct {
	NoulThreshold float64 `json:"noul_threshold"`
	DenyAt        float64 `json:"deny_at"`
	AskAt         float64 `json:"ask_at"`
}

// Result is the gate decision: a JSON superset of the upstream phocinae gate
// result (phocinae notes B2). noul, score, noul_state, confidence and error are
// null when they do not apply.
type Result struct {
	Command     string             `json:"command"`
	Cwd         string             `json:"cwd"`
	Decision    Decision           `json:"decision"`
	Layer       Layer              `json:"layer"`
	Reason      string             `json:"reason"`
	Noul        *float64           `json:"noul"`
	Score       *float64           `json:"score"`
	NoulState   string             `json:"noul_state"` // true | false | wavering
	Thresholds  *Thresholds        `json:"thresholds"`
	Confirm     bool               `json:"confirm"`
	Engine      string             `json:"engine"`
	Server      string             `json:"server"`
	FailClosed  Decision           `json:"fail_closed"`
	Tool        string             `json:"tool"`
	Fingerprint string             `json:"fingerprint"`
	Model       string             `json:"model"`
	Confidence  map[string]float64 `json:"confidence"`
	Error       string             `json:"error"`
	Rule        string             `json:"rule,omitempty"`
}

// MarshalJSON writes empty noul_state and error as null, like upstream.
func (r Result) MarshalJSON() ([]byte, error) {
	type plain Result
	w := struct {
		plain
		NoulState *string `json:"noul_state"`
		Error     *string `json:"error"`
	}{plain: plain(r)}
	if r.NoulState != "" {
		w.NoulState = &r.NoulState
	}
	if r.Error != "" {
		w.Error = &r.Error
	}
	return json.Marshal(w)
}

// Permission maps the decision onto the proMCP permission enum.
func (r Result) Permission() promcp.Permission {
	switch r.Decision {
	case Allow:
		return promcp.PermAllowed
	case Ask:
		return promcp.PermRequiresHumanApproval
	}
	return promcp.PermPolicyDenied
}

// GateNote is the short form carried in a do_* response.
func (r Result) GateNote() *promcp.GateNote {
	return &promcp.GateNote{Decision: string(r.Decision), Layer: string(r.Layer), Reason: r.Reason,
		Engine: r.Engine, Fingerprint: r.Fingerprint}
}

// Gate decides. It is safe for concurrent use.
type Gate struct {
	cfg        Config
	version    string
	engine     string // guard:physd-<version>
	toolID     string // physd/<version>
	endpoint   string // {server}/v1/systemone
	client     *http.Client
	thresholds Thresholds
	health     l1Health // what the gate knows of the P0 service (dry runs)
}

// New validates cfg (a copy) and builds the gate. version goes into engine
// "guard:physd-<version>" and tool "physd/<version>".
func New(cfg Config, version string) (*Gate, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if version == "" {
		version = "dev"
	}
	g := &Gate{
		cfg:      cfg,
		version:  version,
		engine:   "guard:physd-" + version,
		toolID:   "physd/" + version,
		endpoint: endpointOf(cfg.L1.Server),
		thresholds: Thresholds{NoulThreshold: cfg.L1.NoulThreshold,
			DenyAt: cfg.L1.DenyAt, AskAt: cfg.L1.AskAt},
	}
	rt := cfg.L1.Transport
	if rt == nil {
		allowRemote := cfg.L1.AllowRemote
		d := &net.Dialer{
			Timeout: time.Duration(cfg.L1.TimeoutMS) * time.Millisecond,
			// Enforce loopback on the resolved address too ("localhost"
			// pointing elsewhere must not leak the request).
			Control: func(_, address string, _ syscall.RawConn) error {
				if allowRemote {
					return nil
				}
				host, _, err := net.SplitHostPort(address)
				if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
					return fmt.Errorf("refusing non-loopback P0 address %s (set l1.allow_remote)", address)
				}
				return nil
			},
		}
		rt = &http.Transport{
			Proxy:                 nil,
			DialContext:           d.DialContext,
			ForceAttemptHTTP2:     false,
			MaxIdleConns:          4,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       30 * time.Second,
			ResponseHeaderTimeout: time.Duration(cfg.L1.TimeoutMS) * time.Millisecond,
		}
	}
	g.client = &http.Client{
		Transport: rt,
		// One attempt, no redirects: a 3xx is a non-2xx status.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return g, nil
}

func endpointOf(server string) string {
	s := strings.TrimRight(server, "/")
	if strings.HasSuffix(s, "/v1/systemone") {
		return s
	}
	return s + "/v1/systemone"
}

// Config returns the validated configuration (defaults filled).
func (g *Gate) Config() Config { return g.cfg }

// base fills the fields every result carries.
func (g *Gate) base(r Request) Result {
	cmd, fp := Canonical(r.Tool, r.Args)
	th := g.thresholds
	return Result{
		Command:     cmd,
		Cwd:         "device:" + r.DeviceID,
		Thresholds:  &th,
		Engine:      g.engine,
		Server:      g.cfg.L1.Server,
		FailClosed:  g.cfg.FailClosed,
		Tool:        g.toolID,
		Fingerprint: fp,
		Model:       g.cfg.L1.Model,
	}
}

// recovered turns a panic into a deny, never an allow.
func (g *Gate) recovered(r Request, p any) Result {
	if g == nil {
		return Result{Command: r.Tool, Cwd: "device:" + r.DeviceID, Decision: Deny, Layer: LayerFailClosed,
			Reason: fmt.Sprintf("fail-closed (deny): internal gate error: %v", p), Error: fmt.Sprintf("panic: %v", p), FailClosed: Deny}
	}
	th := g.thresholds
	return Result{
		Command: r.Tool, Cwd: "device:" + r.DeviceID, Decision: Deny, Layer: LayerFailClosed,
		Reason:     fmt.Sprintf("fail-closed (deny): internal gate error: %v", p),
		Error:      fmt.Sprintf("panic: %v", p),
		Thresholds: &th, Engine: g.engine, Server: g.cfg.L1.Server, FailClosed: g.cfg.FailClosed,
		Tool: g.toolID, Model: g.cfg.L1.Model,
	}
}

// sane makes sure a result carries one of the three decisions; anything
// else is a bug and becomes deny.
func sane(res Result) Result {
	switch res.Decision {
	case Allow, Ask, Deny:
		return res
	}
	res.Decision, res.Layer = Deny, LayerFailClosed
	res.Reason = "fail-closed (deny): internal gate error: no decision"
	res.Error = "no decision"
	return res
}

// Decide runs the whole chain: normalise → L0 deny → L0 allow → grey: L1
// when enabled, else fail_closed. It never returns allow on an error or
// panic.
func (g *Gate) Decide(ctx context.Context, r Request) (res Result) {
	defer func() {
		if p := recover(); p != nil {
			res = g.recovered(r, p)
		}
		res = sane(res)
	}()
	if ctx == nil {
		ctx = context.Background()
	}
	res = g.base(r)
	o := g.evalL0(r.Tool, r.Args, r.Key)
	if o.decision != "" {
		res.Decision, res.Layer, res.Reason, res.Rule = o.decision, LayerL0, o.reason, o.rule
		return res
	}
	if !g.cfg.L1.Enabled {
		res.Decision, res.Layer = g.cfg.FailClosed, LayerFailClosed
		res.Reason = fmt.Sprintf("fail-closed (%s): L1 disabled (the model is not calibrated for actuator approval); %s", g.cfg.FailClosed, o.reason)
		res.Error = "l1 disabled"
		return res
	}
	g.applyL1(ctx, &res, o)
	return res
}

// DecideL0 runs the deterministic layer only: deny, allow, or grey
// (Decision "" and Layer ""). Re-run it right before executing an approved
// ask: a rule that has become deny wins.
func (g *Gate) DecideL0(r Request) (res Result) {
	defer func() {
		if p := recover(); p != nil {
			res = g.recovered(r, p)
		}
	}()
	res = g.base(r)
	o := g.evalL0(r.Tool, r.Args, r.Key)
	res.Reason, res.Rule = o.reason, o.rule
	if o.decision != "" {
		res.Decision, res.Layer = o.decision, LayerL0
	}
	return res
}

// DryRun is what can_do reports, without side effects and without asking
// L1 to decide: the L0 verdict when there is one; for a grey call, what
// Decide would meet without a model verdict: the fail_closed decision when
// L1 is disabled or the P0 service is unavailable (known from the last
// real call, or from a GET /health probe bounded by l1ProbeTimeout), and
// "ask" when L1 is up — the call is then reported as possible only with a
// human's approval, never as a promised allow, and not as deny because L1
// or a human may still permit it. An L1 allow at execution time simply
// skips the approval.
func (g *Gate) DryRun(ctx context.Context, r Request) (res Result) {
	defer func() {
		if p := recover(); p != nil {
			res = g.recovered(r, p)
		}
		res = sane(res)
	}()
	if ctx == nil {
		ctx = context.Background()
	}
	res = g.base(r)
	o := g.evalL0(r.Tool, r.Args, r.Key)
	if o.decision != "" {
		res.Decision, res.Layer, res.Reason, res.Rule = o.decision, LayerL0, o.reason, o.rule
		return res
	}
	if !g.cfg.L1.Enabled {
		res.Decision, res.Layer = g.cfg.FailClosed, LayerFailClosed
		res.Reason = fmt.Sprintf("fail-closed (%s): L1 disabled (the model is not calibrated for actuator approval); %s", g.cfg.FailClosed, o.reason)
		res.Error = "l1 disabled"
		return res
	}
	if up, cause := g.l1Up(ctx); !up {
		res.Decision, res.Layer, res.Error = g.cfg.FailClosed, LayerFailClosed, cause
		res.Reason = fmt.Sprintf("fail-closed (%s): L1 %s", g.cfg.FailClosed, cause)
		return res
	}
	res.Decision, res.Layer = Ask, LayerL1
	res.Reason = "dry run: L1 is up but not consulted in dry runs; reported as ask (the call may need a human's approval); " + o.reason
	return res
}

// Confirmed is the result of an ask that a human approved: allow, layer
// human_confirm, confirm true. Call it only after Approvals.Verify succeeded
// AND a fresh DecideL0 of the same request is not deny; it re-runs L0 itself
// and refuses (deny) when L0 now denies.
func (g *Gate) Confirmed(r Request) Result {
	res := g.DecideL0(r)
	if res.Decision == Deny {
		res.Reason = "human confirmation rejected: " + res.Reason
		return res
	}
	res.Decision, res.Layer, res.Confirm = Allow, LayerHumanConfirm, true
	res.Reason = "ask confirmed by a human (requestState verified, L0 re-checked)"
	return res
}
