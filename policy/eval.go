package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/physd/physd/promcp"
)

// Check is one actuation to judge.
type Check struct {
	Tool     string
	Value    any // float64, int64, bool or string (already type-checked)
	Role     string
	Now      time.Time
	Override bool // an emergency override is active: time windows are lifted
}

// Outcome is the policy's verdict on a Check.
type Outcome struct {
	Permission promcp.Permission // allowed, requires_human_approval or a refusal
	Value      any               // possibly clamped
	Reason     string
	Details    string
	Notes      []string      // warnings and changes on an allowed call
	Rule       string        // which rule decided (role, time_window, …)
	ValidFor   time.Duration // how long a dry-run answer holds
}

// QuorumFunc asks the mesh how many peers (self included) are alive and
// answer within a short deadline; a standalone node answers 1.
type QuorumFunc func(ctx context.Context, need int) (alive int)

// Standalone is the QuorumFunc of a node without a mesh.
func Standalone(context.Context, int) int { return 1 }

// StateStore persists rate and cooldown history (the bbolt store).
type StateStore interface {
	Get(bucket, key string) ([]byte, error)
	Put(bucket, key string, value []byte) error
}

// StateBucket is the store bucket of the rate and cooldown history.
const StateBucket = "policy_state"

// Limiter keeps each tool's actuation history for rate and cooldown rules,
// in memory and written through to the store, so limits survive restarts.
type Limiter struct {
	mu    sync.Mutex
	store StateStore
	hist  map[string]*history
}

type history struct {
	Times []int64 `json:"times"` // unix nanos of recent actuations, oldest first
}

// NewLimiter loads nothing up front; each tool's history is read on first use.
func NewLimiter(s StateStore) *Limiter { return &Limiter{store: s, hist: map[string]*history{}} }

func (l *Limiter) get(tool string) *history {
	h := l.hist[tool]
	if h != nil {
		return h
	}
	h = &history{}
	if l.store != nil {
		if b, err := l.store.Get(StateBucket, tool); err == nil && b != nil {
			_ = json.Unmarshal(b, h)
		}
	}
	l.hist[tool] = h
	return h
}

// Record notes an actuation of tool at t, keeping as much history as the
// longest window needs, and writes it to the store.
func (l *Limiter) Record(tp *ToolPolicy, t time.Time) error {
	key, b := l.Note(tp, t)
	if l.store == nil || b == nil {
		return nil
	}
	return l.store.Put(StateBucket, key, b)
}

// Note records an actuation in memory and returns the bytes to persist
// under StateBucket/key (nil when the tool has no rate or cooldown rule, so
// nothing needs remembering). The caller persists them with the actuation.
func (l *Limiter) Note(tp *ToolPolicy, t time.Time) (key string, value []byte) {
	if len(tp.Rates) == 0 && tp.Cooldown == 0 {
		return tp.Tool, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.get(tp.Tool)
	keep := tp.Cooldown
	maxCount := 1
	for _, r := range tp.Rates {
		keep = max(keep, r.Per)
		maxCount = max(maxCount, r.Count)
	}
	h.Times = append(h.Times, t.UnixNano())
	cut := t.Add(-keep).UnixNano()
	i := 0
	for i < len(h.Times)-1 && (h.Times[i] < cut || len(h.Times)-i > maxCount+1) {
		i++
	}
	h.Times = append([]int64(nil), h.Times[i:]...)
	b, _ := json.Marshal(h)
	return tp.Tool, b
}

func (l *Limiter) times(tool string) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int64(nil), l.get(tool).Times...)
}

