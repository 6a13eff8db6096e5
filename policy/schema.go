package policy

import (
	"fmt"
	"reflect"
	"slices"
	"sort"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/physd/physd/interlock"
	"github.com/physd/physd/manifest"
)

// Schema returns the JSON Schema of physmcp.policy.yml as Parse reads it,
// for editors. Each section's keys come from the Go type Parse decodes it
// into (manifest.DecodeSchema over rawPolicy, rawWindow, rawToken …, the
// same key matching DecodeNode applies), and the rule keys from ruleKeys,
// so the accepted keys cannot drift from the parser; the values are
// narrowed here to what Parse then checks (roles, days, HH:MM, rates).
// gate is the schema of the gate: section, which the gate package decodes
// (the policy package does not import it).
func Schema(gate *jsonschema.Schema) *jsonschema.Schema {
	s := manifest.DecodeSchema(reflect.TypeFor[rawPolicy]())
	s.Schema = manifest.SchemaDraft
	s.Title = "PhysMCP policy (physd)"
	s.Description = "physmcp.policy.yml: PhysMCP v0.1 §6 plus physd's rules. Check a file against its manifest with: physd validate --policy POLICY MANIFEST"
	s.Required = []string{"physmcp_policy_version"}
	p := s.Properties
	p["physmcp_policy_version"] = &jsonschema.Schema{Type: "string", Const: anyOf(Version), Description: `Policy version, quoted: "0.1"`}

	d := p["defaults"]
	d.Description = "Applied to every do_ tool, on top of the manifest and the rules below."
	d.Properties["require_permission"] = roleEnum(Roles, "Least role for every do_ tool.")
	d.Properties["rate_limit"] = rateSchema("Limit on every do_ tool, e.g. 120/hour.")
	d.Properties["audit_all"].Description = "Audit every actuation (physd always does)."
	d.Properties["max_change_percent"] = &jsonschema.Schema{Type: "number", ExclusiveMinimum: ptr(0.0), ExclusiveMaximum: ptr(100.0),
		Description: "max_change for every float and int do_ tool with a range: this percentage of the range's width (a max_change rule that is stricter wins)."}

	window := manifest.DecodeSchema(reflect.TypeFor[rawWindow]())
	window.Required = []string{"days", "start", "end", "timezone"}
	days := make([]any, 0, 7)
	for _, n := range []string{"mon", "tue", "wed", "thu", "fri", "sat", "sun"} {
		days = append(days, n)
	}
	window.Properties["days"] = &jsonschema.Schema{Type: "array", MinItems: ptr(1), Items: &jsonschema.Schema{Type: "string", Enum: days}, Description: "Days the window starts on."}
	clock := `^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$`
	window.Properties["start"] = &jsonschema.Schema{Type: "string", Pattern: clock, Description: `Start, "HH:MM" local time.`}
	window.Properties["end"] = &jsonschema.Schema{Type: "string", Pattern: clock, Description: `End, "HH:MM"; an end before the start crosses midnight.`}
	window.Properties["timezone"] = &jsonschema.Schema{Type: "string", Pattern: `\S`, Description: "IANA zone, e.g. Europe/Amsterdam or UTC.", Examples: []any{"UTC", "Europe/Amsterdam"}}
	p["time_windows"] = &jsonschema.Schema{Type: "object", AdditionalProperties: window, Description: "Named time windows for time_window and approval rules."}

	id := p["identity"]
	token := manifest.DecodeSchema(reflect.TypeFor[rawToken]())
	token.Required = []string{"id", "sha256", "role"}
	token.Properties["sha256"] = &jsonschema.Schema{Type: "string", Pattern: hexRE.String(), Description: `SHA-256 of the token in lower-case hex (printf %s "$TOKEN" | sha256sum), never the token.`}
	token.Properties["role"] = roleEnum(Roles, "Role of the holder.")
	id.Properties["tokens"].Items = token
	provider := manifest.DecodeSchema(reflect.TypeFor[rawProvider]())
	provider.Required = []string{"type", "issuer", "audience"}
	provider.Properties["type"] = &jsonschema.Schema{Type: "string", Enum: []any{"jwt"}, Description: "jwt (terminate mTLS in a proxy that forwards a token)."}
	id.Properties["providers"].Items = provider
	person := manifest.DecodeSchema(reflect.TypeFor[rawPerson]())
	person.Required = []string{"name"}
	person.Description = "One person's credentials: the two-person rule never lets them approve their own request with another of them."
	person.Properties["tokens"].Description = "ids of identity.tokens entries that are this person's."
	person.Properties["certs"].Description = "Client certificates: the cn or san an mtls rule maps, or sha256:<64 hex> (the leaf's fingerprint)."
	sub := manifest.DecodeSchema(reflect.TypeFor[rawJWTSub]())
	sub.Required = []string{"issuer", "subject"}
	person.Properties["jwt"].Items = sub
	person.Properties["jwt"].Description = "JWT subjects of a jwt provider's issuer."
	id.Properties["people"].Items = person
	id.Properties["oauth"] = oauthSchema()

	e := p["emergency"]
	e.Properties["override_permission"] = roleEnum(Roles[1:], "Role that may lift time windows for a while.")
	e.Properties["override_token_ttl_seconds"] = &jsonschema.Schema{Type: "integer", Minimum: ptr(1.0), Maximum: ptr(86400.0), Description: "Longest override, in seconds."}
	e.Properties["audit_all_overrides"] = &jsonschema.Schema{Type: "boolean", Enum: []any{true}, Description: "physd always audits overrides."}

	capability := manifest.DecodeSchema(reflect.TypeFor[rawCapability]())
	capability.Properties["rules"].Items = ruleSchema()
	p["capabilities"] = &jsonschema.Schema{Type: "object", AdditionalProperties: capability,
		PropertyNames: &jsonschema.Schema{Pattern: "^do_"}, Description: "Rules keyed by the full do_ tool name."}
	p["gate"] = gate
	p["interlocks"] = interlocksSchema()
	return s
}

