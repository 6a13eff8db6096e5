package node

import (
	"context"
	"crypto/rand"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
)

// ObservationBudget bounds how long can_do waits for the current state of
// matching capabilities; slower devices are reported without a state.
const ObservationBudget = 150 * time.Millisecond

// CanDo answers a can_do query as coordinator: this node's capabilities,
// and, with a mesh, the matching capabilities of the other nodes (asked in
// parallel within the mesh's budget). The only error is a malformed request.
func (n *Node) CanDo(ctx context.Context, req promcp.CanDoRequest, caller Caller) (promcp.CapabilityReport, error) {
	return n.canDo(ctx, req, caller, n.remote != nil)
}

func (n *Node) canDo(ctx context.Context, req promcp.CanDoRequest, caller Caller, coordinate bool) (promcp.CapabilityReport, error) {
	start := time.Now()
	in, err := normaliseIntent(req)
	if err != nil {
		return promcp.CapabilityReport{}, err
	}
	rep := promcp.CapabilityReport{
		QueryID:    newUUID(),
		Candidates: []promcp.Candidate{},
		Blocked:    []promcp.Blocked{},
		Unroutable: []promcp.Unroutable{},
		Context: promcp.ReportContext{
			Location: in.Location, ImpliedTarget: in.Target,
			RelatedReads: []string{}, CurrentObservations: map[string]promcp.State{},
		},
	}
	// The other nodes are asked at once, in parallel with the local
	// evaluation (which may itself wait for a quorum round): the answer
	// stays within the mesh's budget.
	var remote chan RemoteReport
	if coordinate {
		remote = make(chan RemoteReport, 1)
		go func() { remote <- n.remote.CanDo(ctx, req, caller) }()
	}
	scope := map[string]bool{}
	for _, s := range req.Scope {
		scope[s] = true
	}
	// A capability that is not exposed is no tool: never a candidate,
	// nor a producer found, nor counted as scanned.
	inScope := func(cs *capState) bool {
		return cs.cap.Exposed() && (len(scope) == 0 || scope[cs.tool] || scope[cs.cap.Name] || scope[n.DeviceID()])
	}

	var matched, excluded []match
	scanned := 0
	for _, cs := range n.bound().caps {
		if !inScope(cs) {
			continue
		}
		scanned++
		m := n.matchOne(cs, in, in.SemanticTags)
		switch {
		case m.reasons == nil:
		case m.excluded != "":
			excluded = append(excluded, m)
		default:
			matched = append(matched, m)
		}
	}

	// Current state of every match and of the reads related to do_ matches.
	related := n.relatedReads(matched)
	obs := n.observeAll(ctx, append(capsOf(matched), related...))

	for _, m := range matched {
		n.judge(ctx, &rep, m, in, caller, obs[m.cs], start)
	}
	for _, cs := range related {
		rep.Context.RelatedReads = append(rep.Context.RelatedReads, cs.tool)
	}
	for cs, o := range obs {
		rep.Context.CurrentObservations[cs.cap.Name] = promcp.State{Value: o.Value, Unit: o.Unit, Timestamp: o.Timestamp, Quality: o.Quality, Source: o.Source}
	}
	sort.SliceStable(rep.Candidates, func(i, j int) bool { return rep.Candidates[i].Confidence > rep.Candidates[j].Confidence })
	sort.SliceStable(rep.Blocked, func(i, j int) bool { return rep.Blocked[i].Confidence > rep.Blocked[j].Confidence })

	if len(matched) == 0 {
		rep.Unroutable = append(rep.Unroutable, unroutable(in, excluded, n.tagVocabulary()))
	}
	rep.Metadata = promcp.ReportMetadata{CoordinatorNode: n.DeviceID(), MeshSizeEstimate: 1, PartitionState: "healthy", CapabilitiesScanned: scanned}
	if coordinate {
		merge(&rep, <-remote)
	}
	rep.DeriveFeasible()
	if !rep.Feasible && len(rep.Blocked) == 0 && len(rep.Unroutable) == 0 {
		// Only read candidates answered an actuation intent, or similar:
		// say why nothing is allowed.
		rep.Unroutable = append(rep.Unroutable, promcp.Unroutable{Outcome: outcome(in), Reason: promcp.UnroutableRequirementsUnmet,
			Detail: "capabilities matched but none is allowed now"})
	}
	rep.Metadata.Timestamp = time.Now().UTC()
	rep.Metadata.TotalLatencyMS = float64(time.Since(start).Microseconds()) / 1000
	return rep, nil
}

