// Package promcp holds the proMCP v0.4 response contracts (with the PhysMCP
// v0.1 fields physd keeps beside them), their enums, and the JSON Schemas that
// become each MCP tool's outputSchema. It has no behaviour beyond small
// helpers, so every other package can share one vocabulary.
package promcp

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// Versions physd implements.
const (
	PromcpBase     = "0.4.0"
	PhysMCPVersion = "0.1"
)

// Quality of an observation (proMCP §6.1).
type Quality string

const (
	QualityGood     Quality = "good"     // safe to act on
	QualityStale    Quality = "stale"    // beyond cache TTL and no fresher data
	QualityDegraded Quality = "degraded" // source works but outside normal parameters
	QualityError    Quality = "error"    // no usable value: must not act
)

// Qualities lists every quality value, in schema order.
var Qualities = []Quality{QualityGood, QualityStale, QualityDegraded, QualityError}

// Status of an actuation (proMCP §6.2).
type Status string

const (
	StatusSuccess Status = "success"
	StatusPartial Status = "partial"
	StatusFailed  Status = "failed" // certainly nothing was applied
)

// Outcome codes of a partial actuation: the write may have landed, so an
// agent must read the device before it retries (and then with the same
// idempotency_key). A failed answer carries the refusal's or the device's
// own code instead (device_offline, illegal_data_address, …).
const (
	CodeOutcomeUnknown = "outcome_unknown" // the write was sent; whether it landed is not known
	CodeUnverified     = "unverified"      // the device acknowledged the write; the read-back was lost
	CodeMismatch       = "mismatch"        // the read-back shows another value than the one requested
)

// Statuses lists every status value, in schema order.
var Statuses = []Status{StatusSuccess, StatusPartial, StatusFailed}

// Permission is the proMCP §12.1 permission enum.
type Permission string

const (
	PermAllowed                Permission = "allowed"
	PermRequiresHumanApproval  Permission = "requires_human_approval"
	PermPolicyDenied           Permission = "policy_denied"
	PermRateLimited            Permission = "rate_limited"
	PermCooldownActive         Permission = "cooldown_active"
	PermOutOfRange             Permission = "out_of_range"
	PermPermissionInsufficient Permission = "permission_insufficient"
	PermSourceUnreachable      Permission = "source_unreachable"
	PermPartitionNoQuorum      Permission = "partition_no_quorum"
)

// Permissions lists the nine permission values, in schema order.
var Permissions = []Permission{
	PermAllowed, PermRequiresHumanApproval, PermPolicyDenied, PermRateLimited,
	PermCooldownActive, PermOutOfRange, PermPermissionInsufficient,
	PermSourceUnreachable, PermPartitionNoQuorum,
}

// Unroutable reasons (proMCP §6.3, v0.4).
const (
	UnroutableNoProducer        = "no_producer"
	UnroutableRequirementsUnmet = "requirements_unmet"
	UnroutableMalformedRequest  = "malformed_request"
)

// Observation is the read_* response.
type Observation struct {
	Value     any       `json:"value"`
	Unit      string    `json:"unit"`
	Timestamp time.Time `json:"timestamp"` // when the value was observed
	Quality   Quality   `json:"quality"`
	// physd extensions
	Capability string `json:"capability"` // the read_ tool name
	Source     string `json:"source"`     // device id of the owner
	// Site is the owner's fleet site, in an answer of the fleet endpoint.
	Site   string `json:"site,omitempty"`
	AgeMS  int64  `json:"age_ms"` // how old the value was when served
	Cached bool   `json:"cached"` // served from the cache, no device access
	Reason string `json:"reason,omitempty"`
}

