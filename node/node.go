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
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/store"
)

// Config builds a Node.
type Config struct {
	Manifest *manifest.Manifest
	Store    *store.Store
	Audit    *audit.Log
	// Guard is the policy and gate step of the do pipeline (DESIGN steps 3
	// and 4). Nil means NoPolicy: only the manifest is enforced, and every
	// do_ response says that no policy is configured.
	Guard  Guard
	Logger *slog.Logger
	// Remote, when set, extends can_do to the other nodes of the site.
	Remote Remote
	// OnDeviceError is called for every failed device access (metrics).
	OnDeviceError func(bus string, err error)
	// LedgerWindow is how long an idempotency key is remembered (≥24 h
	// recommended by proMCP §9.2); LedgerMax bounds the entries kept.
	LedgerWindow time.Duration
	LedgerMax    int
}

// Node serves one device's capabilities.
type Node struct {
	m      *manifest.Manifest
	store  *store.Store
	audit  *audit.Log
	guard  Guard
	log    *slog.Logger
	buses  map[string]drivers.Bus
	busErr map[string]error
	caps   []*capState
	byTool map[string]*capState

	ledgerWindow time.Duration
	ledgerMax    int

	inflightMu sync.Mutex
	inflight   map[string]chan struct{} // idempotency key -> closed when done

	recent recentLog // last do_ answers, for /status
	remote Remote    // the mesh, or nil

	// OnDeviceError, when set, is told about every failed device access
	// (for metrics); it must not block.
	onDeviceErr func(bus string, err error)

	doWG     sync.WaitGroup // in-flight actuations, for graceful shutdown
	closing  chan struct{}
	closeOne sync.Once
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
		m:            cfg.Manifest,
		store:        cfg.Store,
		audit:        cfg.Audit,
		guard:        cfg.Guard,
		log:          cfg.Logger,
		buses:        map[string]drivers.Bus{},
		busErr:       map[string]error{},
		byTool:       map[string]*capState{},
		ledgerWindow: cfg.LedgerWindow,
		ledgerMax:    cfg.LedgerMax,
		inflight:     map[string]chan struct{}{},
		onDeviceErr:  cfg.OnDeviceError,
		remote:       cfg.Remote,
		closing:      make(chan struct{}),
	}
	if n.guard == nil {
		n.guard = NoPolicy{}
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	if n.ledgerWindow <= 0 {
		n.ledgerWindow = 24 * time.Hour
	}
	if n.ledgerMax <= 0 {
		n.ledgerMax = 100_000
	}
	names := make([]string, 0, len(n.m.Buses))
	for name := range n.m.Buses {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		b, err := drivers.Open(ctx, n.m.Buses[name])
		if err != nil {
			n.busErr[name] = err
			n.log.Error("bus unavailable", "bus", name, "err", err)
			continue
		}
		n.buses[name] = b
	}
	var bindErrs []error
	for _, c := range n.m.Capabilities {
		cs := &capState{cap: c, tool: c.ToolName(), vocab: vocabulary(c)}
		switch bus, ok := n.buses[c.Binding.Bus]; {
		case c.Binding.Bus == "":
			bindErrs = append(bindErrs, fmt.Errorf("%s: %s.bus: required; fix: name the bus this capability is wired to (one of buses:)", c.Binding.Pos, c.Binding.Field))
		case !ok:
			cs.bindErr = fmt.Errorf("bus %q is unavailable: %v", c.Binding.Bus, n.busErr[c.Binding.Bus])
		default:
			p, err := bus.Point(c)
			if err != nil {
				// A binding the driver rejects is a configuration error,
				// not a missing device: refuse to start.
				bindErrs = append(bindErrs, fmt.Errorf("capability %s: %w", c.Name, err))
			}
			cs.point, cs.bus = p, bus
		}
		n.caps = append(n.caps, cs)
		n.byTool[cs.tool] = cs
	}
	if len(bindErrs) > 0 {
		n.closeBuses()
		return nil, errors.Join(bindErrs...)
	}
	if err := n.recoverPending(ctx); err != nil {
		n.closeBuses()
		return nil, fmt.Errorf("ledger recovery: %w", err)
	}
	if _, err := n.store.Prune(time.Now().Add(-n.ledgerWindow), n.ledgerMax); err != nil {
		n.log.Warn("ledger prune failed", "err", err)
	}
	return n, nil
}

// Manifest is the manifest the node serves.
func (n *Node) Manifest() *manifest.Manifest { return n.m }

// DeviceID is the node's device id (its proMCP source).
func (n *Node) DeviceID() string { return n.m.Device.ID }

// Buses returns the open buses by name (the daemon mounts dev controls).
func (n *Node) Buses() map[string]drivers.Bus { return n.buses }

// PolicyConfigured reports whether a real policy guards do_ calls.
func (n *Node) PolicyConfigured() bool { _, none := n.guard.(NoPolicy); return !none }

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
	out = append(out, Readiness{Name: "manifest", OK: true}, Readiness{Name: "store", OK: true})
	names := make([]string, 0, len(n.m.Buses))
	for name := range n.m.Buses {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		r := Readiness{Name: "bus:" + name, OK: true}
		if err := n.busErr[name]; err != nil {
			r.OK, r.Error = false, err.Error()
		} else if err := n.buses[name].Health(); err != nil {
			r.OK, r.Error = false, err.Error()
		}
		ok = ok && r.OK
		out = append(out, r)
	}
	return ok, out
}

// Close waits for in-flight actuations to finish (or ctx to end), then
// closes the buses. The caller closes the store and audit log afterwards.
func (n *Node) Close(ctx context.Context) error {
	n.closeOne.Do(func() { close(n.closing) })
	done := make(chan struct{})
	go func() { n.doWG.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("shutdown: actuations still in flight: %w", ctx.Err())
	}
	n.closeBuses()
	return err
}

func (n *Node) closeBuses() {
	for name, b := range n.buses {
		if err := b.Close(); err != nil {
			n.log.Warn("bus close", "bus", name, "err", err)
		}
	}
}

// capability returns the state of a tool, or an error naming the tools.
func (n *Node) capability(tool string) (*capState, error) {
	if cs, ok := n.byTool[tool]; ok {
		return cs, nil
	}
	return nil, &InputError{Field: "name", Msg: fmt.Sprintf("unknown capability %q", tool)}
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
