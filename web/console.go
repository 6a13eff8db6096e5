package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/approval"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/promcp"
)

// The operator's console: GET / rendered on the server (every section,
// readable without script), kept live by console.js, which polls
// /console/live every second for the values and for each section's
// revision and swaps in a section whose revision changed. Decisions
// (approve, deny, acknowledge, sign out) are plain HTML forms behind the
// boundary's CSRF check; they answer with a redirect back to the console
// (post/redirect/get) and a one-shot notice, or with the console and the
// refusal at the refusal's status.

//go:embed console.html login.html console.js console.css
var consoleFS embed.FS

// consoleCSP allows this origin's script and style files only: no inline
// script or style, nothing from another origin, forms only to this origin.
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// consoleSections are the swappable sections in page order: alarms and
// approvals first, as an HMI's alarm banner heads its screens.
var consoleSections = []string{"alarms", "approvals", "values", "trends", "failsafe", "interlocks", "recent", "checks"}

var consoleTmpl = template.Must(template.New("").Funcs(template.FuncMap{
	"sections": func() []string { return consoleSections },
	"fmtv":     fmtValue,
	"ago":      agoText,
	"clock":    func(t time.Time) string { return t.UTC().Format("15:04:05Z") },
	"iso":      func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
	"short":    func(s string) string { s = strings.TrimPrefix(s, "sha256:"); return s[:min(len(s), 12)] },
}).ParseFS(consoleFS, "console.html", "login.html"))

// consoleView is what the console's templates render.
type consoleView struct {
	Status
	Caller      node.Caller
	SignedIn    bool // the caller came with a session (a sign-out button)
	CSRF        string
	CanApprove  bool // operator or above: the approvals section
	CanAck      bool
	Approvals   []approvalView
	Values      []valueView
	Trends      []trendView
	Recent      []recentView
	Flash       string
	Error       string
	Sections    map[string]template.HTML
	Revs        map[string]string
	RequiresCrd bool
}

type valueView struct {
	node.CapabilityStatus
	Display string
	AgeText string
	StaleMS int64
	Stale   bool
}

type approvalView struct {
	approval.Request
	Current string // the capability's value now: the "previous value" the request would replace
}

type trendView struct {
	Tool  string
	Unit  string
	Chart template.HTML
}

type recentView struct {
	At, Tool, Status, Caller, Requested, Applied, Reason, Code string
	Time                                                       time.Time
}

// fmtValue renders a value for people ("—" for none).
func fmtValue(v any) string {
	if v == nil {
		return "—"
	}
	return promcp.FormatValue(v)
}

// agoText says how old something of age ms is, as people read it; the
// same words as console.js's ago().
func agoText(ms int64) string {
	switch s := ms / 1000; {
	case ms < 1000:
		return "just now"
	case s < 60:
		return fmt.Sprintf("%d s ago", s)
	case s < 3600:
		return fmt.Sprintf("%d min ago", s/60)
	case s < 86400:
		return fmt.Sprintf("%d h ago", s/3600)
	default:
		return fmt.Sprintf("%d d ago", s/86400)
	}
}

// consoleView gathers what the console shows to caller c.
func (s *Server) consoleView(r *http.Request, c node.Caller, ss *session, csrf string, now time.Time) *consoleView {
	st := s.status()
	v := &consoleView{Status: st, Caller: c, SignedIn: ss != nil, CSRF: csrf, RequiresCrd: s.credentialsRequired()}
	level := policy.RoleLevel(c.Role)
	v.CanApprove = !v.RequiresCrd || level >= policy.RoleLevel("operator")
	v.CanAck = s.opts.Alarms != nil && (!v.RequiresCrd || level >= policy.RoleLevel("operator"))
	// Unacknowledged alarms first, as an alarm list shows them.
	slices.SortStableFunc(v.Alarms, func(a, b alarms.Active) int {
		return boolOrder(a.AckedBy != "", b.AckedBy != "")
	})
	current := map[string]string{}
	for _, cs := range st.Capabilities {
		vv := valueView{CapabilityStatus: cs, Display: fmtValue(cs.Value), StaleMS: s.staleAfter(cs.Tool).Milliseconds()}
		if !cs.Timestamp.IsZero() {
			vv.AgeMS = now.Sub(cs.Timestamp).Milliseconds()
			vv.AgeText = agoText(vv.AgeMS)
		}
		vv.Stale = cs.Quality == "stale" || cs.Quality == "degraded" || (!cs.Timestamp.IsZero() && vv.AgeMS > vv.StaleMS)
		v.Values = append(v.Values, vv)
		current[manifestName(cs.Tool)] = vv.Display
	}
	if v.CanApprove && s.n.Approvals() != nil && s.opts.Guard != nil {
		for _, req := range s.n.Approvals().List() {
			v.Approvals = append(v.Approvals, approvalView{Request: req, Current: current[manifestName(req.Tool)]})
		}
	}
	charts := s.charts(now)
	for _, cs := range st.Capabilities {
		if ch, ok := charts[cs.Tool]; ok {
			v.Trends = append(v.Trends, trendView{Tool: cs.Tool, Unit: cs.Unit, Chart: ch})
		}
	}
	v.Recent = recentViews(s.n.RecentActuationsBy())
	if ss != nil {
		v.Flash = s.sessions.takeFlash(sessionID(r))
	}
	return v
}