// Evaluate judges c in the documented order without recording anything:
// the caller records an actuation (Limiter.Record) only once it proceeds.
// It is therefore also the can_do dry run.
func (p *Policy) Evaluate(ctx context.Context, c Check, lim *Limiter, quorum QuorumFunc) Outcome {
	tp := p.Tools[c.Tool]
	out := Outcome{Permission: promcp.PermAllowed, Value: c.Value}
	if tp == nil {
		return Outcome{Permission: promcp.PermPolicyDenied, Rule: "unknown_tool", Reason: c.Tool + " has no policy"}
	}
	deny := func(perm promcp.Permission, rule, reason, details string) Outcome {
		return Outcome{Permission: perm, Value: c.Value, Rule: rule, Reason: reason, Details: details}
	}
	// 1. role
	role := c.Role
	if role == "" {
		role = "none"
	}
	if RoleLevel(role) < RoleLevel(tp.MinRole) {
		return deny(promcp.PermPermissionInsufficient, "role",
			fmt.Sprintf("%s needs the %s role or higher; the caller has %s. Ask an operator, or call with a token that carries the role", c.Tool, tp.MinRole, role),
			"required_role="+tp.MinRole+"; caller_role="+role)
	}
	// 2. time windows (an emergency override lifts them, and only them)
	if c.Override && (len(tp.DenyDuring) > 0 || len(tp.AllowDuring) > 0) {
		out.Notes = append(out.Notes, "time windows lifted by an emergency override")
	} else {
		for _, w := range tp.DenyDuring {
			if w.Contains(c.Now) {
				end := w.End(c.Now)
				return deny(promcp.PermPolicyDenied, "time_window",
					fmt.Sprintf("%s is not allowed during %s; it is allowed again at %s", c.Tool, w, end.Format(time.RFC3339)),
					"window="+w.Name+"; window_resets_at="+end.UTC().Format(time.RFC3339)+"; retry_after_ms="+ms(end.Sub(c.Now)))
			}
		}
		if len(tp.AllowDuring) > 0 {
			inside := false
			var next time.Time
			var names []string
			for _, w := range tp.AllowDuring {
				names = append(names, w.String())
				if w.Contains(c.Now) {
					inside = true
					break
				}
				if s := w.NextStart(c.Now); !s.IsZero() && (next.IsZero() || s.Before(next)) {
					next = s
				}
			}
			if !inside {
				return deny(promcp.PermPolicyDenied, "time_window",
					fmt.Sprintf("%s is allowed only during %s; the next window opens at %s", c.Tool, strings.Join(names, " or "), next.Format(time.RFC3339)),
					"window_resets_at="+next.UTC().Format(time.RFC3339)+"; retry_after_ms="+ms(next.Sub(c.Now)))
			}
		}
	}
	// 3. range guard
	if g := tp.Range; g != nil {
		if v, ok := num(c.Value); ok && (v < g.Min || v > g.Max) {
			bounds := fmt.Sprintf("min=%g; max=%g; requested=%s", g.Min, g.Max, promcp.FormatValue(c.Value))
			switch g.OnViolation {
			case "deny":
				return deny(promcp.PermOutOfRange, "range_guard",
					fmt.Sprintf("%s is outside the allowed range [%g, %g] %s; nothing was actuated", promcp.FormatValue(c.Value), g.Min, g.Max, tp.Cap.Unit), bounds)
			case "clamp":
				cv := math.Min(math.Max(v, g.Min), g.Max)
				if _, isInt := c.Value.(int64); isInt {
					// Clamp inward to a whole number inside the guard.
					cv = math.Min(math.Max(math.Ceil(g.Min), math.Round(cv)), math.Floor(g.Max))
					out.Value = int64(cv)
				} else {
					out.Value = cv
				}
				out.Notes = append(out.Notes, fmt.Sprintf("clamped %s to %s (range_guard [%g, %g])", promcp.FormatValue(c.Value), promcp.FormatValue(out.Value), g.Min, g.Max))
				out.Details = "clamped_to=" + promcp.FormatValue(out.Value) + "; " + bounds
			case "warn":
				out.Notes = append(out.Notes, fmt.Sprintf("warning: %s is outside the advised range [%g, %g]", promcp.FormatValue(c.Value), g.Min, g.Max))
				out.Details = "warn=outside_range; " + bounds
			}
		}
	}
	// 4. rate, 5. cooldown
	times := lim.times(c.Tool)
	validFor := time.Duration(0)
	for _, r := range tp.Rates {
		since := c.Now.Add(-r.Per).UnixNano()
		var in []int64
		for _, t := range times {
			if t > since {
				in = append(in, t)
			}
		}
		if len(in) >= r.Count {
			// The oldest actuation in the window leaves it first.
			retry := time.Unix(0, in[len(in)-r.Count]).Add(r.Per).Sub(c.Now)
			return deny(promcp.PermRateLimited, "rate",
				fmt.Sprintf("%s is limited to %s (%s); retry in %s", c.Tool, r.Text, r.Source, retry.Round(time.Millisecond)),
				"limit="+r.Text+"; source="+r.Source+"; retry_after_ms="+ms(retry))
		}
		validFor = 10 * time.Second
	}
	if tp.Cooldown > 0 && len(times) > 0 {
		last := time.Unix(0, times[len(times)-1])
		if wait := last.Add(tp.Cooldown).Sub(c.Now); wait > 0 {
			return deny(promcp.PermCooldownActive, "cooldown",
				fmt.Sprintf("%s was actuated %s ago; its cooldown is %s; retry in %s", c.Tool, c.Now.Sub(last).Round(time.Millisecond), tp.Cooldown, wait.Round(time.Millisecond)),
				"cooldown_ms="+ms(tp.Cooldown)+"; retry_after_ms="+ms(wait))
		}
		validFor = 10 * time.Second
	}
	// 6. quorum: fresh answers from peers, decided within the mesh's deadline.
	if tp.Quorum > 1 {
		if quorum == nil {
			quorum = Standalone
		}
		if alive := quorum(ctx, tp.Quorum); alive < tp.Quorum {
			return deny(promcp.PermPartitionNoQuorum, "quorum",
				fmt.Sprintf("%s needs %d live peers (self included); %d answered", c.Tool, tp.Quorum, alive),
				fmt.Sprintf("alive=%d; required=%d", alive, tp.Quorum))
		}
		validFor = time.Second
	}
	// 7. approval
	if a := tp.Approval; a != nil {
		need, why := false, ""
		switch a.When {
		case "always":
			need, why = true, "this actuation always needs a human's approval"
		case "outside_window":
			if !a.Window.Contains(c.Now) {
				need, why = true, "outside "+a.Window.String()+" a human must approve this actuation"
			}
		case "above":
			if v, ok := num(out.Value); ok && v > a.Above {
				need, why = true, fmt.Sprintf("values above %g %s need a human's approval", a.Above, tp.Cap.Unit)
			}
		}
		if need {
			out.Permission, out.Rule, out.Reason = promcp.PermRequiresHumanApproval, "approval", why
		}
	}
	out.ValidFor = validFor
	return out
}

func num(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int64:
		return float64(x), true
	}
	return 0, false
}

func ms(d time.Duration) string { return fmt.Sprint(max(d.Milliseconds(), 0)) }
