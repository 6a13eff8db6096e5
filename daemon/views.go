package daemon

import (
	"fmt"
	"io"
	"strings"

	"github.com/physd/physd/manifest"
)

// maxViewTools is proMCP's advice for one server's tool list (lint S004
// warns above it): a view larger than that is named, so it can be cut.
const maxViewTools = 8

// WriteViews prints (for `physd validate`) each view's local tool count (its endpoint lists these
// plus can_do and the matching tools of other gateways), and warns about a
// view that selects nothing on this gateway or is larger than proMCP's
// advice. A view may name other gateways' zones and devices, so selecting
// nothing here is a warning, not an error.
func WriteViews(m *manifest.Manifest, stdout, stderr io.Writer) {
	if len(m.Views) == 0 {
		return
	}
	var parts []string
	for _, v := range m.Views {
		n := 0
		byFamily := map[string]int{} // kind_family -> members in the view
		for _, c := range m.Capabilities {
			if v.Match(m.Subject(c)) {
				n++
				if c.Family != "" {
					byFamily[c.Kind+"_"+c.Family]++
				}
			}
		}
		if v.Families != nil && *v.Families {
			// A family of two or more members is one tool there.
			for _, k := range byFamily {
				if k >= 2 {
					n -= k - 1
				}
			}
		}
		parts = append(parts, fmt.Sprintf("%s (%d tools + can_do at /mcp/%s)", v.Name, n, v.Name))
		switch {
		case n == 0:
			fmt.Fprintf(stderr, "warning: %s: views.%s selects no capability of this gateway (fine if it names other gateways' zones or devices)\n", v.Pos, v.Name)
		case n+1 > maxViewTools:
			fmt.Fprintf(stderr, "warning: %s: views.%s lists %d tools here, more than proMCP's advice of %d per server; cut it by zone or workflow phase\n", v.Pos, v.Name, n+1, maxViewTools)
		}
	}
	fmt.Fprintf(stdout, "views: %s\n", strings.Join(parts, ", "))
}
