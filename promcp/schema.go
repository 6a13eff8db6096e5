package promcp

// The JSON Schemas below are the proMCP contracts as MCP outputSchema
// (draft 2020-12). They are built as plain maps so they serialise exactly as
// written and can be checked by promcp-lint rules, which read enum lists.

// Schema is a JSON Schema object.
type Schema = map[string]any

func enumOf[T ~string](vals []T) []any {
	out := make([]any, len(vals))
	for i, v := range vals {
		out[i] = string(v)
	}
	return out
}

// ValueSchema is the JSON Schema of a value of a manifest data_type.
func ValueSchema(dataType string, enumValues []string, nullable bool) Schema {
	var s Schema
	switch dataType {
	case "float":
		s = Schema{"type": "number"}
	case "int":
		s = Schema{"type": "integer"}
	case "bool":
		s = Schema{"type": "boolean"}
	case "enum":
		vals := make([]any, len(enumValues))
		for i, v := range enumValues {
			vals[i] = v
		}
		s = Schema{"type": "string", "enum": vals}
	default:
		s = Schema{"type": "string"}
	}
	if nullable {
		t := s["type"].(string)
		s["type"] = []any{t, "null"}
		if e, ok := s["enum"].([]any); ok {
			s["enum"] = append(e, nil)
		}
	}
	return s
}

var timestamp = Schema{"type": "string", "format": "date-time"}

// ReadOutputSchema is the read_* contract for a capability of dataType.
func ReadOutputSchema(dataType string, enumValues []string) Schema {
	return Schema{
		"type":     "object",
		"required": []any{"value", "unit", "timestamp", "quality"},
		"properties": Schema{
			"value":      ValueSchema(dataType, enumValues, true),
			"unit":       Schema{"type": "string"},
			"timestamp":  timestamp,
			"quality":    Schema{"type": "string", "enum": enumOf(Qualities)},
			"capability": Schema{"type": "string"},
			"source":     Schema{"type": "string"},
			"site":       Schema{"type": "string"},
			"age_ms":     Schema{"type": "integer"},
			"cached":     Schema{"type": "boolean"},
			"reason":     Schema{"type": "string"},
		},
		"additionalProperties": true,
	}
}

// DoOutputSchema is the do_* contract for a capability of dataType.
func DoOutputSchema(dataType string, enumValues []string) Schema {
	val := func() Schema { return ValueSchema(dataType, enumValues, true) }
	return Schema{
		"type":     "object",
		"required": []any{"status", "idempotency_key", "compensable", "timestamp", "applied_value", "previous_value", "side_effects", "permission", "policy"},
		"properties": Schema{
			"status":            Schema{"type": "string", "enum": enumOf(Statuses)},
			"idempotency_key":   Schema{"type": "string", "minLength": 1},
			"compensable":       Schema{"type": "boolean"},
			"compensation_hint": Schema{"type": []any{"string", "null"}},
			"timestamp":         timestamp,
			"applied_value":     val(),
			"previous_value":    val(),
			"side_effects":      Schema{"type": "array", "items": Schema{"type": "string"}},
			"capability":        Schema{"type": "string"},
			"source":            Schema{"type": "string"},
			"site":              Schema{"type": "string"},
			"requested_value":   Schema{},
			"verified":          Schema{"type": "boolean"},
			"verification_ms":   Schema{"type": "integer", "minimum": 0, "description": "how long the verification took after the write: settle_ms and the read-back"},
			"lease_expires_at":  Schema{"type": "string", "format": "date-time", "description": "leased capabilities: when the value's hold runs out and the output goes to its safe value unless another do_ renews it"},
			"permission":        Schema{"type": "string", "enum": enumOf(Permissions)},
			"code":              Schema{"type": "string", "description": "partial: outcome_unknown | unverified | mismatch (read the device before retrying); failed: the refusal's or the device's code"},
			"reason":            Schema{"type": "string"},
			"details":           Schema{"type": "string"},
			"policy": Schema{
				"type":     "object",
				"required": []any{"configured", "decision"},
				"properties": Schema{
					"configured": Schema{"type": "boolean"},
					"decision":   Schema{"type": "string"},
					"note":       Schema{"type": "string"},
				},
			},
			"gate": Schema{
				"type": "object",
				"properties": Schema{
					"decision":    Schema{"type": "string", "enum": []any{"allow", "ask", "deny"}},
					"layer":       Schema{"type": "string"},
					"reason":      Schema{"type": "string"},
					"engine":      Schema{"type": "string"},
					"fingerprint": Schema{"type": "string"},
				},
			},
			"audit": Schema{"type": "object", "properties": Schema{"seq": Schema{"type": "integer"}}},
		},
		// proMCP: a compensable result must carry its hint.
		"if":                   Schema{"properties": Schema{"compensable": Schema{"const": true}}},
		"then":                 Schema{"required": []any{"compensation_hint"}, "properties": Schema{"compensation_hint": Schema{"type": "string"}}},
		"additionalProperties": true,
	}
}

