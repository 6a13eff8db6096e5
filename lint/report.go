package lint

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// PromcpVersion is the proMCP spec version the rules implement.
const PromcpVersion = "0.4.0"

// RuntimeResult is one runtime check: a call and what its answer showed.
type RuntimeResult struct {
	Tool     string    `json:"tool"`
	Check    string    `json:"check"`
	Summary  string    `json:"summary"`
	Findings []Finding `json:"findings"`
}

// Summary counts findings. Pass is false with any error, or with any
// warning under --strict (set by Strict).
type Summary struct {
	Errors   int  `json:"errors"`
	Warnings int  `json:"warnings"`
	Info     int  `json:"info"`
	Pass     bool `json:"pass"`
}

// Report is the result of a lint: promcp-lint's JSON shape plus the target
// and the runtime checks.
type Report struct {
	PromcpVersion   string          `json:"promcp_version"`
	Target          string          `json:"target,omitempty"`
	Transport       string          `json:"transport,omitempty"` // http, stdio or file
	ProtocolVersion string          `json:"protocol_version,omitempty"`
	ServerName      string          `json:"server_name,omitempty"`
	ServerVersion   string          `json:"server_version,omitempty"`
	Server          []Finding       `json:"server"`
	Tools           []ToolResult    `json:"tools"`
	Runtime         []RuntimeResult `json:"runtime"`
	Summary         Summary         `json:"summary"`
}

func (r *Report) all() []Finding {
	out := append([]Finding(nil), r.Server...)
	for _, t := range r.Tools {
		out = append(out, t.Findings...)
	}
	for _, rt := range r.Runtime {
		out = append(out, rt.Findings...)
	}
	return out
}

// finish recomputes the summary (non-strict).
func (r *Report) finish() {
	s := Summary{}
	for _, f := range r.all() {
		switch f.Severity {
		case SevError:
			s.Errors++
		case SevWarning:
			s.Warnings++
		case SevInfo:
			s.Info++
		}
	}
	s.Pass = s.Errors == 0
	r.Summary = s
}

// Strict applies --strict: warnings fail too.
func (r *Report) Strict(strict bool) {
	r.finish()
	if strict && r.Summary.Warnings > 0 {
		r.Summary.Pass = false
	}
}

// ExitCode is 0 on pass, 1 with findings that fail.
func (r *Report) ExitCode() int {
	if r.Summary.Pass {
		return 0
	}
	return 1
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

var icons = map[Severity]string{SevError: "✗", SevWarning: "⚠", SevInfo: "·"}

func writeFinding(w io.Writer, indent string, f Finding) {
	fmt.Fprintf(w, "%s%s [%s] %s\n", indent, icons[f.Severity], f.Code, f.Message)
}

// WriteText writes the human report, in promcp-lint's style: ✓ for a clean
// tool or check, ✗ error, ⚠ warning, · info, then a summary.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "physd lint  proMCP v%s — %s", r.PromcpVersion, r.Target)
	var about []string
	if r.Transport != "" {
		about = append(about, r.Transport)
	}
	if r.ProtocolVersion != "" {
		about = append(about, "MCP "+r.ProtocolVersion)
	}
	if r.ServerName != "" {
		about = append(about, strings.TrimSpace(r.ServerName+" "+r.ServerVersion))
	}
	about = append(about, fmt.Sprintf("%d tools", len(r.Tools)))
	fmt.Fprintf(w, " (%s)\n\n", strings.Join(about, ", "))

	fmt.Fprintln(w, "Server")
	if len(r.Server) == 0 {
		fmt.Fprintln(w, "  ✓ server-level rules S001–S005")
	}
	for _, f := range r.Server {
		writeFinding(w, "  ", f)
	}
	fmt.Fprintln(w, "\nTools")
	for _, t := range r.Tools {
		if len(t.Findings) == 0 {
			fmt.Fprintf(w, "  ✓ %s\n", t.Name)
			continue
		}
		fmt.Fprintf(w, "  %s %s\n", worst(t.Findings), t.Name)
		for _, f := range t.Findings {
			writeFinding(w, "      ", f)
		}
	}
	if len(r.Runtime) > 0 {
		fmt.Fprintln(w, "\nRuntime")
		for _, rt := range r.Runtime {
			icon := "✓"
			if len(rt.Findings) > 0 {
				icon = worst(rt.Findings)
			}
			fmt.Fprintf(w, "  %s %s  %s: %s\n", icon, rt.Tool, rt.Check, rt.Summary)
			for _, f := range rt.Findings {
				writeFinding(w, "      ", f)
			}
		}
	}
	s := r.Summary
	verdict := "pass"
	if !s.Pass {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "\n  %s %d error(s)  %d warning(s)  %d info — %s\n", map[bool]string{true: "✓", false: "✗"}[s.Pass], s.Errors, s.Warnings, s.Info, verdict)
}

func worst(fs []Finding) string {
	w := SevInfo
	for _, f := range fs {
		if f.Severity == SevError {
			return icons[SevError]
		}
		if f.Severity == SevWarning {
			w = SevWarning
		}
	}
	return icons[w]
}
