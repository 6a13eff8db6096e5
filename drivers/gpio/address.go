package gpio

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

// edgeKeys are address-string keys that belong inside edge_count.
var edgeKeys = map[string]bool{"edge": true, "debounce_ms": true}

// splitAddress parses a PhysMCP address string ("pin=14:mode=digital",
// "GPIO17:active_low=true") into a YAML mapping of binding keys, so that it
// is decoded by the same strict decoder as the structured keys. A bare
// first part is the pin; edge= and debounce_ms= are nested under
// edge_count. The nodes carry the binding's position, the best the
// manifest model keeps for the address string.
func splitAddress(s string, line, col int) (*yaml.Node, error) {
	scalar := func(v, tag string) *yaml.Node {
		// An empty tag lets YAML resolve the type as if it were in the
		// file: true is a bool, 5 an int, GPIO17 a string.
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: v, Line: line, Column: col}
	}
	keys := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: line, Column: col}
	var edge *yaml.Node
	seen := map[string]bool{}
	if strings.TrimSpace(s) == "" {
		return keys, nil
	}
	for i, tok := range strings.Split(s, ":") {
		tok = strings.TrimSpace(tok)
		k, v, hasEq := strings.Cut(tok, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case i == 0 && !hasEq && tok != "":
			k, v = "pin", tok
		case !hasEq || k == "" || v == "":
			return nil, fmt.Errorf("part %d %q of %q is not key=value", i+1, tok, s)
		}
		if seen[k] {
			return nil, fmt.Errorf("key %s appears twice in %q", k, s)
		}
		seen[k] = true
		target := keys
		if edgeKeys[k] {
			if edge == nil {
				edge = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: line, Column: col}
				keys.Content = append(keys.Content, scalar("edge_count", "!!str"), edge)
			}
			target = edge
		}
		tag := ""
		if k == "pin" {
			tag = "!!str" // 17 is a pin name here, not a number
		}
		target.Content = append(target.Content, scalar(k, "!!str"), scalar(v, tag))
	}
	return keys, nil
}
