package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Handler serves a request from another node (or from this node, when a
// Request or Fanout names itself). ctx ends at the requester's deadline or
// when the mesh shuts down. The returned bytes (≤ MaxPayload) are the reply;
// an error is sent back as text and surfaces as *RemoteError.
type Handler func(ctx context.Context, from string, kind string, payload []byte) ([]byte, error)

// Reserved request kinds, served by the mesh itself (Handler never sees
// them).
const (
	KindQuorumAck = "quorum_ack" // empty reply: "I am alive and reachable"
	KindCatalog   = "catalog"    // reply: the node's encoded Catalog
	KindLeave     = "leave"      // notice: the sender is leaving gracefully
)

// Errors returned by Request (wrapped; test with errors.Is).
var (
	ErrUnknownNode   = errors.New("mesh: unknown node")
	ErrNodeNotAlive  = errors.New("mesh: node not alive")
	ErrTimeout       = errors.New("mesh: request timed out")
	ErrUnreachable   = errors.New("mesh: node unreachable")
	ErrTooLarge      = errors.New("mesh: payload too large")
	ErrShutdown      = errors.New("mesh: shut down")
	ErrDuplicateNode = errors.New("mesh: duplicate node id")
	// ErrNoAck: the owner did not acknowledge a Call in time (silent).
	ErrNoAck = errors.New("mesh: no acknowledgement")
	// ErrOutcomeUnknown: a Commit call's go-ahead left, no answer came.
	ErrOutcomeUnknown = errors.New("mesh: outcome unknown")
)

// RemoteError is an error returned by the remote node's handler.
type RemoteError struct {
	Node, Kind, Msg string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("mesh: %s on %s failed: %s", e.Kind, e.Node, e.Msg)
}

// Mesh is this node's membership in the site mesh.
type Mesh struct {
	cfg  Config
	log  *slog.Logger
	h    Handler
	list *memberlist.Memberlist
	// listSet is stored once list is: memberlist delivers peers' messages
	// from inside Create, before list is assigned, and a request answered
	// then would send its reply through a nil list (a panic seen on a
	// loaded machine when twelve gateways started at once).
	listSet atomic.Bool
	dial    *dialer // the transport memberlist uses, with per-send deadlines

	ctx    context.Context // canceled by Shutdown
	cancel context.CancelFunc
	done   chan struct{}

	goMu    sync.Mutex // guards closing and wg.Add
	closing bool
	wg      sync.WaitGroup
	closed  atomic.Bool
	left    atomic.Bool
	joinMu  sync.Mutex   // serializes joins
	joining atomic.Int32 // > 0 while this node runs a Join

	// mu guards everything below. Never call memberlist while holding it:
	// memberlist calls the delegates (which take mu) under its own lock.
	mu            sync.Mutex
	cat           Catalog
	catBytes      []byte
	selfAddr      string
	peers         map[string]*peer
	established   bool  // has been part of a mesh with other nodes
	refused       error // duplicate node id: this node was refused
	lastJoinError string
	onChange      []func()

	handlerSem chan struct{}
	nextID     atomic.Uint64
	callMu     sync.Mutex
	calls      map[uint64]*call
	serving    map[srvKey]*serving // requests from others (guarded by callMu)
	lateTotal  atomic.Int64
	changeCh   chan struct{}
	fetchCh    chan struct{}

	psMu       sync.Mutex // partition_state hysteresis
	psSettled  bool
	psReported string
	psRaw      string
	psSince    time.Time
}

// peer is what this node knows about another node.
type peer struct {
	name       string
	addr       string // advertise "ip:port"
	ip         net.IP
	port       uint16
	metaHash   string   // catalog hash from the gossiped metadata
	cat        *Catalog // latest catalog whose hash matched metaHash
	down       bool     // memberlist declared it dead or left
	left       bool     // it told us it was leaving
	downAt     time.Time
	lastSeen   time.Time // last positive evidence (probe ack, message, alive event)
	suspectAt  time.Time // last negative evidence (failed probe or quorum ack)
	needFetch  bool
	fetching   bool
	fetchFails int       // catalog fetches failed in a row: the retry's backoff
	rechecking bool      // a failed probe is being re-checked
	lossyUntil time.Time // a delivery to it needed a retry: hedge until then
}

type call struct {
	node      string
	ch        chan result
	ack       chan struct{} // closed by the owner's msgAck
	acked     bool
	late      *atomic.Int64
	abandoned time.Time // zero while the requester waits
}

type result struct {
	payload []byte
	err     error
	reply   bool // came from the remote node (vs a local send error)
}

// New creates this node's memberlist, starts serving requests with h, and
// joins the seeds. A failed join is not an error: the reconnect loop keeps
// trying. A duplicate node id (the seeds already know another node by this
// name) is: New returns ErrDuplicateNode.
func New(cfg Config, cat Catalog, h Handler) (*Mesh, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cat.DeviceID == "" {
		cat.DeviceID = cfg.NodeName
	}
	if cat.DeviceID != cfg.NodeName {
		return nil, fmt.Errorf("mesh: catalog device_id %q is not the node name %q", cat.DeviceID, cfg.NodeName)
	}
	cat, catBytes, err := encodeCatalog(cat)
	if err != nil {
		return nil, fmt.Errorf("mesh: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Mesh{
		cfg: cfg, h: h,
		log:        cfg.Logger.With("component", "mesh", "node", cfg.NodeName),
		ctx:        ctx,
		cancel:     cancel,
		done:       make(chan struct{}),
		cat:        cat,
		catBytes:   catBytes,
		peers:      map[string]*peer{},
		handlerSem: make(chan struct{}, MaxConcurrentHandlers),
		calls:      map[uint64]*call{},
		serving:    map[srvKey]*serving{},
		changeCh:   make(chan struct{}, 1),
		fetchCh:    make(chan struct{}, 1),
	}
	mc, err := m.memberlistConfig()
	if err != nil {
		cancel()
		return nil, fmt.Errorf("mesh: start memberlist on %s:%d: %w", cfg.BindAddr, cfg.BindPort, err)
	}
	list, err := memberlist.Create(mc)
	if err != nil {
		if cfg.Transport == nil {
			_ = m.dial.Shutdown()
		}
		cancel()
		return nil, fmt.Errorf("mesh: start memberlist on %s:%d: %w", cfg.BindAddr, cfg.BindPort, err)
	}
	m.list = list
	m.listSet.Store(true)
	m.mu.Lock()
	if m.selfAddr == "" { // NotifyJoin(self) normally sets it during Create
		m.selfAddr = list.LocalNode().Address()
	}
	m.mu.Unlock()
	if m.cfg.ExpectedSize == 0 {
		m.cfg.ExpectedSize = 1 + len(m.seedTargets(nil))
	}
	m.spawn(m.notifier)
	m.spawn(m.fetcher)
	m.spawn(m.loop)

	if seeds := m.seedTargets(nil); len(seeds) > 0 {
		joined := make(chan struct{})
		m.spawn(func() { m.join(seeds); close(joined) })
		tm := time.NewTimer(cfg.JoinTimeout)
		select {
		case <-joined:
		case <-tm.C:
			m.log.Warn("mesh: initial join still running; continuing in the background", "seeds", seeds)
		}
		tm.Stop()
	}
	if err := m.Err(); err != nil {
		_ = m.Shutdown()
		return nil, err
	}
	m.log.Info("mesh: started", "addr", m.SelfAddr(), "label", cfg.Label, "encrypted", len(cfg.SecretKey) > 0,
		"expected_size", m.cfg.ExpectedSize, "profile", cfg.Profile)
	return m, nil
}

// Done is closed when the mesh shuts down.
func (m *Mesh) Done() <-chan struct{} { return m.done }

// Name is this node's name (the device id).
func (m *Mesh) Name() string { return m.cfg.NodeName }

// SelfAddr is the address ("ip:port") peers use to reach this node.
func (m *Mesh) SelfAddr() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.selfAddr
}

// ExpectedSize is the configured (or derived) expected mesh size.
func (m *Mesh) ExpectedSize() int { return m.cfg.ExpectedSize }

// Majority is ExpectedSize/2 + 1, the default quorum.
func (m *Mesh) Majority() int { return m.cfg.ExpectedSize/2 + 1 }

// Err reports why the mesh stopped on its own (a duplicate node id), or nil.
func (m *Mesh) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refused
}