func boolOrder(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}

// manifestName is a tool's capability name (read_x and do_x both name x).
func manifestName(tool string) string {
	return strings.TrimPrefix(strings.TrimPrefix(tool, "read_"), "do_")
}

func recentViews(list []node.Actuation) []recentView {
	out := make([]recentView, 0, len(list))
	for _, a := range list {
		var d struct {
			Timestamp time.Time `json:"timestamp"`
			Tool      string    `json:"capability"`
			Status    string    `json:"status"`
			Requested any       `json:"requested_value"`
			Applied   any       `json:"applied_value"`
			Reason    string    `json:"reason"`
			Code      string    `json:"code"`
		}
		_ = json.Unmarshal(a.Answer, &d)
		out = append(out, recentView{Time: d.Timestamp, At: d.Timestamp.UTC().Format("15:04:05Z"), Tool: d.Tool, Status: d.Status, Caller: a.Caller,
			Requested: fmtValue(d.Requested), Applied: fmtValue(d.Applied), Reason: d.Reason, Code: d.Code})
	}
	return out
}

// render fills v.Sections and v.Revs: each section's markup and a digest
// of it, which console.js compares to know what to swap.
func (v *consoleView) render() error {
	v.Sections, v.Revs = map[string]template.HTML{}, map[string]string{}
	for _, name := range consoleSections {
		var b bytes.Buffer
		if err := consoleTmpl.ExecuteTemplate(&b, "section-"+name, v); err != nil {
			return err
		}
		rev := b.Bytes()
		if name == "values" {
			// Values and ages change in place (console.js); the section is
			// swapped only when the capabilities themselves change.
			rev = nil
			for _, x := range v.Values {
				rev = append(append(rev, x.Tool...), 0)
			}
		}
		sum := sha256.Sum256(rev)
		v.Sections[name], v.Revs[name] = template.HTML(b.String()), hex.EncodeToString(sum[:8]) // markup our templates escaped
	}
	return nil
}

// csrfFor is the token the forms of r's page carry: the session's, or the
// browser's sessionless double-submit token.
func csrfFor(w http.ResponseWriter, r *http.Request, ss *session) string {
	if ss != nil {
		return ss.csrf
	}
	return preCSRF(w, r)
}

// serveConsole is GET /: the console.
func (s *Server) serveConsole(w http.ResponseWriter, r *http.Request) {
	s.renderConsole(w, r, http.StatusOK, "")
}

// renderConsole answers with the console at status, with errMsg as its
// alert (a refused decision).
func (s *Server) renderConsole(w http.ResponseWriter, r *http.Request, status int, errMsg string) {
	c, ss := s.consoleCaller(r)
	v := s.consoleView(r, c, ss, csrfFor(w, r, ss), time.Now())
	v.Error = errMsg
	if err := v.render(); err != nil {
		s.log.Error("console", "err", err)
		http.Error(w, "console: "+err.Error(), http.StatusInternalServerError)
		return
	}
	writeHTML(w, status, "console.html", v, s)
}

