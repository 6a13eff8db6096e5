package i2c

import (
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// addressAliases are the short key names the PhysMCP address string may use.
var addressAliases = map[string]string{
	"reg":   "register",
	"cmd":   "command",
	"order": "byte_order",
}

// splitAddress parses a PhysMCP address string "0x48:reg=0x00:width=16"
// into the device address ("0x48") and a YAML mapping of the other keys
// (canonical names), so that the keys are decoded by the same strict decoder
// as the structured binding keys. The nodes are placed at pos, the best
// position the manifest model keeps for the address string.
func splitAddress(s string, line, col int) (device string, keys *yaml.Node, err error) {
	keys = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: line, Column: col}
	for i, tok := range strings.Split(s, ":") {
		tok = strings.TrimSpace(tok)
		k, v, hasEq := strings.Cut(tok, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case i == 0 && !hasEq:
			device = tok
			continue
		case !hasEq || k == "" || v == "":
			return "", nil, fmt.Errorf("part %d %q of %q is not key=value", i+1, tok, s)
		}
		if c, ok := addressAliases[k]; ok {
			k = c
		}
		for j := 0; j < len(keys.Content); j += 2 {
			if keys.Content[j].Value == k {
				return "", nil, fmt.Errorf("key %s appears twice in %q", k, s)
			}
		}
		keys.Content = append(keys.Content,
			&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k, Line: line, Column: col},
			// An empty tag lets YAML resolve the type as if it were written
			// in the file: 0x00 is an int, true a bool, sht3x a string.
			&yaml.Node{Kind: yaml.ScalarNode, Value: v, Line: line, Column: col})
	}
	return device, keys, nil
}

// parseDeviceAddress reads a 7-bit I²C address (0x48, 72, 0b1001000).
func parseDeviceAddress(s string) (uint16, error) {
	u, err := strconv.ParseUint(strings.TrimSpace(s), 0, 16)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%q is not an I²C address; write the 7-bit address in hex, e.g. 0x48", s)
	case u > 0x7F && u <= 0xFF:
		return 0, fmt.Errorf("%s is an 8-bit (shifted) address; use the 7-bit address 0x%02X", s, u>>1)
	case u < 0x03 || u > 0x77:
		return 0, fmt.Errorf("%s is outside the 7-bit device range 0x03..0x77 (the rest is reserved by the I²C spec)", s)
	}
	return uint16(u), nil
}