// LateDropped is the total number of replies that arrived after their
// request's deadline and were dropped.
func (m *Mesh) LateDropped() int64 { return m.lateTotal.Load() }

// OnChange registers f, called (asynchronously, coalesced) after the
// membership, a member's state or a catalog changed.
func (m *Mesh) OnChange(f func()) {
	m.mu.Lock()
	m.onChange = append(m.onChange, f)
	m.mu.Unlock()
}

// UpdateCatalog replaces this node's catalog and re-gossips its hash; peers
// fetch the new catalog when they see the hash change.
func (m *Mesh) UpdateCatalog(cat Catalog) error {
	if cat.DeviceID == "" {
		cat.DeviceID = m.cfg.NodeName
	}
	if cat.DeviceID != m.cfg.NodeName {
		return fmt.Errorf("mesh: catalog device_id %q is not the node name %q", cat.DeviceID, m.cfg.NodeName)
	}
	c, b, err := encodeCatalog(cat)
	if err != nil {
		return fmt.Errorf("mesh: %w", err)
	}
	m.mu.Lock()
	same := c.Hash == m.cat.Hash
	if !same {
		m.cat, m.catBytes = c, b
	}
	m.mu.Unlock()
	if same {
		return nil
	}
	m.changed()
	m.spawn(func() {
		if err := m.list.UpdateNode(4 * m.cfg.RequestTimeout); err != nil {
			m.log.Debug("mesh: catalog hash re-gossip not yet confirmed", "err", err)
		}
	})
	return nil
}