// judge turns one match into a candidate or a blocked entry.
func (n *Node) judge(ctx context.Context, rep *promcp.CapabilityReport, m match, in *promcp.Intent, caller Caller, o *promcp.Observation, now time.Time) {
	c := m.cs.cap
	cand := promcp.Candidate{
		Capability: m.cs.tool, Source: n.DeviceID(), DeviceID: n.DeviceID(), Confidence: m.confidence,
		Permission: promcp.PermAllowed, MatchReasons: m.reasons, Kind: c.Kind, Zone: c.Zone,
		SideEffects: c.SideEffects, EstimatedLatencyMS: estimateMS(m.cs),
		Constraints: constraints(c),
		FailSafe:    n.failSafeNote(m.cs),
	}
	if o != nil {
		cand.CurrentState = &promcp.State{Value: o.Value, Unit: o.Unit, Timestamp: o.Timestamp, Quality: o.Quality}
	}
	block := func(p promcp.Permission, code, reason, details string) {
		var d *string
		if details != "" {
			d = &details
		}
		rep.Blocked = append(rep.Blocked, promcp.Blocked{Capability: m.cs.tool, Source: n.DeviceID(), DeviceID: n.DeviceID(),
			Permission: p, Reason: reason, Code: code, Details: d, Confidence: m.confidence, MatchReasons: m.reasons})
	}
	if m.cs.point == nil || (o != nil && o.Quality == promcp.QualityError) {
		why := "device unavailable"
		if m.cs.bindErr != nil {
			why = m.cs.bindErr.Error()
		} else if o != nil && o.Reason != "" {
			why = o.Reason
		}
		block(promcp.PermSourceUnreachable, "device_offline", "the device behind "+m.cs.tool+" cannot be reached: "+why, "code=device_offline")
		return
	}
	validFor := validity(c)
	if c.Kind == manifest.KindDo {
		value, verr := intentValue(c, in, o)
		if verr != "" {
			block(promcp.PermOutOfRange, "out_of_range", verr, rangeDetails(c, in.Value))
			return
		}
		if value != nil {
			cand.MatchReasons = append(cand.MatchReasons, "value_in_range: "+promcp.FormatValue(value)+" in "+rangeText(c))
		} else if o != nil && o.Value != nil {
			// Without intent.value the rules are checked at the current
			// setpoint: value-dependent rules (range guards, approval
			// thresholds, gate ranges) may still refuse another value.
			value = o.Value
			cand.MatchReasons = append(cand.MatchReasons, "value_not_given: rules checked at the current value "+promcp.FormatValue(value)+"; send intent.value for a precise answer")
		}
		if err := n.auditErr.Load(); err != nil {
			// What a do_ would meet now (precheck).
			block(promcp.PermPolicyDenied, "audit_unavailable", "the audit trail cannot be written, so physd refuses actuations: "+(*err).Error(), "code=audit_unavailable")
			return
		}
		v := n.guard.Evaluate(ctx, Action{Capability: c, Tool: m.cs.tool, Value: value, Caller: caller, Now: now}, true)
		cand.RateLimit = v.Rate
		switch v.Permission {
		case promcp.PermAllowed:
		case promcp.PermRequiresHumanApproval:
			cand.Permission, cand.Reason = v.Permission, v.Reason
		default:
			block(v.Permission, string(v.Permission), v.Reason, v.Details)
			return
		}
		if v.ValidFor > 0 && v.ValidFor < validFor {
			validFor = v.ValidFor
		}
		if v.MaxChange > 0 {
			// What the do_'s max_change guard will say, from the current
			// state read here (the do_ reads the device again).
			if o != nil && o.Value != nil && in.Value != nil {
				if r := checkStep(m.cs, o.Value, v.Value, v.MaxChange); r != nil {
					block(r.perm, r.code, r.reason, r.details)
					return
				}
			}
			cand.MatchReasons = append(cand.MatchReasons, fmt.Sprintf("max_change: at most %g %s from the current value per actuation", v.MaxChange, c.Unit))
		}
		if in.Value != nil {
			// The interlocks a do_ of this value meets under its turn,
			// judged on the same readings now.
			if r := n.checkInterlocks(ctx, m.cs, v.Value); r != nil {
				block(r.perm, r.code, r.reason, r.details)
				return
			}
		}
	}
	cand.ValidUntil = time.Now().Add(validFor).UTC()
	rep.Candidates = append(rep.Candidates, cand)
}