// ruleSchema describes one rule: every key of rawRule, the type naming
// which of them apply (ruleKeys) and which are required.
func ruleSchema() *jsonschema.Schema {
	r := manifest.DecodeSchema(reflect.TypeFor[rawRule]())
	// rawRule holds the union of the rule types' keys; a key in one and not
	// the other would be accepted by no rule, or refused by every rule.
	var union []string
	for _, keys := range ruleKeys {
		union = append(union, keys...)
	}
	manifest.MustCoverKeys("capabilities.<tool>.rules[]", append(union, "type"), r.Properties)

	types := make([]string, 0, len(ruleKeys))
	for t := range ruleKeys {
		types = append(types, t)
	}
	sort.Strings(types)
	r.Required = []string{"type"}
	r.Properties["type"] = &jsonschema.Schema{Type: "string", Enum: anySlice(types), Description: "Rule type: " + fmt.Sprint(types) + "."}
	r.Properties["require"] = &jsonschema.Schema{Type: "array", MinItems: ptr(1), Items: roleEnum(Roles, ""), Description: "permission: the roles allowed; the lowest listed and above pass."}
	r.Properties["allow_during"].Description = "time_window: windows inside which the tool may run."
	r.Properties["deny_during"].Description = "time_window: windows inside which it may not."
	r.Properties["min"] = &jsonschema.Schema{Type: "number", Description: "range_guard: lowest value; inside the manifest range."}
	r.Properties["max"] = &jsonschema.Schema{Types: []string{"number", "string"}, Description: `range_guard: highest value; rate: "N/unit", e.g. "6/hour"; max_change: the largest step from the current value in one actuation.`}
	r.Properties["on_violation"] = &jsonschema.Schema{Type: "string", Enum: []any{"clamp", "deny", "warn"}, Description: "range_guard: what a value outside does."}
	r.Properties["min_peers"] = &jsonschema.Schema{Type: "integer", Minimum: ptr(1.0), Description: "quorum: gateways that must answer, self included."}
	r.Properties["on_failure"] = &jsonschema.Schema{Type: "string", Enum: []any{"deny"}, Description: "quorum: deny (the only safe choice)."}
	r.Properties["ms"] = &jsonschema.Schema{Type: "integer", Minimum: ptr(1.0), Description: "cooldown: least time between actuations, ms."}
	r.Properties["when"] = &jsonschema.Schema{Type: "string", Enum: []any{"always", "outside_window", "above"}, Description: "approval: when a human must confirm."}
	r.Properties["window"].Description = "approval (outside_window): the window inside which no approval is needed."
	r.Properties["above"] = &jsonschema.Schema{Type: "number", Description: "approval (above): the value above which a human confirms."}
	r.Properties["approver_role"] = roleEnum(Roles[2:], "approval: the least role of the person who approves, through GET/POST /approvals (a two-person rule unless self_approval is true).")
	r.Properties["self_approval"] = &jsonschema.Schema{Type: "boolean", Description: "approval: may the caller approve its own call (default true without approver_role, false with it)?"}

	required := map[string][]string{"permission": {"require"}, "rate": {"max"}, "quorum": {"min_peers"},
		"range_guard": {"min", "max", "on_violation"}, "cooldown": {"ms"}, "approval": {"when"}, "max_change": {"max"}}
	for _, t := range types {
		names := anySlice(append([]string{"type"}, ruleKeys[t]...))
		then := &jsonschema.Schema{PropertyNames: &jsonschema.Schema{Enum: names}, Required: required[t]}
		switch t {
		case "rate":
			then.Properties = map[string]*jsonschema.Schema{"max": rateSchema("")}
		case "range_guard":
			then.Properties = map[string]*jsonschema.Schema{"max": {Type: "number"}}
		case "max_change":
			then.Properties = map[string]*jsonschema.Schema{"max": {Type: "number", ExclusiveMinimum: ptr(0.0)}}
		}
		r.AllOf = append(r.AllOf, &jsonschema.Schema{
			If:   &jsonschema.Schema{Properties: map[string]*jsonschema.Schema{"type": {Const: anyOf(t)}}, Required: []string{"type"}},
			Then: then,
		})
	}
	return r
}

