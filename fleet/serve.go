package fleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/node"
)

// Server answers the fleet endpoint's calls on a gateway (network.fleet
// serve: read, can_do, do) on its uplink's connection, under the
// gateway's own subjects. Calls are served by the node paths that serve
// mesh-routed calls (meshnode.Owner), with the caller authenticated by
// this gateway from the credential the endpoint forwarded; a do_ whose
// caller does not authenticate here is refused before anything
// (audited), never run as anonymous. A do_ is two-phase: acknowledged and
// held for Hold on this gateway's monotonic clock, run only on the
// go-ahead of the endpoint that sent it, at most once per (requester,
// id).
//
// It also publishes the gateway's catalog (JetStream, last per subject,
// so the endpoint knows every gateway after it restarts), a heartbeat,
// and refreshes of observations that did not change, so that the
// endpoint can tell a steady value from a silent link.
type Server struct {
	cfg      ServeConfig
	log      *slog.Logger
	base     string
	instance string
	u        *Uplink

	mu      sync.Mutex
	nc      *nats.Conn
	subs    []*nats.Subscription
	cat     Catalog
	stored  string // the hash of the catalog the stream acknowledged ("" none yet)
	serving map[callKey]*held
	closed  bool

	sem      chan struct{}
	wake     chan struct{} // a heartbeat now
	store    chan struct{} // the catalog to the stream now
	stop     chan struct{}
	done     sync.WaitGroup
	once     sync.Once
	refused  atomic.Uint64
	answered atomic.Uint64
	// now is the clock the hold is measured on (time.Now: monotonic);
	// tests move it.
	now func() time.Time
}

// ServeConfig configures a Server.
type ServeConfig struct {
	Prefix, Site string
	// Serve is network.fleet.serve.
	Serve []string
	// Owner runs the calls (its Transport and StrictDo are set by
	// NewServer: "fleet", strict).
	Owner meshnode.Owner
	// CatalogStream is the stream of the catalogs (DefaultCatalogStream).
	CatalogStream string
	// Heartbeat (DefaultHeartbeat) and Hold (DefaultHold).
	Heartbeat, Hold time.Duration
	// MaxConcurrent bounds the calls served at once (default 64); more
	// are answered busy.
	MaxConcurrent int
	Logger        *slog.Logger
}

type callKey struct{ from, id string }

// maxServing bounds the do_ requests remembered at once (each is kept two
// minutes to recognise its retries); beyond it a new one is answered busy.
const maxServing = 10_000

// held is one do_ the endpoint sent: acknowledged, then run once on its
// go-ahead, or never.
type held struct {
	call     []byte    // until it runs
	sum      [32]byte  // the request's sha256: a retry is the same request
	received time.Time // this process's monotonic clock
	running  bool
	done     bool
	answer   []byte // the final reply's body (kept for the sweep's lifetime)
	errText  string
}

// NewServer builds the gateway's serving side; Start puts it on an uplink.
func NewServer(cfg ServeConfig) *Server {
	if cfg.CatalogStream == "" {
		cfg.CatalogStream = DefaultCatalogStream
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Hold <= 0 {
		cfg.Hold = DefaultHold
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Owner.Transport, cfg.Owner.StrictDo = "fleet", true
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "fleet-serve"), instance: fmt.Sprintf("%x", id),
		serving: map[callKey]*held{}, sem: make(chan struct{}, cfg.MaxConcurrent), wake: make(chan struct{}, 1), store: make(chan struct{}, 1), stop: make(chan struct{}), now: time.Now}
	s.base = Base(cfg.Prefix, cfg.Site, s.node().DeviceID())
	s.cat = s.catalog(StateServing)
	return s
}

func (s *Server) node() *node.Node { return s.cfg.Owner.Node }

// Instance is this process's instance id (in the catalog and heartbeats).
func (s *Server) Instance() string { return s.instance }

