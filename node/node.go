// Package node is the proMCP node: the read path with its cache, the do
// pipeline with its idempotency ledger and audit, and the local can_do. It
// knows nothing about MCP or the mesh: mcpserver turns MCP calls into node
// calls, and the mesh carries node calls between machines.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/physd/physd/approval"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/store"
)

// Config builds a Node.
type Config struct {
	Manifest *manifest.Manifest
	Store    *store.Store
	Audit    AuditLog
	// Guard is the policy and gate step of the do_ path (docs/design.md
	// "The actuation path"). Nil means NoPolicy: only the manifest is enforced, and every
	// do_ response says that no policy is configured.
	Guard  Guard
	Logger *slog.Logger
	// Remote, when set, extends can_do to the other nodes of the site.
	Remote Remote
	// OnDeviceError is called for every failed device access (metrics).
	OnDeviceError func(bus string, err error)
	// Ledger bounds the idempotency ledger (DefaultLedger when zero).
	Ledger LedgerConfig
	// Approvals is the approval authority: two-person requests are
	// registered in it and every approval (a grant, a decision, a round)
	// is redeemed through it on the do_ path. Nil: no approval can be
	// given, and a call that needs one is refused.
	Approvals *approval.Authority
}

// LedgerConfig bounds the idempotency ledger. A key younger than
// store.MinKeep (24 h, proMCP §9.2) is always kept; older keys go after
// Window, or earlier, oldest first, while the ledger is past MaxKeys or
// MaxBytes.
type LedgerConfig struct {
	Window     time.Duration
	MaxKeys    int64
	MaxBytes   int64
	PruneEvery time.Duration // how often the running node prunes
}

// DefaultLedger is the ledger's bound: a day of keys, at most 100 000 keys
// or 64 MiB (≈ 600 bytes a key), pruned every minute.
func DefaultLedger() LedgerConfig {
	return LedgerConfig{Window: 24 * time.Hour, MaxKeys: 100_000, MaxBytes: 64 << 20, PruneEvery: time.Minute}
}

// AuditLog is the audit trail the node records every do_ answer in
// (*audit.Log). Appends are fsynced before they return: the do_ path rests
// on that (docs/design.md "The actuation path").
type AuditLog interface {
	AppendFunc(build func(seq uint64) (*audit.Record, error)) (uint64, error)
	ScanSince(since time.Time, fn func(audit.Record) bool) error
}

// Node serves one device's capabilities.
type Node struct {
	cur      atomic.Pointer[binding] // the manifest in force, bound (binding.go)
	reloadMu sync.Mutex              // one Reload at a time
	// retiring are the buses reloads retired (removed or changed) that
	// have not closed yet (under reloadMu): a bus of their driver is
	// opened only once they closed.
	retiring map[*busRef]bool
	store    *store.Store
	audit    AuditLog
	guard    Guard
	log      *slog.Logger
	approval *approval.Authority

	ledger LedgerConfig

	inflightMu sync.Mutex
	inflight   map[string]chan struct{} // idempotency key -> closed when done

	recent recentLog // last do_ answers, for /status
	remote Remote    // the mesh, or nil

	// OnDeviceError, when set, is told about every failed device access
	// (for metrics); it must not block.
	onDeviceErr func(bus string, err error)

	auditErr atomic.Pointer[error] // the last audit append failed: refuse actuations
	storeErr atomic.Pointer[error] // the last ledger write failed (/readyz)

	lifeMu    sync.Mutex
	closed    bool           // shutdown began: no device step starts
	draining  bool           // the process is stopping (Drain): no device step starts
	actuating sync.WaitGroup // device steps under way
	stopPrune chan struct{}
	pruned    chan struct{}

	born time.Time // when Open began: the liveness marks count from here (liveness.go)

	fs failSafe    // safe states and leases (safe.go, lease.go)
	rr remoteReads // the interlocks' readings of other gateways (remotereads.go)
	bp bypasses    // the interlocks' bypasses (bypass.go)

	obs      stream         // the observation stream (observe.go)
	stopPoll chan struct{}  // closed by Close: background polls end
	polls    sync.WaitGroup // background polls running
	mons     monitors       // capabilities the device monitors (monitor.go)
}