func stateSchema() Schema {
	return Schema{
		"type":     "object",
		"required": []any{"value", "unit", "timestamp", "quality"},
		"properties": Schema{
			"value":     Schema{},
			"unit":      Schema{"type": "string"},
			"timestamp": timestamp,
			"quality":   Schema{"type": "string", "enum": enumOf(Qualities)},
			"source":    Schema{"type": "string"},
		},
	}
}

// CanDoOutputSchema is the CapabilityReport contract.
func CanDoOutputSchema() Schema {
	strs := Schema{"type": "array", "items": Schema{"type": "string"}}
	perm := Schema{"type": "string", "enum": enumOf(Permissions)}
	return Schema{
		"type":     "object",
		"required": []any{"query_id", "feasible", "candidates", "blocked", "unroutable", "context", "metadata"},
		"properties": Schema{
			"query_id": Schema{"type": "string", "format": "uuid"},
			"feasible": Schema{"type": "boolean"},
			"candidates": Schema{"type": "array", "items": Schema{
				"type":     "object",
				"required": []any{"capability", "source", "device_id", "confidence", "permission", "valid_until"},
				"properties": Schema{
					"capability":    Schema{"type": "string"},
					"source":        Schema{"type": "string"},
					"site":          Schema{"type": "string"},
					"device_id":     Schema{"type": "string"},
					"confidence":    Schema{"type": "number", "minimum": 0, "maximum": 1},
					"permission":    perm,
					"valid_until":   timestamp,
					"match_reasons": strs,
					"kind":          Schema{"type": "string", "enum": []any{"read", "do"}},
					"zone":          Schema{"type": "string"},
					"current_state": stateSchema(),
					"constraints": Schema{"type": "object", "properties": Schema{
						"min": Schema{"type": "number"}, "max": Schema{"type": "number"},
						"unit": Schema{"type": "string"}, "data_type": Schema{"type": "string"},
						"enum_values": strs,
					}},
					"side_effects":         strs,
					"estimated_latency_ms": Schema{"type": "integer"},
					"reason":               Schema{"type": "string"},
				},
			}},
			"blocked": Schema{"type": "array", "items": Schema{
				"type":     "object",
				"required": []any{"capability", "source", "device_id", "permission", "reason"},
				"properties": Schema{
					"capability":    Schema{"type": "string"},
					"source":        Schema{"type": "string"},
					"site":          Schema{"type": "string"},
					"device_id":     Schema{"type": "string"},
					"permission":    perm,
					"reason":        Schema{"type": "string"},
					"code":          Schema{"type": "string"},
					"details":       Schema{"type": []any{"string", "null"}},
					"confidence":    Schema{"type": "number", "minimum": 0, "maximum": 1},
					"match_reasons": strs,
				},
			}},
			"unroutable": Schema{"type": "array", "items": Schema{
				"type":     "object",
				"required": []any{"outcome", "reason", "detail"},
				"properties": Schema{
					"outcome":              Schema{"type": "string"},
					"reason":               Schema{"type": "string", "enum": []any{UnroutableNoProducer, UnroutableRequirementsUnmet, UnroutableMalformedRequest}},
					"detail":               Schema{"type": "string"},
					"producers_found":      strs,
					"missing_requirements": strs,
				},
			}},
			"context": Schema{"type": "object", "properties": Schema{
				"location":             Schema{"type": "string"},
				"implied_target":       Schema{"type": "string"},
				"related_reads":        strs,
				"current_observations": Schema{"type": "object", "additionalProperties": stateSchema()},
				"active_alarms": Schema{"type": "array", "items": Schema{"type": "object", "properties": Schema{
					"capability": Schema{"type": "string"}, "kind": Schema{"type": "string", "enum": []any{"high", "low", "quality", "stale"}},
					"since": timestamp, "message": Schema{"type": "string"},
				}}},
			}},
			"metadata": Schema{"type": "object", "properties": Schema{
				"timestamp":              timestamp,
				"total_latency_ms":       Schema{"type": "number"},
				"coordinator_node":       Schema{"type": "string"},
				"peers_matched":          Schema{"type": "integer", "description": "other nodes whose catalog matched; each is consulted or reported blocked (not_consulted)"},
				"peers_consulted":        Schema{"type": "integer"},
				"peers_not_consulted":    Schema{"type": "integer"},
				"ttl_used":               Schema{"type": "integer", "description": "mesh hops used (1: direct)"},
				"fanout_used":            Schema{"type": "integer", "description": "most peers asked at once (≤ max_peers)"},
				"responses_received":     Schema{"type": "integer"},
				"responses_dropped_late": Schema{"type": "integer"},
				"mesh_size_estimate":     Schema{"type": "integer"},
				"partition_state":        Schema{"type": "string", "enum": []any{"healthy", "suspected_partition", "partitioned"}},
				"capabilities_scanned":   Schema{"type": "integer"},
			}},
		},
		"additionalProperties": true,
	}
}