func (s *Server) serves(what string) bool {
	for _, w := range s.cfg.Serve {
		if w == what {
			return true
		}
	}
	return false
}

func (s *Server) catalog(state string) Catalog {
	return CatalogOf(s.node().Manifest(), s.cfg.Site, s.cfg.Serve, s.instance, state, s.cfg.Heartbeat)
}

// Start serves on u's connection from its first connect on (it must be
// called before u.Start), and refreshes the node's steady observations.
func (s *Server) Start(u *Uplink) {
	s.u = u
	u.OnConnect(func(nc *nats.Conn) {
		s.mu.Lock()
		first := s.nc == nil && !s.closed
		if first {
			s.nc = nc
		}
		s.stored = "" // publish the catalog again: the stream may be new
		s.mu.Unlock()
		if first {
			// nats.go subscribes again by itself after a reconnect.
			if err := s.subscribe(nc); err != nil {
				s.log.Error("fleet: cannot serve the fleet endpoint's calls", "err", err.Error())
			}
		}
		s.nudge()
	})
	s.done.Add(3)
	go s.beat()
	go s.catalogs()
	go s.refresh()
}

func (s *Server) nudge() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// subscribe listens on this gateway's request subjects. A queue group:
// should two processes hold one gateway's name, each request reaches one
// of them only (and a go-ahead names the instance that acknowledged).
func (s *Server) subscribe(nc *nats.Conn) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, kind := range []string{KindRead, KindCanDo, KindCatalog, KindDo, KindGo} {
		sub, err := nc.QueueSubscribe(s.base+"."+SuffixRequest+"."+kind, "physd", s.receive(kind))
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", kind, err)
		}
		s.subs = append(s.subs, sub)
	}
	return nil
}

// receive handles one request off the connection's delivery goroutine.
func (s *Server) receive(kind string) nats.MsgHandler {
	return func(m *nats.Msg) {
		if m.Reply == "" {
			return // nobody to answer
		}
		s.mu.Lock()
		closed := s.closed
		if !closed {
			s.done.Add(1)
		}
		s.mu.Unlock()
		if closed {
			s.reply(m, ReplyError, []byte("shutting_down: the gateway is stopping; nothing was done"), "")
			return
		}
		select {
		case s.sem <- struct{}{}:
		default:
			s.done.Done()
			s.reply(m, ReplyError, []byte("busy: too many concurrent calls; nothing was done"), "")
			return
		}
		go func() {
			defer s.done.Done()
			defer func() { <-s.sem }()
			s.handle(kind, m)
		}()
	}
}

// budget is how long the requester still waits (its header), bounded.
func budget(m *nats.Msg) time.Duration {
	ms, err := strconv.ParseInt(m.Header.Get(HeaderBudget), 10, 64)
	if err != nil || ms <= 0 {
		ms = 5000
	}
	return min(time.Duration(ms)*time.Millisecond, 10*time.Minute)
}

func (s *Server) handle(kind string, m *nats.Msg) {
	from, id := m.Header.Get(HeaderFrom), m.Header.Get(HeaderCallID)
	if from == "" {
		s.reply(m, ReplyError, []byte("a request needs "+HeaderFrom+"; nothing was done"), "")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget(m))
	defer cancel()
	switch kind {
	case KindCatalog:
		s.mu.Lock()
		b, _ := json.Marshal(s.cat)
		s.mu.Unlock()
		s.reply(m, ReplyAnswer, b, "")
	case KindRead, KindCanDo:
		if !s.serves(kind) { // manifest.FleetServeRead, FleetServeCanDo
			s.reply(m, ReplyError, []byte(notServed(s.node().DeviceID(), kind)), "")
			return
		}
		mk := meshnode.KindRead
		if kind == KindCanDo {
			mk = meshnode.KindCanDo
		}
		b, err := s.cfg.Owner.Serve(ctx, from, mk, m.Data)
		s.answer(m, b, err)
	case KindDo:
		s.request(ctx, m, from, id)
	case KindGo:
		s.goAhead(ctx, m, from, id)
	}
}