// DoResult is the do_* response.
type DoResult struct {
	Status           Status    `json:"status"`
	IdempotencyKey   string    `json:"idempotency_key"`
	Compensable      bool      `json:"compensable"`
	CompensationHint *string   `json:"compensation_hint"`
	Timestamp        time.Time `json:"timestamp"`
	AppliedValue     any       `json:"applied_value"`
	PreviousValue    any       `json:"previous_value"`
	SideEffects      []string  `json:"side_effects"`
	// physd extensions
	Capability string `json:"capability"`
	Source     string `json:"source"`
	// Site is the owner's fleet site, in an answer the fleet endpoint
	// writes itself (a gateway's own answer is passed on as it is).
	Site           string `json:"site,omitempty"`
	RequestedValue any    `json:"requested_value"`
	Verified       bool   `json:"verified"` // read-back matched the write
	// VerificationMS is how long the verification took after the write
	// was acknowledged: settle_ms and the read-back (physd).
	VerificationMS int64      `json:"verification_ms,omitempty"`
	Permission     Permission `json:"permission"`
	// Code is machine-readable: for partial one of CodeOutcomeUnknown,
	// CodeUnverified, CodeMismatch; for failed the refusal's or the
	// device's code; empty on a verified success.
	Code    string     `json:"code,omitempty"`
	Reason  string     `json:"reason,omitempty"`
	Details string     `json:"details,omitempty"` // machine-parseable "k=v; k=v"
	Policy  PolicyNote `json:"policy"`
	Gate    *GateNote  `json:"gate,omitempty"`
	Audit   *AuditNote `json:"audit,omitempty"`
	// LeaseExpiresAt is when the value's lease runs out and the output
	// goes to its safe value unless a later do_ renews it (physd,
	// capabilities with lease).
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
}

// PolicyNote says which policy decided the call.
type PolicyNote struct {
	Configured bool   `json:"configured"`
	Decision   string `json:"decision"` // allowed, denied, clamped, warned, not_evaluated
	Note       string `json:"note,omitempty"`
}