// Leave tells the other nodes this node is going away (a "leave" notice,
// then memberlist's leave broadcast), so they mark it left rather than
// dead. Call Shutdown afterwards.
func (m *Mesh) Leave(timeout time.Duration) error {
	if m.closed.Load() {
		return ErrShutdown
	}
	if m.left.Swap(true) {
		return nil
	}
	start := time.Now()
	notice := min(timeout/2, m.cfg.RequestTimeout)
	if notice > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), notice)
		var peers []string
		for name := range m.liveNames() {
			if name != m.cfg.NodeName {
				peers = append(peers, name)
			}
		}
		m.Fanout(ctx, peers, KindLeave, nil)
		cancel()
	}
	rest := timeout - time.Since(start)
	if rest <= 0 {
		rest = time.Millisecond
	}
	if m.closed.Load() {
		return ErrShutdown
	}
	return m.list.Leave(rest)
}

// Shutdown stops the mesh without a leave broadcast (peers will detect a
// failure; call Leave first for a graceful exit). It waits for the mesh's
// goroutines, including in-flight handlers (their ctx is canceled) and
// sends (bounded by memberlist's TCP timeout).
func (m *Mesh) Shutdown() error {
	if m.closed.Swap(true) {
		return nil
	}
	m.goMu.Lock()
	m.closing = true
	m.goMu.Unlock()
	close(m.done)
	m.cancel()
	err := m.list.Shutdown()
	m.wg.Wait()
	return err
}

// spawn runs f in a tracked goroutine, unless the mesh is shutting down.
func (m *Mesh) spawn(f func()) bool {
	m.goMu.Lock()
	defer m.goMu.Unlock()
	if m.closing {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f()
	}()
	return true
}

// changed schedules the OnChange callbacks.
func (m *Mesh) changed() {
	select {
	case m.changeCh <- struct{}{}:
	default:
	}
}

func (m *Mesh) notifier() {
	for {
		select {
		case <-m.done:
			return
		case <-m.changeCh:
			m.Status() // observe the partition state at each change (hysteresis clock)
			m.mu.Lock()
			fns := append([]func(){}, m.onChange...)
			m.mu.Unlock()
			for _, f := range fns {
				f()
			}
		}
	}
}