func notServed(device, kind string) string {
	return fmt.Sprintf("not_served: %s does not serve %s to the fleet endpoint (network.fleet.serve); nothing was done", device, kind)
}

func (s *Server) answer(m *nats.Msg, b []byte, err error) {
	if err != nil {
		s.reply(m, ReplyError, []byte(err.Error()), "")
		return
	}
	s.answered.Add(1)
	s.reply(m, ReplyAnswer, b, "")
}

func (s *Server) reply(m *nats.Msg, kind string, body []byte, instance string) {
	r := nats.NewMsg(m.Reply)
	r.Header.Set(HeaderReply, kind)
	if instance != "" {
		r.Header.Set(HeaderInstance, instance)
	}
	r.Data = body
	if err := m.RespondMsg(r); err != nil {
		s.log.Debug("fleet: reply not sent", "err", err.Error())
	}
}

// request is a do_'s first phase: refused at once (the gateway serves no
// do_, or cannot authenticate the caller: audited), or held and
// acknowledged. A retried request (the same requester and id) is
// acknowledged again while held, and never held twice.
func (s *Server) request(ctx context.Context, m *nats.Msg, from, id string) {
	if id == "" {
		s.reply(m, ReplyError, []byte("a do_ request needs "+HeaderCallID+"; nothing was done"), "")
		return
	}
	if !s.serves(manifest.FleetServeDo) {
		s.reply(m, ReplyError, []byte(notServed(s.node().DeviceID(), "do_")), "")
		return
	}
	key := callKey{from, id}
	s.mu.Lock()
	h := s.serving[key]
	if h == nil && len(s.serving) >= maxServing {
		s.mu.Unlock()
		s.reply(m, ReplyError, []byte("busy: too many do_ requests held or answered in the last two minutes; nothing was done"), "")
		return
	}
	if h != nil {
		done, answer, errText, same := h.done, h.answer, h.errText, h.sum == sha256.Sum256(m.Data)
		s.mu.Unlock()
		switch {
		case !same:
			// Not a retry of the request held under this requester and
			// id: refused, and the held one is left as it is.
			s.reply(m, ReplyError, []byte("conflict: another request is held under this requester and id; nothing was done"), "")
		case !done:
			s.reply(m, ReplyAck, nil, s.instance)
		case errText != "":
			s.reply(m, ReplyError, []byte(errText), "")
		default:
			s.reply(m, ReplyAnswer, answer, "")
		}
		return
	}
	h = &held{call: m.Data, sum: sha256.Sum256(m.Data), received: s.now()}
	s.serving[key] = h
	s.mu.Unlock()

	var call meshnode.DoCall
	if err := json.Unmarshal(m.Data, &call); err != nil {
		s.finish(key, m, nil, fmt.Errorf("a do_ request that is not a call (%v); nothing was done", err))
		return
	}
	if _, ok := s.cfg.Owner.Caller(from, call.Credential); !ok {
		// Refused now, audited by the node, with the answer the caller
		// gets: nothing to hold, nothing to go ahead with.
		s.refused.Add(1)
		b, err := s.cfg.Owner.Serve(ctx, from, meshnode.KindDo, m.Data)
		s.finish(key, m, b, err)
		return
	}
	s.reply(m, ReplyAck, nil, s.instance)
}

// finish records a do_'s final reply under its key and sends it.
func (s *Server) finish(key callKey, m *nats.Msg, b []byte, err error) {
	s.mu.Lock()
	h := s.serving[key]
	h.done, h.running, h.call = true, false, nil
	if err != nil {
		h.errText = err.Error()
	} else {
		h.answer = b
	}
	s.mu.Unlock()
	s.answer(m, b, err)
}