// validity is the proMCP §11.3 band for a capability: sensor state 1–5 s,
// rate-limited or cooling-down actuators 5–30 s, quorum-guarded or
// safety-critical actuators ≤1 s, any other actuator the "unknown" 5 s.
func validity(c *manifest.Capability) time.Duration {
	if c.Kind == manifest.KindRead {
		return min(max(c.CacheTTL(), time.Second), 5*time.Second)
	}
	if c.RequiresQuorum || hasTag(c, "safety_critical") || hasTag(c, "emergency") {
		return time.Second
	}
	if c.RateLimit != nil || c.CooldownMS > 0 {
		return 10 * time.Second
	}
	return 5 * time.Second
}

func hasTag(c *manifest.Capability, t string) bool {
	for _, x := range c.SemanticTags {
		if x == t {
			return true
		}
	}
	return false
}

// intentValue checks intent.value against a do_ capability; for increase
// and decrease with no value it checks there is room to move. It returns the
// decoded value (nil when none was given) or a refusal text.
func intentValue(c *manifest.Capability, in *promcp.Intent, o *promcp.Observation) (any, string) {
	if in.Value == nil {
		if o != nil && c.Range != nil {
			if cur, ok := asFloat(o.Value); ok {
				if in.Action == "increase" && cur >= c.Range.Max {
					return nil, fmt.Sprintf("%s is already at its maximum %s %s", c.ToolName(), promcp.FormatValue(c.Range.Max), c.Unit)
				}
				if in.Action == "decrease" && cur <= c.Range.Min {
					return nil, fmt.Sprintf("%s is already at its minimum %s %s", c.ToolName(), promcp.FormatValue(c.Range.Min), c.Unit)
				}
			}
		}
		return nil, ""
	}
	raw, err := jsonRaw(in.Value)
	if err != nil {
		return nil, "intent.value cannot be encoded"
	}
	v, derr := DecodeValue(c, raw)
	if derr != nil {
		return nil, derr.Error()
	}
	if !inRange(c, v) {
		return nil, fmt.Sprintf("%s accepts %s %s; %s is outside it", c.ToolName(), rangeText(c), c.Unit, promcp.FormatValue(v))
	}
	return v, ""
}

func constraints(c *manifest.Capability) *promcp.Constraints {
	k := &promcp.Constraints{Unit: c.Unit, DataType: c.DataType, EnumValues: c.EnumValues}
	if c.Range != nil {
		lo, hi := c.Range.Min, c.Range.Max
		k.Min, k.Max = &lo, &hi
	}
	return k
}

func estimateMS(cs *capState) int {
	us := cs.latencyUS.Load()
	return int((us + 999) / 1000)
}

// relatedReads are the read_ capabilities in the zone of a matched do_ that
// share one of its tags (heater_zone_a → temperature_zone_a): what an
// orchestrator should read before and after acting.
func (n *Node) relatedReads(matched []match) []*capState {
	seen := map[*capState]bool{}
	var out []*capState
	for _, m := range matched {
		if m.cs.cap.Kind != manifest.KindDo {
			continue
		}
		vocab := m.cs.vocab
		for _, cs := range n.bound().caps {
			if cs.cap.Kind != manifest.KindRead || cs.cap.Zone != m.cs.cap.Zone || seen[cs] || !cs.cap.Exposed() {
				continue
			}
			for _, t := range cs.cap.SemanticTags {
				if t != cs.cap.Zone && vocab[stem(t)] {
					seen[cs] = true
					out = append(out, cs)
					break
				}
			}
		}
	}
	return out
}

func capsOf(ms []match) []*capState {
	out := make([]*capState, len(ms))
	for i, m := range ms {
		out[i] = m.cs
	}
	return out
}