// loop runs the reconnect loop and housekeeping.
func (m *Mesh) loop() {
	var reconnect <-chan time.Time
	if m.cfg.ReconnectInterval > 0 {
		t := time.NewTicker(m.cfg.ReconnectInterval)
		defer t.Stop()
		reconnect = t.C
	}
	sweep := time.NewTicker(5 * time.Second)
	defer sweep.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-reconnect:
			if m.Err() != nil || m.left.Load() {
				continue
			}
			if targets := m.reconnectTargets(); len(targets) > 0 {
				m.join(targets)
			}
			m.wantFetch("") // retry catalog fetches that failed
		case <-sweep.C:
			m.sweep()
		}
	}
}

// seedTargets returns the seeds that are not this node and, when live is
// given, not already alive members.
func (m *Mesh) seedTargets(live map[string]bool) []string {
	self := m.SelfAddr()
	liveAddrs := map[string]bool{}
	if live != nil {
		m.mu.Lock()
		for name := range live {
			if p := m.peers[name]; p != nil {
				liveAddrs[p.addr] = true
			}
		}
		m.mu.Unlock()
	}
	defPort := m.cfg.BindPort
	if defPort == 0 {
		defPort = DefaultPort
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range m.cfg.Seeds {
		name, host, port, err := SplitSeed(s, defPort)
		if err != nil {
			continue
		}
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		if addr == self || name == m.cfg.NodeName || seen[addr] || liveAddrs[addr] || (name != "" && live[name]) {
			continue
		}
		seen[addr] = true
		out = append(out, s)
	}
	return out
}

// reconnectTargets: seeds and remembered peers that are not alive now.
func (m *Mesh) reconnectTargets() []string {
	live := m.liveNames()
	out := m.seedTargets(live)
	seen := map[string]bool{}
	for _, s := range out {
		_, host, port, _ := SplitSeed(s, DefaultPort)
		seen[net.JoinHostPort(host, strconv.Itoa(port))] = true
	}
	m.mu.Lock()
	for _, p := range m.peers {
		if live[p.name] || p.left || p.addr == "" || seen[p.addr] {
			continue
		}
		seen[p.addr] = true
		out = append(out, p.name+"/"+p.addr)
	}
	m.mu.Unlock()
	return out
}

// Join contacts targets ("name/host:port" or "host:port") now, each
// bounded by JoinTimeout, and returns how many answered. It is how
// gateways found outside the manifest (mDNS) are joined; once joined they
// are remembered and re-joined by the reconnect loop like seeds. Targets
// that are this node are skipped; after Leave, Shutdown or a refused
// duplicate id nothing is contacted.
func (m *Mesh) Join(targets []string) int {
	if m.closed.Load() || m.left.Load() || m.Err() != nil {
		return 0
	}
	self := m.SelfAddr()
	var out []string
	for _, t := range targets {
		name, addr, ok := strings.Cut(t, "/")
		if !ok {
			name, addr = "", t
		}
		if name == m.cfg.NodeName || addr == self {
			continue
		}
		out = append(out, t)
	}
	if len(out) == 0 {
		return 0
	}
	return m.join(out)
}

// join contacts targets concurrently (at most 8 at a time) and returns how
// many answered.
func (m *Mesh) join(targets []string) int {
	m.joinMu.Lock()
	defer m.joinMu.Unlock()
	m.joining.Add(1)
	defer m.joining.Add(-1)
	var (
		ok   atomic.Int32
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 8)
		errM sync.Mutex
		errs []string
	)
	for _, t := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(m.ctx, m.cfg.JoinTimeout)
			err := m.joinTagged(ctx, t)
			cancel()
			if err != nil {
				errM.Lock()
				errs = append(errs, err.Error())
				errM.Unlock()
				m.log.Debug("mesh: join failed", "target", t, "err", err)
				return
			}
			ok.Add(1)
		}()
	}
	wg.Wait()
	n := int(ok.Load())
	m.mu.Lock()
	switch {
	case n > 0 && m.refused == nil:
		m.established = true
		m.lastJoinError = ""
	case n == 0 && len(errs) > 0:
		m.lastJoinError = errs[0]
	}
	m.mu.Unlock()
	if n > 0 {
		m.log.Info("mesh: joined", "contacted", n, "of", len(targets))
	} else if len(errs) > 0 {
		m.log.Warn("mesh: could not join any of the targets; will retry (a wrong key or label shows as a decrypt error or EOF)",
			"targets", targets, "label", m.cfg.Label, "err", errs[0])
	}
	return n
}

