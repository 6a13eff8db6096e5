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

// MaxClientTools is the most tools the MCP clients agents run in take in
// one list (Cursor 40; Windsurf 50, Claude Desktop slows past it): a
// default endpoint that lists more is cut by families, views or expose.
const MaxClientTools = 40

// WriteTools prints (for `physd validate`) how many tools the default
// endpoint (/mcp, and stdio without --view) lists, and warns when that is
// more than MCP clients take, saying how to cut it. The count is the
// largest list, a caller whose role may run every do_; with the default
// --families auto the endpoint serves families when the mesh is on.
func WriteTools(m *manifest.Manifest, stdout, stderr io.Writer) {
	families := m.Network.Mesh.Enabled
	n := m.ToolCount(nil, families)
	unexposed := len(m.Capabilities) - len(m.ExposedCapabilities())
	mode := "instances (no mesh: --families auto serves no families)"
	if families {
		mode = "families (the mesh is on: --families auto serves them)"
	}
	line := fmt.Sprintf("tools: /mcp lists %d tools + can_do, as %s", n, mode)
	if unexposed > 0 {
		line += fmt.Sprintf("; %d capabilities are observed but not exposed", unexposed)
	}
	fmt.Fprintln(stdout, line)
	if n+1 <= MaxClientTools {
		return
	}
	var fixes []string
	if f := m.ToolCount(nil, true); !families && f < n {
		fixes = append(fixes, fmt.Sprintf("serve families (physd run --families on: %d tools with can_do)", f+1))
	}
	fixes = append(fixes, "give capabilities of one type a family: (one tool with a zone argument)",
		"cut the site into views: (each served at /mcp/<view>)",
		"keep points agents need not call off the tool surface with expose: false (defaults: {expose: false} makes that the rule and expose: true the exception); they stay observed")
	fmt.Fprintf(stderr, "warning: %s: the default endpoint /mcp lists %d tools with can_do, more than the %d MCP clients such as Cursor accept; fix: %s\n",
		m.Path, n+1, MaxClientTools, strings.Join(fixes, ", or "))
}

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
		n := m.ToolCount(v, v.Families != nil && *v.Families)
		parts = append(parts, fmt.Sprintf("%s (%d tools + can_do at /mcp/%s)", v.Name, n, v.Name))
		switch {
		case n == 0 && !selectsAny(m, v):
			fmt.Fprintf(stderr, "warning: %s: views.%s selects no capability of this gateway (fine if it names other gateways' zones or devices)\n", v.Pos, v.Name)
		case n+1 > maxViewTools:
			fmt.Fprintf(stderr, "warning: %s: views.%s lists %d tools here, more than proMCP's advice of %d per server; cut it by zone or workflow phase\n", v.Pos, v.Name, n+1, maxViewTools)
		}
	}
	fmt.Fprintf(stdout, "views: %s\n", strings.Join(parts, ", "))
}

// selectsAny reports whether v selects a capability of m, exposed or not
// (a view of unexposed points serves their resources).
func selectsAny(m *manifest.Manifest, v *manifest.View) bool {
	for _, c := range m.Capabilities {
		if v.Match(m.Subject(c)) {
			return true
		}
	}
	return false
}
