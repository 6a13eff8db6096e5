package discovery

import (
	"context"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"time"
)

// Self is this gateway as the join decision sees it.
type Self struct {
	ID       string // device id
	MeshAddr string // "ip:port" peers dial
	Label    string // mesh label
	// Link, when set, are the interface's subnets: a gateway whose
	// address is outside them is not joined (an answer cannot send the
	// mesh to dial off the link).
	Link []*net.IPNet
}

// JoinTargets decides which found gateways to join: those with a mesh
// port, not this gateway (by id or by mesh address), of the same mesh
// label, on the link (Self.Link), not already live members, each once
// (by id, then by address).
// The result is "id/ip:port", sorted.
func JoinTargets(found []Gateway, self Self, live map[string]bool) []string {
	byID := map[string]bool{}
	byAddr := map[string]bool{}
	var out []string
	sorted := append([]Gateway(nil), found...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].DeviceID < sorted[j].DeviceID })
	for _, g := range sorted {
		addr := g.MeshAddr()
		switch {
		case addr == "", g.DeviceID == self.ID, addr == self.MeshAddr,
			g.MeshLabel != "" && g.MeshLabel != self.Label,
			live[g.DeviceID], byID[g.DeviceID], byAddr[addr], !onLink(self.Link, g.Addr):
			continue
		}
		byID[g.DeviceID], byAddr[addr] = true, true
		out = append(out, g.DeviceID+"/"+addr)
	}
	return out
}

func onLink(link []*net.IPNet, ip net.IP) bool {
	if len(link) == 0 {
		return true
	}
	for _, n := range link {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

// Mesh is what discovery needs of the mesh.
type Mesh interface {
	// Live is the set of member names alive or suspect, self included.
	Live() map[string]bool
	// Join contacts the "name/host:port" targets and returns how many
	// answered.
	Join(targets []string) int
}

// BrowseFunc browses once; Browse on an interface in physd.
type BrowseFunc func(ctx context.Context) ([]Gateway, error)

// Discoverer browses at start and every Interval, and joins the mesh to
// the gateways found that are not members yet.
type Discoverer struct {
	Self     Self
	Mesh     Mesh
	Browse   BrowseFunc
	Interval time.Duration
	// Healing, when set and true, shortens the interval to HealingInterval
	// (PhysMCP §9: the scout interval drops to 5 s while a partition is
	// suspected), so a gateway back on the link is found sooner.
	Healing func() bool
	Logger  *slog.Logger

	mu    sync.Mutex
	found map[string]Found
}

// Found is a gateway discovery has seen, for /status.
type Found struct {
	Gateway
	LastSeen time.Time `json:"last_seen"`
	// JoinTried is when discovery last handed it to the mesh to join
	// (zero: never needed, e.g. it joined this gateway first).
	JoinTried time.Time `json:"join_tried,omitzero"`
}

// forgetAfter is how long a gateway that no longer answers stays in
// Found: ten browse intervals, at least ForgetAfter.
func (d *Discoverer) forgetAfter() time.Duration { return max(10*d.Interval, ForgetAfter) }

// ForgetAfter is the least time a silent gateway stays listed.
const ForgetAfter = 5 * time.Minute

// Run browses until ctx ends. Each browse is bounded by its own
// deadline (the BrowseFunc's wait); a failed browse is logged and retried
// at the next interval.
func (d *Discoverer) Run(ctx context.Context) {
	log := d.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for {
		start := time.Now()
		d.round(ctx, log)
		wait := d.Interval
		if d.Healing != nil && d.Healing() {
			wait = min(wait, HealingInterval)
		}
		t := time.NewTimer(max(wait-time.Since(start), 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// HealingInterval is the browse interval while Healing says so.
const HealingInterval = 5 * time.Second

func (d *Discoverer) round(ctx context.Context, log *slog.Logger) {
	gws, err := d.Browse(ctx)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		log.Warn("mdns: browse failed; will browse again", "err", err.Error(), "in", d.Interval.String())
		return
	}
	now := time.Now()
	d.mu.Lock()
	if d.found == nil {
		d.found = map[string]Found{}
	}
	for _, g := range gws {
		if g.DeviceID == d.Self.ID {
			continue
		}
		f := d.found[g.DeviceID]
		f.Gateway, f.LastSeen = g, now
		d.found[g.DeviceID] = f
	}
	for id, f := range d.found {
		if now.Sub(f.LastSeen) > d.forgetAfter() {
			delete(d.found, id)
		}
	}
	d.mu.Unlock()
	targets := JoinTargets(gws, d.Self, d.Mesh.Live())
	if len(targets) == 0 {
		return
	}
	n := d.Mesh.Join(targets)
	if n > 0 {
		log.Info("mdns: joined gateways found by mDNS", "targets", targets, "answered", n)
	} else { // the mesh logs why (a wrong key or label shows as a decrypt error or EOF)
		log.Debug("mdns: no gateway found by mDNS answered the join", "targets", targets)
	}
	d.mu.Lock()
	for _, t := range targets {
		id, _, _ := strings.Cut(t, "/")
		if f, ok := d.found[id]; ok {
			f.JoinTried = now
			d.found[id] = f
		}
	}
	d.mu.Unlock()
}

// Found lists the gateways seen, by id.
func (d *Discoverer) Found() []Found {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Found, 0, len(d.found))
	for _, f := range d.found {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].DeviceID < out[j].DeviceID })
	return out
}

// hostPort is net.JoinHostPort for an IP and a port.
func hostPort(ip net.IP, port int) string { return net.JoinHostPort(ip.String(), itoa(port)) }