// liveNames is the set of memberlist's non-dead members (alive or
// suspect), self included. Only names are read: memberlist's Node structs
// may be updated concurrently.
func (m *Mesh) liveNames() map[string]bool {
	out := map[string]bool{}
	if !m.listSet.Load() {
		return out
	}
	for _, n := range m.list.Members() {
		out[n.Name] = true
	}
	return out
}

// sweep drops abandoned calls past the late window and forgets peers dead
// for longer than ReconnectTimeout.
func (m *Mesh) sweep() {
	now := time.Now()
	window := max(30*time.Second, 20*m.cfg.RequestTimeout)
	m.callMu.Lock()
	for id, c := range m.calls {
		if !c.abandoned.IsZero() && now.Sub(c.abandoned) > window {
			delete(m.calls, id)
		}
	}
	for k, s := range m.serving {
		if !s.done.IsZero() && now.Sub(s.done) > window {
			delete(m.serving, k) // retried attempts arrive within the requester's deadline
		}
	}
	m.callMu.Unlock()
	live := m.liveNames()
	forgot := false
	m.mu.Lock()
	for name, p := range m.peers {
		if !live[name] && p.down && now.Sub(p.downAt) > m.cfg.ReconnectTimeout {
			delete(m.peers, name)
			forgot = true
			m.log.Info("mesh: forgetting peer", "peer", name, "down_since", p.downAt)
		}
	}
	m.mu.Unlock()
	if forgot {
		m.changed()
	}
}

// --- peer table updates (called from memberlist delegates; no memberlist
// calls here) ---

func (m *Mesh) peerUp(n *memberlist.Node, join bool) {
	hash, _ := decodeMeta(n.Meta)
	addr := n.Address()
	now := time.Now()
	m.mu.Lock()
	if n.Name == m.cfg.NodeName {
		m.selfAddr = addr
		m.mu.Unlock()
		return
	}
	p := m.peers[n.Name]
	if p == nil {
		p = &peer{name: n.Name}
		m.peers[n.Name] = p
	}
	p.addr, p.ip, p.port = addr, append(net.IP(nil), n.Addr...), n.Port
	p.metaHash = hash
	if join {
		p.down, p.left = false, false
	}
	p.lastSeen = now
	p.suspectAt = time.Time{}
	if p.cat == nil || p.cat.Hash != hash {
		p.needFetch = true
	}
	if join && m.joining.Load() == 0 && m.refused == nil {
		m.established = true // someone joined us
	}
	m.mu.Unlock()
	m.changed()
	m.wantFetch(n.Name)
}

func (m *Mesh) peerDown(n *memberlist.Node) {
	if n.Name == m.cfg.NodeName {
		return
	}
	m.mu.Lock()
	p := m.peers[n.Name]
	if p == nil {
		p = &peer{name: n.Name, addr: n.Address(), ip: append(net.IP(nil), n.Addr...), port: n.Port}
		m.peers[n.Name] = p
	}
	p.down, p.downAt = true, time.Now()
	left, target := p.left, n.Name+"/"+n.Address()
	m.mu.Unlock()
	m.log.Info("mesh: peer down", "peer", n.Name)
	m.changed()
	if !left && m.cfg.ReconnectInterval > 0 {
		// A death on a lossy link may be false: try to rejoin it once,
		// soon, rather than at the next reconnect round. A push/pull with
		// a live peer tells it it was declared dead, and it refutes.
		m.spawn(func() {
			select {
			case <-time.After(m.cfg.RequestTimeout):
			case <-m.done:
				return
			}
			if m.liveNames()[n.Name] || m.closed.Load() || m.left.Load() {
				return
			}
			ctx, cancel := context.WithTimeout(m.ctx, m.cfg.JoinTimeout)
			defer cancel()
			if err := m.joinTagged(ctx, target); err == nil {
				m.log.Info("mesh: a peer declared dead answered a rejoin", "peer", n.Name)
			}
		})
	}
}