// CanDoInputSchema accepts a proMCP intent or a PhysMCP query (one of them).
func CanDoInputSchema() Schema {
	intent := func(actionKey string, actions []any) Schema {
		return Schema{
			"type":     "object",
			"required": []any{"semantic_tags"},
			"properties": Schema{
				"semantic_tags": Schema{"type": "array", "minItems": 1, "maxItems": 32,
					"items":       Schema{"type": "string", "minLength": 1, "maxLength": 64},
					"description": "What the capability is about, e.g. [\"heating\", \"temperature\"]."},
				actionKey:  Schema{"type": "string", "enum": actions},
				"target":   Schema{"type": "string", "maxLength": 128, "description": "The property to act on, e.g. \"temperature\" or a capability name."},
				"value":    Schema{"description": "The value you intend to set; checked against the capability's range."},
				"location": Schema{"type": "string", "maxLength": 128, "description": "Zone or area, e.g. \"zone_a\"."},
			},
			"additionalProperties": false,
		}
	}
	actions := make([]any, len(Actions))
	for i, a := range Actions {
		actions[i] = a
	}
	return Schema{
		"type": "object",
		"properties": Schema{
			"intent": intent("action", actions),
			"query":  intent("direction", []any{"increase", "decrease", "set", "toggle"}),
			"scope": Schema{"type": "array", "maxItems": 256, "items": Schema{"type": "string", "maxLength": 128},
				"description": "Limit the search to these capability/tool names or device ids."},
			"ttl": Schema{"type": "integer", "minimum": 1, "maximum": 5, "description": "PhysMCP mesh hops (accepted; the mesh uses it)."},
		},
		"anyOf":                []any{Schema{"required": []any{"intent"}}, Schema{"required": []any{"query"}}},
		"additionalProperties": false,
	}
}