// Open opens every bus the manifest names, binds every capability to its
// point and recovers actuations a crash left without an outcome. A bus that
// fails to open does not stop the node: its capabilities read quality error
// and Ready names it.
func Open(ctx context.Context, cfg Config) (*Node, error) {
	if cfg.Manifest == nil || cfg.Store == nil || cfg.Audit == nil {
		return nil, errors.New("node: manifest, store and audit are required")
	}
	n := &Node{
		born:        time.Now(),
		store:       cfg.Store,
		audit:       cfg.Audit,
		guard:       cfg.Guard,
		approval:    cfg.Approvals,
		log:         cfg.Logger,
		ledger:      withLedgerDefaults(cfg.Ledger),
		inflight:    map[string]chan struct{}{},
		onDeviceErr: cfg.OnDeviceError,
		remote:      cfg.Remote,
		stopPrune:   make(chan struct{}),
		pruned:      make(chan struct{}),
		stopPoll:    make(chan struct{}),
		fs:          newFailSafe(),
		rr:          remoteReads{last: map[string]remoteReading{}, inFlight: map[string]bool{}},
		bp:          bypasses{m: map[string]*Bypass{}},
	}
	if n.guard == nil {
		n.guard = NoPolicy{}
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	b, _, err := n.bind(ctx, cfg.Manifest, nil, nil)
	if err != nil {
		return nil, err
	}
	n.cur.Store(b)
	if err := n.recoverPending(ctx); err != nil {
		n.closeBuses()
		return nil, fmt.Errorf("ledger recovery: %w", err)
	}
	n.prune()
	go n.pruneLoop()
	n.startPolls(b)
	if err := n.startFailSafe(ctx); err != nil {
		_ = n.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	n.polls.Add(3)
	go n.watchBuses()
	go n.superviseInterlocks()
	go n.pollRemoteReadings()
	return n, nil
}

func withLedgerDefaults(c LedgerConfig) LedgerConfig {
	d := DefaultLedger()
	if c.Window <= 0 {
		c.Window = d.Window
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = d.MaxKeys
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = d.MaxBytes
	}
	if c.PruneEvery <= 0 {
		c.PruneEvery = d.PruneEvery
	}
	return c
}

// pruneLoop keeps the ledger within its bounds while the node runs (a
// daemon runs for months), and writes deferred ledger records.
func (n *Node) pruneLoop() {
	defer close(n.pruned)
	t := time.NewTicker(n.ledger.PruneEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			n.prune()
		case <-n.stopPrune:
			return
		}
	}
}

func (n *Node) prune() {
	removed, err := n.store.Prune(store.PruneOptions{Now: time.Now(), Window: n.ledger.Window,
		MaxKeys: n.ledger.MaxKeys, MaxBytes: n.ledger.MaxBytes})
	if err == nil {
		err = n.store.Flush()
	}
	if err != nil {
		n.log.Warn("ledger prune failed", "err", err)
	} else if removed > 0 {
		n.log.Debug("ledger pruned", "removed", removed)
	}
}

// LedgerStats reports the idempotency ledger's size (for /metrics).
func (n *Node) LedgerStats() store.LedgerStats { return n.store.LedgerStats() }

// Manifest is the manifest the node serves.
func (n *Node) Manifest() *manifest.Manifest { return n.bound().m }

// DeviceID is the node's device id (its proMCP source).
func (n *Node) DeviceID() string { return n.bound().m.Device.ID }

// Buses returns the open buses by name (the daemon mounts dev controls).
func (n *Node) Buses() map[string]drivers.Bus {
	b := n.bound()
	out := make(map[string]drivers.Bus, len(b.buses))
	for name, r := range b.buses {
		out[name] = r.Bus
	}
	return out
}

// Guard is the decision phase in force (a policy and gate, the
// manifest-only guard, or NoPolicy).
func (n *Node) Guard() Guard { return n.guard }

// PolicyConfigured reports whether a real policy guards do_ calls.
func (n *Node) PolicyConfigured() bool {
	if pf, ok := n.guard.(interface{ PolicyConfigured() bool }); ok {
		return pf.PolicyConfigured()
	}
	_, none := n.guard.(NoPolicy)
	return !none
}

// auditHeadroom is nil when the audit trail has room for the next
// actuations' records (audit.Log.Headroom; an AuditLog without the check
// has room).
func (n *Node) auditHeadroom() error {
	if h, ok := n.audit.(interface{ Headroom(int64) error }); ok {
		return h.Headroom(audit.Reserve)
	}
	return nil
}

// Readiness is one check of Ready.
type Readiness struct {
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// Ready reports whether the node can serve: every bus open and healthy.
func (n *Node) Ready() (bool, []Readiness) {
	ok := true
	var out []Readiness
	out = append(out, Readiness{Name: "manifest", OK: true})
	if p := n.storeErr.Load(); p != nil {
		ok = false
		out = append(out, Readiness{Name: "store", OK: false, Error: "the last ledger write failed, actuations are refused until one succeeds: " + (*p).Error()})
	} else {
		out = append(out, Readiness{Name: "store", OK: true})
	}
	if p := n.auditErr.Load(); p != nil {
		ok = false
		out = append(out, Readiness{Name: "audit", OK: false, Error: "the last audit append failed, actuations are refused: " + (*p).Error()})
	} else if err := n.auditHeadroom(); err != nil {
		ok = false
		out = append(out, Readiness{Name: "audit", OK: false, Error: "actuations are refused: " + err.Error()})
	} else {
		out = append(out, Readiness{Name: "audit", OK: true})
	}
	for _, r := range n.safeReadiness() {
		ok = false
		out = append(out, r)
	}
	b := n.bound()
	names := make([]string, 0, len(b.m.Buses))
	for name := range b.m.Buses {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		r := Readiness{Name: "bus:" + name, OK: true}
		if err := b.busErr[name]; err != nil {
			r.OK, r.Error = false, err.Error()
		} else if err := b.buses[name].Health(); err != nil {
			r.OK, r.Error = false, err.Error()
		}
		ok = ok && r.OK
		out = append(out, r)
	}
	return ok, out
}

// Drain refuses every device step that has not started yet (shutting_down,
// nothing touched, the key left free) while the process finishes the calls
// it has: physd calls it on SIGTERM, before it waits for its HTTP clients,
// so a call still queued for its capability's turn cannot start after
// shutdown began. Steps under way finish; Close waits for them.
func (n *Node) Drain() {
	n.lifeMu.Lock()
	n.draining = true
	n.lifeMu.Unlock()
}

// Close begins shutdown: no device step starts after it is called (calls
// still deciding are refused when they reach their device step), and it
// waits for the steps under way — each bounded by its capability's timeouts
// and settle time — before it closes the buses. If ctx ends first the
// buses stay open (closing one under a write would turn a known outcome
// into an unknown one) and the error names what is still running; the
// pending ledger entries make the next start resolve them. The caller
// closes the store and audit log afterwards.
func (n *Node) Close(ctx context.Context) error {
	n.reloadMu.Lock() // a reload under way finishes first (it starts polls)
	n.lifeMu.Lock()
	already := n.closed
	n.closed = true
	n.lifeMu.Unlock()
	n.reloadMu.Unlock()
	if !already {
		close(n.stopPrune)
		<-n.pruned
		close(n.stopPoll)
		n.polls.Wait()
		n.closeFailSafe()
		n.obs.close()
	}
	done := make(chan struct{})
	go func() { n.actuating.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("shutdown: actuations still in flight (their buses stay open; the next start resolves them from the ledger): %w", ctx.Err())
	}
	n.closeBuses()
	return nil
}

func (n *Node) closeBuses() {
	for _, r := range n.bound().buses {
		<-r.retire()
	}
}

// capability returns the state of a tool, or an error naming the tools.
func (n *Node) capability(tool string) (*capState, error) {
	if cs, ok := n.bound().byTool[tool]; ok {
		return cs, nil
	}
	return nil, &InputError{Field: "name", Msg: fmt.Sprintf("unknown capability %q", tool)}
}

// NotExposed is the refusal of a call of a capability that is not exposed
// (manifest expose: false): it is observed, never called. Nothing was read
// or actuated by the call.
func NotExposed(tool string) error {
	return &InputError{Field: "name", Msg: fmt.Sprintf("%s is not exposed as a tool (expose: false in the manifest): it is observed but cannot be called; "+
		"read its observations through the resources physmcp://obs/%s and physmcp://history/%s. Nothing was done", tool, manifest.CapabilityName(tool), manifest.CapabilityName(tool))}
}

// InputError is bad input from the caller: the message names the field and
// the fix. It is never an actuation.
type InputError struct {
	Field string
	Msg   string
}

func (e *InputError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}
