package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"
)

// maxControlBody bounds POST bodies of the control handler.
const maxControlBody = 64 << 10

// ControlState is the JSON the control handler returns for GET / and after
// a successful POST.
type ControlState struct {
	Signals map[string]float64 `json:"signals"`
	Stats   Stats              `json:"stats"`
	Faults  map[string]Fault   `json:"faults"`
}

// FaultRequest is the body of POST /fault.
type FaultRequest struct {
	Point   string  `json:"point"`
	Mode    string  `json:"mode"`
	DelayMS int64   `json:"delay_ms"`
	Noise   float64 `json:"noise"`
}

// ControlHandler serves the plant's development controls:
//
//	GET  /       {"signals": Snapshot(), "stats": Stats(), "faults": Faults()}
//	POST /fault  {"point":"zone_a.temperature","mode":"offline|stuck|noisy|slow|none","delay_ms":0,"noise":0}
//	POST /clear  clears every fault
//
// POSTs answer with the new state (as GET /). Bad input is 400 with
// {"error": "..."}; bodies over 64 KiB are 413; a POST whose Content-Type
// is not application/json is 415 (a browser page cannot send that
// cross-site without a CORS preflight, so a plain HTML form or a
// no-cors fetch can never inject a fault). Paths are matched after any
// prefix the caller strips, with or without the leading slash, so both
// http.StripPrefix("/sim/plant", h) and http.StripPrefix("/sim/plant/", h)
// work. The handler does not authenticate: physd mounts it (with
// --sim-control only) behind its HTTP boundary, which checks Host, Origin
// and the caller's role; mount it only in development.
func (p *Plant) ControlHandler() http.Handler {
	return http.HandlerFunc(p.serveControl)
}

func (p *Plant) state() ControlState {
	return ControlState{Signals: p.Snapshot(), Stats: p.Stats(), Faults: p.Faults()}
}

func (p *Plant) serveControl(w http.ResponseWriter, r *http.Request) {
	path := strings.Trim(r.URL.Path, "/")
	switch path {
	case "":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, "GET, HEAD")
			return
		}
		writeJSON(w, http.StatusOK, p.state())
	case "fault":
		if !jsonPost(w, r) {
			return
		}
		var req FaultRequest
		if status, err := decodeBody(w, r, &req); err != nil {
			writeError(w, status, err.Error())
			return
		}
		if req.Point == "" {
			writeError(w, http.StatusBadRequest, `"point" is required (a point name, or "*" for all)`)
			return
		}
		mode, err := ParseFaultMode(req.Mode)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		if req.DelayMS < 0 || req.DelayMS > int64(time.Hour/time.Millisecond) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf(`"delay_ms" must be between 0 and 3600000, got %d`, req.DelayMS))
			return
		}
		f := Fault{Mode: mode, Delay: time.Duration(req.DelayMS) * time.Millisecond, Noise: req.Noise}
		if err := p.SetFault(req.Point, f); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, p.state())
	case "clear":
		if !jsonPost(w, r) {
			return
		}
		p.ClearFaults()
		writeJSON(w, http.StatusOK, p.state())
	default:
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such control %q (have GET /, POST /fault, POST /clear)", "/"+path))
	}
}

// jsonPost admits a POST sent as application/json: 405 for another
// method, 415 for another media type.
func jsonPost(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, "POST")
		return false
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "send Content-Type: application/json")
		return false
	}
	return true
}

// decodeBody decodes exactly one JSON object with no unknown fields.
func decodeBody(w http.ResponseWriter, r *http.Request, out any) (int, error) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxControlBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(out)
	if err == nil {
		switch _, terr := dec.Token(); {
		case terr == io.EOF:
		case terr != nil:
			err = terr
		default:
			err = errors.New("trailing data after the JSON object")
		}
	}
	if err == nil {
		return 0, nil
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return http.StatusRequestEntityTooLarge, fmt.Errorf("body exceeds %d bytes", maxControlBody)
	}
	if errors.Is(err, io.EOF) {
		return http.StatusBadRequest, errors.New("empty body: want a JSON object")
	}
	return http.StatusBadRequest, fmt.Errorf("bad JSON: %v", err)
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeError(w, http.StatusMethodNotAllowed, "method not allowed; use "+allow)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