func roleEnum(roles []string, desc string) *jsonschema.Schema {
	return &jsonschema.Schema{Type: "string", Enum: anySlice(roles), Description: desc}
}

func rateSchema(desc string) *jsonschema.Schema {
	return &jsonschema.Schema{Type: "string", Pattern: manifest.RatePattern(), Description: desc, Examples: []any{"6/hour"}}
}

func anySlice(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range slices.Clone(ss) {
		out[i] = s
	}
	return out
}

func anyOf(v any) *any { return &v }

func ptr[T any](v T) *T { return &v }

// interlocksSchema is the interlocks: list (policy/interlocks.go).
func interlocksSchema() *jsonschema.Schema {
	il := manifest.DecodeSchema(reflect.TypeFor[rawInterlock]())
	il.Required = []string{"name", "kind"}
	kinds := make([]any, len(interlock.Kinds))
	for i, k := range interlock.Kinds {
		kinds[i] = string(k)
	}
	il.Properties["name"] = &jsonschema.Schema{Type: "string", Pattern: ruleNameRE.String(), Description: "The rule's name, in refusals, audit lines and can_do."}
	il.Properties["kind"] = &jsonschema.Schema{Type: "string", Enum: kinds,
		Description: "permissive: the output may leave its safe value only while requires: holds; interlock: the output keeps max/min while while: holds; trip: the safe: outputs are held safe while while: holds."}
	il.Properties["tool"] = &jsonschema.Schema{Type: "string", Pattern: "^do_", Description: "The do_ tool a permissive or interlock guards (its manifest safe.on must list interlock_trip)."}
	il.Properties["safe"] = &jsonschema.Schema{Type: "array", MinItems: ptr(1), Items: &jsonschema.Schema{Type: "string", Pattern: "^do_"}, Description: "A trip's outputs, held at their safe values while the condition holds."}
	il.Properties["applies_above"].Description = "Permissive: the values above this need the condition (default: every value but the safe value)."
	il.Properties["max"].Description = "Interlock: the most the output may be while the condition holds."
	il.Properties["min"].Description = "Interlock: the least the output may be while the condition holds."
	il.Properties["max_age_ms"] = &jsonschema.Schema{Type: "integer", Minimum: ptr(1.0), Maximum: ptr(3_600_000.0),
		Description: "How old the reading may be to count (default: 2 × poll_ms + timeout_ms for a polled read, else 5000 or cache_ttl_ms); an older, stale, degraded or failed reading counts as the unsafe side."}
	cond := manifest.DecodeSchema(reflect.TypeFor[rawCondition]())
	cond.Required = []string{"read"}
	cond.Properties["read"] = &jsonschema.Schema{Type: "string", Pattern: "^read_", Description: "A polled read_ tool of this gateway, or of the gateway source names."}
	cond.Properties["source"] = &jsonschema.Schema{Type: "string", Description: "Another gateway's device.id: the reading comes over the mesh (max_age_ms default 5000), and an owner that does not answer counts as the unsafe side."}
	cond.Properties["equals"] = &jsonschema.Schema{Types: []string{"number", "boolean", "string"}, Description: "The reading equals this value (bool, enum, int)."}
	cond.Properties["above"].Description = "The reading is above this number."
	cond.Properties["below"].Description = "The reading is below this number."
	bp := manifest.DecodeSchema(reflect.TypeFor[rawBypass]())
	bp.Properties["role"] = roleEnum([]string{"operator", "supervisor", "admin"}, "The least role of the person who asks for the bypass and of the other person who approves it (default supervisor).")
	bp.Properties["max_minutes"] = &jsonschema.Schema{Type: "integer", Minimum: ptr(1.0), Maximum: ptr(1440.0), Description: "The longest bypass, in minutes (default 60)."}
	bp.Description = "Permissive and interlock: two people may lift the rule for a while (POST /interlocks/<name>/bypass, then an approval by another person); audited and shown everywhere the rule is. A trip has no bypass."
	il.Properties["bypass"] = bp
	il.Properties["requires"] = cond
	il.Properties["while"] = cond
	return &jsonschema.Schema{Type: "array", Items: il, Description: "Permissives, interlocks and trips: rules that tie an output to an observation (docs/safety.md)."}
}

