package gate

import "time"

// PolicyURI is the MCP resource that carries PolicyDoc.
const PolicyURI = "phocinae://policy/gate-approval"

// ApprovalTerms are the approval authority's lifetimes (package approval
// owns approvals; the gate's policy document describes them).
type ApprovalTerms struct {
	TTL, Skew time.Duration
}

// PolicyDoc returns the content of the phocinae://policy/gate-approval
// resource (phocinae notes B7) for this gate's configuration and the approval
// authority's terms. Serve it as application/json.
func (g *Gate) PolicyDoc(terms ApprovalTerms) map[string]any {
	ttl := terms.TTL
	deny := make([]map[string]any, 0, len(g.cfg.L0.Deny))
	for _, r := range g.cfg.L0.Deny {
		deny = append(deny, ruleDoc(r))
	}
	allow := make([]map[string]any, 0, len(g.cfg.L0.Allow))
	for _, r := range g.cfg.L0.Allow {
		allow = append(allow, ruleDoc(r))
	}
	shell := make([]map[string]any, 0, len(shellRules))
	for _, r := range shellRules {
		shell = append(shell, map[string]any{"name": r.Name, "note": r.Note})
	}
	l1 := g.cfg.L1
	return map[string]any{
		"policy":  "gate-approval",
		"uri":     PolicyURI,
		"version": 1,
		"engine":  g.engine,
		"decision_chain": []map[string]any{
			{"step": 1, "layer": "normalise", "does": "canonical command '<tool> <sorted JSON args>'; fingerprint sha256(tool \\x00 canonical-args); empty tool, non-scalar or non-finite arguments → deny at L0"},
			{"step": 2, "layer": "L0", "source": "actuator table deny rules (first match wins), then the built-in shell blacklist on the tool name, argument names and string values", "on_match": "deny", "offline": true,
				"deny_rules": deny, "shell_blacklist": shell},
			{"step": 3, "layer": "L0", "source": "actuator table allow rules (exact tool or glob, equal args, numeric range)", "on_match": "allow", "offline": true,
				"allow_rules": allow, "never_allowed": "a call whose tool name or any string argument contains a shell operator (; & | ` $( > < newline) — it stays grey, and an L1 allow for it is capped at ask"},
			{"step": 4, "layer": "L1", "enabled": l1.Enabled, "endpoint": endpointOf(l1.Server), "model": l1.Model,
				"questions": []string{IDNoul, IDScore}, "combine": "strictest(deny>ask>allow)", "timeout_ms": l1.TimeoutMS, "attempts": 1},
			{"step": 5, "layer": "fail_closed", "decision": g.cfg.FailClosed,
				"applies_when":     "L1 disabled, or unreachable (dial error, timeout, non-2xx status)",
				"malformed_answer": "deny (missing/extra shapes, non-JSON, out-of-range noul or score, body cut short, panic)"},
		},
		"thresholds": map[string]any{
			"noul_threshold": l1.NoulThreshold, "noul_false_at_or_below": 1 - l1.NoulThreshold,
			"ask_at": l1.AskAt, "deny_at": l1.DenyAt, "score_range": []int{2, 10},
			"boundaries": map[string]any{
				"noul==noul_threshold": "true (allow channel)",
				"score==ask_at":        "ask",
				"score==deny_at":       "deny",
			},
			"mapping": map[string]any{
				"noul":  "p >= noul_threshold → true/allow; p <= 1-noul_threshold → false/deny; otherwise wavering/ask (a bool answer is 1.0 or 0.0)",
				"score": "score >= deny_at → deny; score >= ask_at → ask; otherwise allow",
			},
		},
		"invariants": []string{
			"only allow executes",
			"deny is final: no confirmation, token, role or retry overrides it",
			"a human confirmation can only turn ask into allow (layer human_confirm)",
			"no gate error, timeout, malformed L1 answer or panic ever yields allow",
			"fail_closed is deny or ask, never allow",
			"dry runs (can_do) never call L1 and never consume approvals",
		},
		"ask_obligations": map[string]any{
			"mechanism": "MRTR: the tools/call result has resultType input_required with inputRequests holding an elicitation/create form request",
			"elicitation": map[string]any{
				"method":          "elicitation/create",
				"confirm_field":   "confirm",
				"requestedSchema": map[string]any{"type": "object", "properties": map[string]any{"confirm": map[string]any{"type": "boolean"}}, "required": []string{"confirm"}},
				"accept":          "action accept with content.confirm == true → allow (human_confirm)",
				"decline_cancel":  "decline, cancel, or confirm false → deny",
			},
			"request_state": map[string]any{
				"format":       "base64url(payload).base64url(HMAC-SHA256(key, \"physd-round/v2.\" + base64url(payload)))",
				"mac":          "HMAC-SHA256, compared in constant time",
				"single_use":   true,
				"expires_in_s": int(ttl.Seconds()),
				"clock_skew_s": int(terms.Skew.Seconds()),
				"echo":         "the client must echo requestState verbatim with the same tool and arguments",
			},
			"binding":                    "sha256(tool \\x00 canonical-args) + tool + the caller's credentials + the digest of the capability's definition (manifest entry, binding, policy rules); changed arguments are a different call, a changed definition voids the state",
			"reverify_l0_before_execute": true,
			"l1_not_rerun_after_confirm": true,
			"on_state_failure":           "tampered, expired, mismatched or replayed state → deny; start a new call to get a new ask",
			"audit":                      "every decision is recorded: ts, command, fingerprint, decision, layer, reason, confirm",
		},
		"two_person_rule": map[string]any{
			"when":       "a policy approval rule names approver_role (self_approval false by default): the caller's own client is never asked",
			"answer":     "status failed, permission requires_human_approval, code approval_pending, details approval_id=…; approver_role=…; expires_at=…",
			"approve":    "GET /approvals lists pending calls; POST /approvals/<id> {\"decision\": \"approve\" | \"deny\"} by an identity with approver_role other than the caller",
			"grant":      "\"grant.\" + base64url(payload) + \".\" + base64url(HMAC-SHA256(key, \"physd-grant/v1.\" + base64url(payload))); binds approver, approver role, tool, argument fingerprint, idempotency key, caller, expiry; single use",
			"execute":    "the caller repeats the exact call (same arguments and idempotency_key), or sends the grant as requestState; the guard re-checks the approver and L0",
			"on_failure": "altered, expired, used or mismatched grant, or the caller as approver → nothing runs",
		},
		"clients_without_elicitation": "The call is not executed: the result reports requires_human_approval with the reason. " +
			"An agent must not retry around it or treat ask as allow. A person responsible for the equipment has to approve it " +
			"out of band — through a client that supports elicitation, or through an operator-authorised channel such as an operator token — " +
			"and the call is then made again.",
	}
}

func ruleDoc(r Rule) map[string]any {
	m := map[string]any{"name": r.Name, "tool": r.Tool}
	if len(r.Args) > 0 {
		m["args"] = r.Args
	}
	if r.Range != nil {
		rg := map[string]any{"arg": r.Range.Arg, "outside": r.Range.Outside}
		if r.Range.Min != nil {
			rg["min"] = *r.Range.Min
		}
		if r.Range.Max != nil {
			rg["max"] = *r.Range.Max
		}
		m["range"] = rg
	}
	if r.Note != "" {
		m["note"] = r.Note
	}
	return m
}