func writeHTML(w http.ResponseWriter, status int, name string, v any, s *Server) {
	var b bytes.Buffer
	if err := consoleTmpl.ExecuteTemplate(&b, name, v); err != nil {
		s.log.Error("console", "template", name, "err", err)
		http.Error(w, "console: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", consoleCSP)
	// Chromium sends "Origin: null" with a form post from a no-referrer
	// page, which the boundary refuses (an opaque origin); same-origin
	// still sends no referrer to any other origin.
	w.Header().Set("Referrer-Policy", "same-origin")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

// consoleCaller is who the boundary authenticated for r, and their session.
func (s *Server) consoleCaller(r *http.Request) (node.Caller, *session) {
	c, err := s.authenticate(r.Header)
	if err != nil {
		c = node.Caller{ID: anonymous, Role: "none"}
	}
	if r.Header.Get("Authorization") != "" {
		return c, nil
	}
	if ss, ok := s.sessionCaller(r); ok {
		return c, &ss
	}
	return c, nil
}

// liveValue is one capability in /console/live.
type liveValue struct {
	Tool      string    `json:"tool"`
	Display   string    `json:"display"`
	Unit      string    `json:"unit,omitempty"`
	Quality   string    `json:"quality"`
	Timestamp time.Time `json:"timestamp,omitzero"`
	StaleMS   int64     `json:"stale_ms"`
	Error     string    `json:"error,omitempty"`
}

// serveLive is GET /console/live: the values (read through the node's
// read path where the cache is older than the console's floor, see
// refreshValues) and each section's revision.
func (s *Server) serveLive(w http.ResponseWriter, r *http.Request) {
	s.refreshValues(r.Context())
	c, ss := s.consoleCaller(r)
	now := time.Now()
	v := s.consoleView(r, c, ss, csrfFor(w, r, ss), now)
	if ss != nil && v.Flash != "" {
		s.sessions.setFlash(sessionID(r), v.Flash) // the page shows it, not the poll
	}
	if err := v.render(); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"error": err.Error()})
		return
	}
	vals := make([]liveValue, 0, len(v.Values))
	for _, x := range v.Values {
		vals = append(vals, liveValue{Tool: x.Tool, Display: x.Display, Unit: x.Unit, Quality: x.Quality, Timestamp: x.Timestamp, StaleMS: x.StaleMS, Error: x.Error})
	}
	writeJSON(w, http.StatusOK, map[string]any{"now": now.UTC(), "values": vals, "revs": v.Revs})
}

// serveAsset serves the console's script and style from the binary.
func serveAsset(name, ctype string) http.HandlerFunc {
	b, err := consoleFS.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", ctype)
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(b)
	}
}

// serveApprovalForm is POST /console/approvals/{id}: the console's Approve
// and Deny buttons, through the same decision as POST /approvals/{id}.
func (s *Server) serveApprovalForm(w http.ResponseWriter, r *http.Request) {
	approver, err := s.authenticate(r.Header)
	if err != nil {
		http.Error(w, "Unauthorized: "+err.Error(), http.StatusUnauthorized)
		return
	}
	decision := r.PostFormValue("decision")
	if decision != "approve" && decision != "deny" {
		s.renderConsole(w, r, http.StatusBadRequest, "choose Approve or Deny")
		return
	}
	id := r.PathValue("id")
	status, msg, d := s.decide(approver, id, decision, strings.TrimSpace(r.PostFormValue("reason")))
	if status != http.StatusOK {
		s.renderConsole(w, r, status, msg)
		return
	}
	note := fmt.Sprintf("%s %s of %s = %s for %s.", titleCase(d.State), id, d.Tool, fmtValue(d.Value), d.Caller)
	if d.State == approval.StateApproved {
		note += " The caller's repeated call now runs it (once, before " + d.GrantExpiresAt.UTC().Format("15:04:05Z") + ")."
	}
	s.redirectWith(w, r, note, "#sec-approvals")
}

// serveAlarmAck is POST /console/alarms/ack: acknowledge one raised alarm.
func (s *Server) serveAlarmAck(w http.ResponseWriter, r *http.Request) {
	caller, err := s.authenticate(r.Header)
	if err != nil {
		http.Error(w, "Unauthorized: "+err.Error(), http.StatusUnauthorized)
		return
	}
	tool, kind := r.PostFormValue("tool"), r.PostFormValue("kind")
	a, err := s.opts.Alarms.Acknowledge(tool, kind, caller.ID, time.Now())
	if err != nil {
		s.renderConsole(w, r, http.StatusConflict, tool+" "+kind+": "+err.Error())
		return
	}
	s.auditApproval(&audit.Record{Event: "alarm_acknowledged", Tool: tool, Caller: caller.ID, Credentials: caller.Credentials,
		Data: map[string]any{"kind": kind, "raised_at": a.Since, "role": caller.Role}})
	s.redirectWith(w, r, "Acknowledged "+kind+" on "+tool+".", "#sec-alarms")
}

func titleCase(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// redirectWith sends the browser back to the console with a notice.
func (s *Server) redirectWith(w http.ResponseWriter, r *http.Request, note, anchor string) {
	if id := sessionID(r); id != "" {
		s.sessions.setFlash(id, note)
	}
	http.Redirect(w, r, "/"+anchor, http.StatusSeeOther)
}