// oauthSchema is identity.oauth (policy/parse_oauth.go).
func oauthSchema() *jsonschema.Schema {
	o := manifest.DecodeSchema(reflect.TypeFor[rawOAuth]())
	o.Required = []string{"resource", "authorization_servers", "scopes"}
	o.Description = "physd as an OAuth 2.1 resource server (MCP authorization): accepts access tokens issued for resource by these authorization servers, and maps their scopes to roles."
	url := func(desc string) *jsonschema.Schema {
		return &jsonschema.Schema{Type: "string", Format: "uri", Pattern: "^https?://[^#?]+$", Description: desc}
	}
	o.Properties["resource"] = url("The canonical URL of /mcp as clients write it (RFC 8707 resource indicator; tokens must carry it in aud). A view at /mcp/<view> is <resource>/<view>.")
	o.Properties["site_resource"] = url("A resource identifier every gateway of the site accepts too: the audience of tokens for calls routed across the mesh.")
	o.Properties["fleet_resource"] = url("The fleet endpoint's resource (physd fleet): tokens for it are accepted on calls the fleet forwards over NATS, never on this gateway's own HTTP endpoint.")
	as := manifest.DecodeSchema(reflect.TypeFor[rawAuthServer]())
	as.Required = []string{"issuer"}
	as.Properties["issuer"] = url("The authorization server's issuer identifier, exactly as its tokens' iss.")
	as.Properties["metadata_url"] = url("Its metadata document (default: RFC 8414 discovery, then OpenID Connect discovery).")
	in := as.Properties["introspection"]
	in.Description = "Check opaque (non-JWT) access tokens by RFC 7662 introspection as this client."
	in.Required = []string{"client_id"}
	o.Properties["authorization_servers"].Items = as
	o.Properties["authorization_servers"].MinItems = ptr(1)
	o.Properties["algorithms"].Items = &jsonschema.Schema{Type: "string", Enum: anySlice(oauthAlgorithms)}
	o.Properties["algorithms"].Description = "Accepted JWS algorithms (default RS256, ES256)."
	o.Properties["clock_skew_seconds"] = &jsonschema.Schema{Type: "integer", Minimum: ptr(0.0), Maximum: ptr(300.0), Description: "Tolerance on exp and nbf, in seconds (default 30)."}
	o.Properties["scopes"] = &jsonschema.Schema{Type: "object", MinProperties: ptr(1), AdditionalProperties: roleEnum(Roles[1:], ""),
		Description: `Scope -> role, e.g. {"physd:read": viewer, "physd:operate": operator, "physd:approve": supervisor}; a token gets the highest role its scopes map to.`}
	return o
}
