package gate

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// l1HealthTTL is how long the gate trusts what it last learned about the
// P0 service (from a real call or a probe) before a dry run probes again.
const l1HealthTTL = 5 * time.Second

// l1ProbeTimeout bounds the dry run's health probe: can_do has a budget of
// its own, and a P0 service that cannot answer /health this fast is of no
// use to a decision either.
const l1ProbeTimeout = 250 * time.Millisecond

// l1Health is what the gate knows of the P0 service, so that a dry run
// (can_do) says what a real call would meet: the configured fail_closed
// decision when P0 is unavailable, not a hopeful "ask".
type l1Health struct {
	mu      sync.Mutex
	known   bool
	at      time.Time
	up      bool
	cause   string
	probing chan struct{} // closed when the probe under way ends
}

// note records what a real call learned.
func (h *l1Health) note(up bool, cause string) {
	h.mu.Lock()
	h.known, h.at, h.up, h.cause = true, time.Now(), up, cause
	h.mu.Unlock()
}

// l1Up reports whether P0 is usable: from a recent real call or probe, or
// else from one GET {server}/health, shared by concurrent callers and
// bounded by l1ProbeTimeout and ctx.
func (g *Gate) l1Up(ctx context.Context) (bool, string) {
	h := &g.health
	for {
		h.mu.Lock()
		if h.known && time.Since(h.at) < l1HealthTTL {
			up, cause := h.up, h.cause
			h.mu.Unlock()
			return up, cause
		}
		if h.probing == nil {
			done := make(chan struct{})
			h.probing = done
			h.mu.Unlock()
			up, cause := g.probeL1(ctx)
			h.note(up, cause)
			h.mu.Lock()
			h.probing = nil
			h.mu.Unlock()
			close(done)
			return up, cause
		}
		wait := h.probing
		h.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return false, "P0 service health unknown: " + ctx.Err().Error()
		}
	}
}

func (g *Gate) probeL1(ctx context.Context) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, min(l1ProbeTimeout, time.Duration(g.cfg.L1.TimeoutMS)*time.Millisecond))
	defer cancel()
	url := strings.TrimSuffix(g.endpoint, "/v1/systemone") + "/health"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, "P0 health request: " + err.Error()
	}
	req.Header.Set("User-Agent", g.toolID)
	resp, err := g.client.Do(req)
	if err != nil {
		f := classifyTransport(ctx, err, l1ProbeTimeout, false)
		return false, f.cause
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return false, "P0 service answered /health with HTTP " + resp.Status
	}
	return true, ""
}
