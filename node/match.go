package node

import (
	"strings"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
)

// Intent matching for can_do. PhysMCP leaves the confidence formula open
// (research §2.7); physd's is explainable: each part of the intent that the
// caller gave contributes a weighted score, and every contribution is named
// in match_reasons. Weights: semantic tags 0.5, location 0.2, action vs kind
// 0.15, target vs name and tags 0.15, normalised over the parts given, so an
// intent of tags alone is judged on tags alone.
const (
	wTags     = 0.5
	wLocation = 0.2
	wAction   = 0.15
	wTarget   = 0.15
)

// match is the outcome of matching one capability.
type match struct {
	cs         *capState
	confidence float64
	reasons    []string
	excluded   string // why a tag-matching capability cannot serve the intent
}

// stem reduces a tag to a comparable root: lower case, and common English
// suffixes removed (heating, heater, heaters → heat), so agents need not
// guess the manifest's exact word.
func stem(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	for _, suf := range []string{"ation", "ing", "ers", "er", "es", "s"} {
		if len(s) > len(suf)+2 && strings.HasSuffix(s, suf) {
			return s[:len(s)-len(suf)]
		}
	}
	return s
}

// vocabulary is the stemmed words a capability answers to: its tags, the
// words of its name, its zone and unit.
func vocabulary(c *manifest.Capability) map[string]bool {
	v := map[string]bool{}
	for _, t := range c.SemanticTags {
		v[stem(t)] = true
	}
	for _, w := range strings.Split(c.Name, "_") {
		v[stem(w)] = true
	}
	return v
}

func words(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return r == '_' || r == ' ' || r == '-' || r == '.' || r == '/'
	})
}

// doActions are intent actions a do_ capability serves; read is the only
// action a read_ serves. create and delete have no physical meaning here.
var doActions = map[string]bool{"set": true, "update": true, "increase": true, "decrease": true, "toggle": true}

func (n *Node) matchOne(cs *capState, in *promcp.Intent, tags []string) match {
	c := cs.cap
	m := match{cs: cs}
	vocab := cs.vocab
	var hit []string
	for _, t := range tags {
		if vocab[stem(t)] {
			hit = append(hit, t)
		}
	}
	targetHit := false
	if in.Target != "" {
		tw := words(in.Target)
		if strings.EqualFold(in.Target, c.Name) || strings.EqualFold(in.Target, cs.tool) {
			targetHit = true
		} else {
			n := 0
			for _, w := range tw {
				if vocab[stem(w)] {
					n++
				}
			}
			targetHit = len(tw) > 0 && n == len(tw)
		}
	}
	if len(hit) == 0 && !targetHit {
		return m // no relation at all
	}
	score, weight := 0.0, 0.0
	weight += wTags
	score += wTags * float64(len(hit)) / float64(len(tags))
	if len(hit) > 0 {
		m.reasons = append(m.reasons, "tag_overlap: "+strings.Join(hit, ","))
	}
	if in.Location != "" {
		weight += wLocation
		loc := strings.ToLower(in.Location)
		// A zone name, the whole device's zone or area, or a tag all place
		// the capability.
		dev := n.bound().m.Device.Location
		if strings.EqualFold(loc, c.Zone) || strings.EqualFold(loc, dev.Zone) || strings.EqualFold(loc, dev.Area) || vocab[stem(loc)] {
			score += wLocation
			m.reasons = append(m.reasons, "location_match: "+in.Location)
		} else {
			m.excluded = "location " + in.Location + " does not match zone " + c.Zone
		}
	}
	if in.Action != "" {
		weight += wAction
		switch {
		case in.Action == "read" && c.Kind == manifest.KindRead,
			doActions[in.Action] && c.Kind == manifest.KindDo:
			score += wAction
			m.reasons = append(m.reasons, "action_match: "+in.Action+" → "+c.Kind)
		case in.Action == "toggle" || doActions[in.Action] || in.Action == "read":
			if m.excluded == "" {
				m.excluded = "action " + in.Action + " needs a " + map[bool]string{true: "read", false: "do"}[in.Action == "read"] + " capability"
			}
		default:
			if m.excluded == "" {
				m.excluded = "action " + in.Action + " is not something a physical capability does"
			}
		}
	}
	if in.Target != "" {
		weight += wTarget
		if targetHit {
			score += wTarget
			m.reasons = append(m.reasons, "target_match: "+in.Target)
		}
	}
	m.confidence = round2(score / weight)
	return m
}

func round2(f float64) float64 { return float64(int(f*100+0.5)) / 100 }

// IntentTouches reports whether a capability described only by its tool
// name, zone and tags (a mesh catalog entry) could match the intent: a
// stemmed tag or target word in common. The coordinator uses it to ask only
// the nodes that might answer; the owner then matches precisely.
func IntentTouches(in *promcp.Intent, tool string, tags []string) bool {
	vocab := map[string]bool{}
	for _, t := range tags {
		vocab[stem(t)] = true
	}
	for _, w := range strings.Split(tool, "_") {
		vocab[stem(w)] = true
	}
	words := append([]string(nil), in.SemanticTags...)
	if in.Target != "" {
		words = append(words, in.Target)
	}
	for _, w := range words {
		if vocab[stem(w)] {
			return true
		}
	}
	return false
}

// Normalise applies can_do's input rules (intent or PhysMCP query, tags
// present) and returns the intent the matcher uses.
func Normalise(req promcp.CanDoRequest) (*promcp.Intent, error) { return normaliseIntent(req) }