// sawPeer records positive evidence that name is alive and reachable.
func (m *Mesh) sawPeer(name string) {
	m.mu.Lock()
	p := m.peers[name]
	flip := false
	if p != nil {
		flip = p.suspectAt.After(p.lastSeen)
		p.lastSeen = time.Now()
	}
	m.mu.Unlock()
	if flip {
		m.changed()
	}
}

// probeFailed: memberlist's probe of name failed (UDP, and its indirect
// and TCP fallbacks). On a lossy link that happens to members that are
// fine: record the suspicion and re-check at once, and again while it
// stands, with a quorum_ack over the mesh's own retried TCP requests; an
// answer clears it.
func (m *Mesh) probeFailed(name string) { m.suspectPeer(name) }

// recheck starts the re-check loop of a suspect peer (one per peer).
func (m *Mesh) recheck(name string) {
	m.mu.Lock()
	p := m.peers[name]
	start := p != nil && !p.down && !p.rechecking
	if start {
		p.rechecking = true
	}
	m.mu.Unlock()
	if !start {
		return
	}
	if !m.spawn(func() {
		defer func() {
			m.mu.Lock()
			if p := m.peers[name]; p != nil {
				p.rechecking = false
			}
			m.mu.Unlock()
		}()
		// Until positive evidence clears the suspicion (any message from
		// it: the ack's reply included), memberlist declares it dead, or
		// a minute has passed.
		for start := time.Now(); time.Since(start) < time.Minute; {
			m.mu.Lock()
			p := m.peers[name]
			still := p != nil && !p.down && p.suspectAt.After(p.lastSeen)
			m.mu.Unlock()
			if !still || m.closed.Load() {
				return
			}
			ctx, cancel := context.WithTimeout(m.ctx, 2*m.cfg.RequestTimeout)
			t0 := time.Now()
			_, err := m.request(ctx, name, KindQuorumAck, nil, callOpts{})
			cancel()
			if err == nil {
				return
			}
			if rest := 2*m.cfg.RequestTimeout - time.Since(t0); rest > 0 { // a refused dial returns at once
				select {
				case <-time.After(rest):
				case <-m.done:
					return
				}
			}
		}
	}) {
		m.mu.Lock()
		p.rechecking = false
		m.mu.Unlock()
	}
}

// suspectPeer records negative evidence: a failed probe (memberlist's
// "Suspect X has failed" log line), a failed quorum ack or request; it
// starts the re-check loop (see probeFailed).
func (m *Mesh) suspectPeer(name string) {
	m.mu.Lock()
	p := m.peers[name]
	flip := false
	if p != nil && !p.down {
		flip = !p.suspectAt.After(p.lastSeen)
		p.suspectAt = time.Now()
	}
	m.mu.Unlock()
	if flip {
		m.changed()
	}
	m.recheck(name)
}

func (m *Mesh) markLeft(name string) {
	m.mu.Lock()
	if p := m.peers[name]; p != nil {
		p.left = true
	}
	m.mu.Unlock()
	m.changed()
}

func (m *Mesh) selfConflict(existing, other *memberlist.Node) {
	mine, theirs := existing.Address(), other.Address()
	m.mu.Lock()
	refuse := m.joining.Load() > 0 && !m.established && m.refused == nil
	if refuse {
		m.refused = fmt.Errorf("%w: node id %q is already used in the mesh by the node at %s (this node is %s); give every device a unique device.id",
			ErrDuplicateNode, existing.Name, theirs, mine)
	}
	m.mu.Unlock()
	if refuse {
		m.log.Error("mesh: DUPLICATE NODE ID: this node's id is already in the mesh; refusing to take part",
			"node", existing.Name, "other_addr", theirs, "this_addr", mine)
		m.spawn(func() { _ = m.list.Shutdown() })
		return
	}
	m.log.Error("mesh: DUPLICATE NODE ID: another node claims this node's id; it was refused",
		"node", existing.Name, "other_addr", theirs, "this_addr", mine)
}

// --- catalogs ---