// goAhead is a do_'s second phase: the held request runs once, if the
// go-ahead came within Hold of its receipt and names this instance.
func (s *Server) goAhead(ctx context.Context, m *nats.Msg, from, id string) {
	key := callKey{from, id}
	s.mu.Lock()
	h := s.serving[key]
	var why string
	switch {
	case m.Header.Get(HeaderInstance) != s.instance:
		why = fmt.Sprintf("not_committed: the go-ahead is for gateway process %q, this is %q (it restarted, or another process holds its name); nothing was done", m.Header.Get(HeaderInstance), s.instance)
	case h == nil:
		why = "not_committed: no such request is held here; nothing was done"
	case h.running:
		s.mu.Unlock()
		return // a repeated go-ahead: the first one's reply follows
	case h.done:
		answer, errText := h.answer, h.errText
		s.mu.Unlock()
		if errText != "" {
			s.reply(m, ReplyError, []byte(errText), "")
		} else {
			s.reply(m, ReplyAnswer, answer, "")
		}
		return
	case s.now().Sub(h.received) > s.cfg.Hold:
		why = fmt.Sprintf("not_committed: the go-ahead came %v after the request, later than this gateway holds one (%v); nothing was done",
			s.now().Sub(h.received).Round(time.Millisecond), s.cfg.Hold)
		h.done, h.errText, h.call = true, why, nil
	default:
		h.running = true
	}
	if why != "" {
		s.mu.Unlock()
		s.log.Warn("fleet: do_ not run", "from", from, "id", id, "why", why)
		s.reply(m, ReplyError, []byte(why), "")
		return
	}
	call := h.call
	s.mu.Unlock()
	b, err := s.cfg.Owner.Serve(ctx, from, meshnode.KindDo, call)
	s.finish(key, m, b, err)
}

// sweep forgets calls a while after they were received: long after any
// retry of them could arrive (a held one past its hold can never run).
func (s *Server) sweep(keep time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, h := range s.serving {
		if !h.running && s.now().Sub(h.received) > keep {
			delete(s.serving, k)
		}
	}
}

// beat publishes the heartbeat every Heartbeat (and at once after a
// connect or a reload), and sweeps the served calls. Nothing else runs on
// it: a slow hub never delays a heartbeat.
func (s *Server) beat() {
	defer s.done.Done()
	t := time.NewTicker(s.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-s.wake:
		case <-t.C:
			s.sweep(2 * time.Minute)
		}
		s.mu.Lock()
		nc, cat := s.nc, s.cat
		s.mu.Unlock()
		if nc == nil || !nc.IsConnected() {
			continue
		}
		hb, _ := json.Marshal(Heartbeat{Instance: s.instance, IntervalMS: s.cfg.Heartbeat.Milliseconds(), Catalog: cat.Hash, State: cat.State})
		if err := nc.Publish(s.base+"."+SuffixHeartbeat, hb); err != nil {
			s.log.Debug("fleet: heartbeat not sent", "err", err.Error())
		}
		select {
		case s.store <- struct{}{}:
		default:
		}
	}
}

// catalogs puts the catalog in force in the stream until the stream has
// acknowledged it (the fleet endpoint creates the stream; until then, and
// while the hub refuses, it is tried again after every heartbeat).
func (s *Server) catalogs() {
	defer s.done.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // a store under way ends when the server stops
		select {
		case <-s.stop:
		case <-ctx.Done():
		}
		cancel()
	}()
	for {
		select {
		case <-s.stop:
			return
		case <-s.store:
		}
		s.mu.Lock()
		nc, cat, stored := s.nc, s.cat, s.stored
		s.mu.Unlock()
		if nc != nil && nc.IsConnected() && stored != cat.Hash {
			_ = s.storeCatalog(ctx, nc, cat, s.cfg.Heartbeat)
		}
	}
}