// observeAll reads the given capabilities in parallel through the cache,
// within ObservationBudget; those that do not answer in time are left out.
func (n *Node) observeAll(ctx context.Context, caps []*capState) map[*capState]*promcp.Observation {
	out := map[*capState]*promcp.Observation{}
	if len(caps) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, ObservationBudget)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	done := make(chan struct{})
	seen := map[*capState]bool{}
	for _, cs := range caps {
		if seen[cs] {
			continue
		}
		seen[cs] = true
		// A fresh cached value needs no goroutine.
		if s := cs.last.Load(); s != nil && cs.cap.CacheTTL() > 0 && time.Since(s.at) <= cs.cap.CacheTTL() {
			o := n.observation(cs, s, true, nil)
			mu.Lock()
			out[cs] = &o
			mu.Unlock()
			continue
		}
		// A device known to answer within a millisecond (a simulator, a
		// local register) is read inline: a goroutine and a timer would
		// cost more than the read.
		if us := cs.latencyUS.Load(); us > 0 && us < 1000 {
			o := n.observe(ctx, cs, -1)
			mu.Lock()
			out[cs] = &o
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := n.observe(ctx, cs, -1)
			mu.Lock()
			out[cs] = &o
			mu.Unlock()
		}()
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	res := make(map[*capState]*promcp.Observation, len(out))
	for k, v := range out {
		res[k] = v
	}
	return res
}

func (n *Node) tagVocabulary() []string {
	set := map[string]bool{}
	for _, cs := range n.bound().caps {
		if !cs.cap.Exposed() {
			continue // its tags would name nothing can_do offers
		}
		for _, t := range cs.cap.SemanticTags {
			set[t] = true
		}
	}
	out := make([]string, 0, len(set))
	for t := range set {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

func outcome(in *promcp.Intent) string {
	parts := []string{}
	if in.Action != "" {
		parts = append(parts, in.Action)
	}
	if in.Target != "" {
		parts = append(parts, in.Target)
	}
	parts = append(parts, "["+strings.Join(in.SemanticTags, ",")+"]")
	if in.Location != "" {
		parts = append(parts, "in "+in.Location)
	}
	return strings.Join(parts, " ")
}

func unroutable(in *promcp.Intent, excluded []match, vocab []string) promcp.Unroutable {
	if len(excluded) == 0 {
		return promcp.Unroutable{Outcome: outcome(in), Reason: promcp.UnroutableNoProducer,
			Detail: "no capability matches these semantic tags; tags this node knows: " + strings.Join(vocab, ", ")}
	}
	u := promcp.Unroutable{Outcome: outcome(in), Reason: promcp.UnroutableRequirementsUnmet,
		Detail: "capabilities match the tags but not the rest of the intent"}
	missing := map[string]bool{}
	for _, m := range excluded {
		u.ProducersFound = append(u.ProducersFound, m.cs.tool)
		missing[m.excluded] = true
	}
	for k := range missing {
		u.MissingRequirements = append(u.MissingRequirements, k)
	}
	sort.Strings(u.MissingRequirements)
	return u
}

// normaliseIntent accepts proMCP intent or PhysMCP query (direction →
// action) and checks it.
func normaliseIntent(req promcp.CanDoRequest) (*promcp.Intent, error) {
	in := req.Intent
	field := "intent"
	if in == nil {
		in, field = req.Query, "query"
	}
	if in == nil {
		return nil, &InputError{Field: "intent", Msg: `required: send {"intent": {"semantic_tags": ["heating"], "action": "increase", "location": "zone_a"}}`}
	}
	cp := *in
	if cp.Action == "" && cp.Direction != "" {
		cp.Action = cp.Direction
	}
	var tags []string
	for _, t := range cp.SemanticTags {
		if t = strings.TrimSpace(t); t != "" {
			tags = append(tags, strings.ToLower(t))
		}
	}
	if len(tags) == 0 {
		return nil, &InputError{Field: field + ".semantic_tags", Msg: `at least one non-empty tag is required, e.g. ["temperature"]`}
	}
	cp.SemanticTags = tags
	if cp.Action != "" {
		ok := false
		for _, a := range promcp.Actions {
			ok = ok || a == cp.Action
		}
		if !ok {
			return nil, &InputError{Field: field + ".action", Msg: fmt.Sprintf("%q is not one of %v", truncate(cp.Action), promcp.Actions)}
		}
	}
	return &cp, nil
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