// GateNote is the phocinae gate decision, filled by the safety layer.
type GateNote struct {
	Decision    string `json:"decision"` // allow | ask | deny
	Layer       string `json:"layer"`
	Reason      string `json:"reason"`
	Engine      string `json:"engine,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
}

// AuditNote tells the caller where the record went.
type AuditNote struct {
	Seq uint64 `json:"seq"`
}

// Intent is the proMCP can_do intent; PhysMCP's query maps onto it
// (direction → action).
type Intent struct {
	SemanticTags []string `json:"semantic_tags"`
	Action       string   `json:"action,omitempty"`
	Direction    string   `json:"direction,omitempty"`
	Target       string   `json:"target,omitempty"`
	Value        any      `json:"value,omitempty"`
	Location     string   `json:"location,omitempty"`
}

// Actions accepted in intent.action.
var Actions = []string{"read", "create", "update", "delete", "toggle", "increase", "decrease", "set"}

// CanDoRequest is the can_do input: proMCP intent, or PhysMCP query.
type CanDoRequest struct {
	Intent *Intent  `json:"intent,omitempty"`
	Query  *Intent  `json:"query,omitempty"`
	Scope  []string `json:"scope,omitempty"`
	TTL    *int     `json:"ttl,omitempty"`
}

// CapabilityReport is the can_do response.
type CapabilityReport struct {
	QueryID    string         `json:"query_id"`
	Feasible   bool           `json:"feasible"`
	Candidates []Candidate    `json:"candidates"`
	Blocked    []Blocked      `json:"blocked"`
	Unroutable []Unroutable   `json:"unroutable"`
	Context    ReportContext  `json:"context"`
	Metadata   ReportMetadata `json:"metadata"`
}

// Candidate is a capability that can serve the intent.
type Candidate struct {
	Capability string `json:"capability"`
	Source     string `json:"source"`
	// Site is the owner's fleet site (the fleet endpoint's can_do).
	Site               string       `json:"site,omitempty"`
	DeviceID           string       `json:"device_id"`
	Confidence         float64      `json:"confidence"`
	Permission         Permission   `json:"permission"`
	ValidUntil         time.Time    `json:"valid_until"`
	MatchReasons       []string     `json:"match_reasons"`
	Kind               string       `json:"kind"`
	Zone               string       `json:"zone"`
	CurrentState       *State       `json:"current_state,omitempty"`
	Constraints        *Constraints `json:"constraints,omitempty"`
	SideEffects        []string     `json:"side_effects,omitempty"`
	EstimatedLatencyMS int          `json:"estimated_latency_ms"`
	Reason             string       `json:"reason,omitempty"`
	// RateLimit is the tightest rate rule's state (PhysMCP), when one applies.
	RateLimit *RateLimit `json:"rate_limit,omitempty"`
	// FailSafe (physd) is the output's safe state and lease terms, and
	// what physd did about them last.
	FailSafe *FailSafe `json:"fail_safe,omitempty"`
}

// FailSafe is a do_ capability's safe state (manifest safe:) and lease
// (manifest lease:), with their state now.
type FailSafe struct {
	SafeValue any      `json:"safe_value"`
	On        []string `json:"on"`
	// Lease is set for leased capabilities: every do_ holds its value for
	// hold_s (default_s, at most max_s), then the output goes safe.
	Lease *LeaseTerms `json:"lease,omitempty"`
	// State is the last drive to safe (driving, safe, failed), until a
	// do_ commands the output again; empty when it was never driven.
	State string     `json:"state,omitempty"`
	Event string     `json:"event,omitempty"`
	Since *time.Time `json:"since,omitempty"`
	Error string     `json:"error,omitempty"`
	// Interlocks are the policy's rules on this output, each with its
	// condition's reading now.
	Interlocks []InterlockNote `json:"interlocks,omitempty"`
}

// InterlockNote is one permissive, interlock or trip on an output.
type InterlockNote struct {
	Name      string `json:"name"`
	Kind      string `json:"kind"`
	Condition string `json:"condition"`
	Bound     string `json:"bound,omitempty"`
	Reading   string `json:"reading"`
	// BypassedUntil is set while two people have lifted the rule.
	BypassedUntil *time.Time `json:"bypassed_until,omitempty"`
	BypassedBy    string     `json:"bypassed_by,omitempty"`
}

// LeaseTerms are a leased capability's terms and its active lease.
type LeaseTerms struct {
	DefaultS int          `json:"default_s"`
	MaxS     int          `json:"max_s"`
	Active   *ActiveLease `json:"active,omitempty"`
}

// ActiveLease is the hold in force.
type ActiveLease struct {
	Value          any       `json:"value"`
	IdempotencyKey string    `json:"idempotency_key"`
	ExpiresAt      time.Time `json:"expires_at"`
}

// RateLimit is how many actuations a rate rule still allows in its window.
type RateLimit struct {
	Max                    int `json:"max"`
	CurrentWindowRemaining int `json:"current_window_remaining"`
}

// Blocked is a matching capability that cannot be used now.
type Blocked struct {
	Capability string `json:"capability"`
	Source     string `json:"source"`
	// Site is the owner's fleet site (the fleet endpoint's can_do).
	Site         string     `json:"site,omitempty"`
	DeviceID     string     `json:"device_id"`
	Permission   Permission `json:"permission"`
	Reason       string     `json:"reason"`         // human readable
	Code         string     `json:"code,omitempty"` // PhysMCP short code, e.g. device_offline
	Details      *string    `json:"details"`        // machine-parseable "k=v; k=v" or null
	Confidence   float64    `json:"confidence"`
	MatchReasons []string   `json:"match_reasons"`
}

// Unroutable explains that nothing can produce the outcome.
type Unroutable struct {
	Outcome             string   `json:"outcome"`
	Reason              string   `json:"reason"`
	Detail              string   `json:"detail"`
	ProducersFound      []string `json:"producers_found,omitempty"`
	MissingRequirements []string `json:"missing_requirements,omitempty"`
}

// State is a candidate's current_state and a context observation.
type State struct {
	Value     any       `json:"value"`
	Unit      string    `json:"unit"`
	Timestamp time.Time `json:"timestamp"`
	Quality   Quality   `json:"quality"`
	Source    string    `json:"source,omitempty"`
}

// Constraints tell the caller what values a do_ accepts.
type Constraints struct {
	Min        *float64 `json:"min,omitempty"`
	Max        *float64 `json:"max,omitempty"`
	Unit       string   `json:"unit,omitempty"`
	DataType   string   `json:"data_type"`
	EnumValues []string `json:"enum_values,omitempty"`
}

// ReportContext is can_do context.
type ReportContext struct {
	Location            string           `json:"location,omitempty"`
	ImpliedTarget       string           `json:"implied_target,omitempty"`
	RelatedReads        []string         `json:"related_reads"`
	CurrentObservations map[string]State `json:"current_observations"`
	// ActiveAlarms (physd) are the alarms raised now on the candidates,
	// the blocked capabilities and the related reads.
	ActiveAlarms []ActiveAlarm `json:"active_alarms,omitempty"`
}

// ActiveAlarm is an alarm raised now (physd; manifest capabilities[].alarms).
type ActiveAlarm struct {
	Capability string    `json:"capability"`
	Kind       string    `json:"kind"` // high | low | quality | stale
	Since      time.Time `json:"since"`
	Message    string    `json:"message"`
}

// ReportMetadata is can_do metadata (proMCP + PhysMCP §12).
type ReportMetadata struct {
	Timestamp       time.Time `json:"timestamp"`
	TotalLatencyMS  float64   `json:"total_latency_ms"`
	CoordinatorNode string    `json:"coordinator_node"`
	// PeersMatched is the number of other nodes whose catalog matched
	// the query; each is consulted or reported (PeersNotConsulted).
	PeersMatched      int `json:"peers_matched"`
	PeersConsulted    int `json:"peers_consulted"`
	PeersNotConsulted int `json:"peers_not_consulted"`
	ResponsesReceived int `json:"responses_received"`
	// TTLUsed is the mesh hops the query travelled (1: every node is
	// asked directly; 0: no other node was asked). FanoutUsed is the most
	// peers asked at once (≤ max_peers).
	TTLUsed              int    `json:"ttl_used"`
	FanoutUsed           int    `json:"fanout_used"`
	ResponsesDroppedLate int    `json:"responses_dropped_late"`
	MeshSizeEstimate     int    `json:"mesh_size_estimate"`
	PartitionState       string `json:"partition_state"`
	CapabilitiesScanned  int    `json:"capabilities_scanned"`
	// View names the endpoint's view (physd); FilteredByView counts the
	// matching capabilities it left out of candidates and blocked.
	View           string `json:"view,omitempty"`
	FilteredByView int    `json:"filtered_by_view,omitempty"`
}

// DeriveFeasible sets Feasible from the candidates (proMCP AP-10: derived,
// never asserted) and clears Unroutable when feasible.
func (r *CapabilityReport) DeriveFeasible() {
	r.Feasible = false
	for _, c := range r.Candidates {
		if c.Permission == PermAllowed {
			r.Feasible = true
			break
		}
	}
	if r.Feasible {
		r.Unroutable = []Unroutable{}
	}
}

// CompensationHint renders the proMCP §10.2 machine-parseable hint
// "do_<cap> value=<previous>".
func CompensationHint(tool string, previous any) string {
	return tool + " value=" + FormatValue(previous)
}

// FormatValue renders a value compactly for hints, canonical strings and
// details: shortest float form, no exponent for ordinary magnitudes.
func FormatValue(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case float64:
		if math.Trunc(x) == x && math.Abs(x) < 1e15 {
			return strconv.FormatInt(int64(x), 10)
		}
		return strconv.FormatFloat(x, 'f', -1, 64)
	case int64:
		return strconv.FormatInt(x, 10)
	case int:
		return strconv.Itoa(x)
	case bool:
		return strconv.FormatBool(x)
	case string:
		return x
	default:
		return fmt.Sprint(x)
	}
}