// storeCatalog puts cat in the catalog stream within the time given.
func (s *Server) storeCatalog(ctx context.Context, nc *nats.Conn, cat Catalog, within time.Duration) error {
	js, err := s.u.jetStream(nc) // in the hub's domain, as the uplink's
	if err == nil {
		b, _ := json.Marshal(cat)
		ctx, cancel := context.WithTimeout(ctx, within)
		_, err = js.Publish(ctx, s.base+"."+SuffixCatalog, b, jetstream.WithExpectStream(s.cfg.CatalogStream))
		cancel()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if s.stored != "failed:"+err.Error() {
			s.log.Warn("fleet: the catalog is not in the hub's stream yet; retrying every heartbeat (the fleet endpoint creates "+s.cfg.CatalogStream+")", "err", err.Error())
		}
		s.stored = "failed:" + err.Error()
		return err
	}
	if s.cat.Hash == cat.Hash {
		s.stored = cat.Hash
	}
	return nil
}

// Reload publishes the catalog of the manifest now in force.
func (s *Server) Reload() {
	s.mu.Lock()
	s.cat = s.catalog(StateServing)
	s.mu.Unlock()
	s.nudge()
}

// refresh republishes observations that did not change (the uplink
// publishes the changes) at least every third of their freshness, so
// that the fleet endpoint's copy of a steady value stays fresh while the
// gateway reads it; each carries its age at sending (the endpoint adds
// the time since, on its own clock).
func (s *Server) refresh() {
	defer s.done.Done()
	sub := s.node().Subscribe(0)
	defer sub.Close()
	last := map[string]time.Time{}
	for {
		select {
		case <-s.stop:
			return
		case <-sub.Done():
			return
		case o := <-sub.C:
			if o.Cap == nil || o.Safe != nil {
				continue
			}
			tool := o.Cap.ToolName()
			every := max(o.Cap.StaleAfter()/3, time.Second)
			if o.Changed {
				last[tool] = time.Now() // the uplink sends it
				continue
			}
			if time.Since(last[tool]) < every {
				continue
			}
			last[tool] = time.Now()
			obs := o.Obs
			obs.AgeMS = max(time.Since(obs.Timestamp).Milliseconds(), 0)
			if b, err := json.Marshal(obs); err == nil {
				s.u.core1(s.u.ObsSubject(tool), b)
			}
		}
	}
}

// ServeStats are the serving side's counters.
type ServeStats struct {
	Instance string   `json:"instance"`
	Serves   []string `json:"serves"`
	// CatalogStored is true once the hub's stream holds the catalog in
	// force.
	CatalogStored bool `json:"catalog_stored"`
	// Answered counts calls answered; Refused do_ calls whose caller did
	// not authenticate here.
	Answered uint64 `json:"answered"`
	Refused  uint64 `json:"refused_unauthenticated"`
	Held     int    `json:"calls_held"`
}

// Stats reports the serving side's state.
func (s *Server) Stats() ServeStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := 0
	for _, h := range s.serving {
		if !h.done {
			held++
		}
	}
	return ServeStats{Instance: s.instance, Serves: append([]string{}, s.cfg.Serve...), CatalogStored: s.stored == s.cat.Hash,
		Answered: s.answered.Load(), Refused: s.refused.Load(), Held: held}
}

// Close stops serving: no new call is taken, the calls under way finish,
// and the catalog says the gateway stopped (so the fleet endpoint shows
// it stopped, not lost). Call it before the uplink's Close.
func (s *Server) Close() {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		subs, nc := s.subs, s.nc
		s.cat = s.catalog(StateStopped)
		cat := s.cat
		s.mu.Unlock()
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
		close(s.stop)
		s.done.Wait()
		if nc != nil && nc.IsConnected() {
			hb, _ := json.Marshal(Heartbeat{Instance: s.instance, IntervalMS: s.cfg.Heartbeat.Milliseconds(), Catalog: cat.Hash, State: cat.State})
			_ = nc.Publish(s.base+"."+SuffixHeartbeat, hb)
			if err := s.storeCatalog(context.Background(), nc, cat, time.Second); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				s.log.Debug("fleet: stopped state not stored", "err", err.Error())
			}
		}
	})
}