// wantFetch wakes the fetcher (name is informational).
func (m *Mesh) wantFetch(string) {
	select {
	case m.fetchCh <- struct{}{}:
	default:
	}
}

// fetcher requests the catalog of every live peer whose gossiped hash does
// not match the catalog held, at most 4 at a time.
func (m *Mesh) fetcher() {
	sem := make(chan struct{}, 4)
	for {
		select {
		case <-m.done:
			return
		case <-m.fetchCh:
		}
		live := m.liveNames()
		var todo []string
		m.mu.Lock()
		for name, p := range m.peers {
			if p.needFetch && !p.fetching && live[name] && !p.down {
				p.fetching = true
				todo = append(todo, name)
			}
		}
		m.mu.Unlock()
		for _, name := range todo {
			select {
			case sem <- struct{}{}:
			case <-m.done:
				return
			}
			if !m.spawn(func() {
				defer func() { <-sem }()
				m.fetchCatalog(name)
			}) {
				return
			}
		}
	}
}

func (m *Mesh) fetchCatalog(name string) {
	ctx, cancel := context.WithTimeout(m.ctx, 4*m.cfg.RequestTimeout)
	defer cancel()
	b, err := m.Request(ctx, name, KindCatalog, nil)
	var cat Catalog
	if err == nil {
		cat, err = decodeCatalog(b)
		if err == nil && cat.DeviceID != name {
			err = fmt.Errorf("catalog names %q", cat.DeviceID)
		}
	}
	m.mu.Lock()
	fails := 0
	if p := m.peers[name]; p != nil {
		p.fetching = false
		if err != nil {
			p.fetchFails++
		} else {
			p.fetchFails = 0
		}
		fails = p.fetchFails
	}
	m.mu.Unlock()
	if err != nil {
		// A peer that has just joined may not serve requests yet: try again
		// soon (250 ms, doubling to 30 s) rather than at the next
		// reconnect round, which left a new site without its catalogs for
		// up to a minute.
		wait := min(250*time.Millisecond<<min(fails-1, 7), 30*time.Second)
		m.log.Debug("mesh: catalog fetch failed; will retry", "peer", name, "in", wait, "err", err)
		time.AfterFunc(wait, func() {
			if !m.closed.Load() {
				m.wantFetch(name)
			}
		})
		return
	}
	m.storeCatalog(cat)
}

// storeCatalog keeps cat if it is the one its owner currently gossips.
func (m *Mesh) storeCatalog(cat Catalog) {
	m.mu.Lock()
	p := m.peers[cat.DeviceID]
	if p == nil || (p.metaHash != "" && p.metaHash != cat.Hash) || (p.cat != nil && p.cat.Hash == cat.Hash) {
		if p != nil && p.cat != nil && p.cat.Hash == cat.Hash {
			p.needFetch = false
		}
		m.mu.Unlock()
		return
	}
	c := cat
	p.cat = &c
	p.needFetch = false
	m.mu.Unlock()
	m.changed()
}

// localState is this node's push/pull payload: its own catalog and every
// catalog it holds that matches its owner's current hash.
func (m *Mesh) localState() []byte {
	m.mu.Lock()
	list := []json.RawMessage{m.catBytes}
	size := len(m.catBytes)
	for _, p := range m.peers {
		if p.cat == nil || p.down || p.cat.Hash != p.metaHash {
			continue
		}
		b, err := json.Marshal(p.cat)
		if err != nil || size+len(b) > 8*MaxPayload {
			continue
		}
		size += len(b)
		list = append(list, b)
	}
	m.mu.Unlock()
	b, _ := json.Marshal(list)
	return b
}

func (m *Mesh) mergeState(buf []byte) {
	var list []json.RawMessage
	if err := json.Unmarshal(buf, &list); err != nil {
		m.log.Warn("mesh: ignoring undecodable push/pull state", "err", err)
		return
	}
	for _, raw := range list {
		cat, err := decodeCatalog(raw)
		if err != nil {
			m.log.Warn("mesh: ignoring a catalog in push/pull state", "err", err)
			continue
		}
		if cat.DeviceID == m.cfg.NodeName {
			continue
		}
		m.storeCatalog(cat)
	}
}
