package mesh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Request sends payload to node and waits for its reply, over memberlist's
// reliable (TCP, encrypted, labelled) channel. The deadline is ctx's, or
// RequestTimeout when ctx has none, and it bounds everything: the dial, the
// write and the wait (see dial.go). Until the reply arrives, a new attempt
// (a fresh connection) starts every RetryInterval, so a lost SYN or
// segment on a lossy link costs one interval, not TCP's 1 s (or 200 ms)
// retransmission. The owner serves attempts that overlap once; an attempt
// arriving after the reply left is served again (the reply was lost), so
// Request is for idempotent kinds (reads, can_do); Call serves once.
// The remote handler gets the time left as its own deadline. A reply
// arriving after the deadline is dropped and counted (LateDropped). Errors
// wrap ErrUnknownNode, ErrNodeNotAlive, ErrUnreachable, ErrTimeout,
// ErrTooLarge or ErrShutdown, or are a *RemoteError carrying the remote
// handler's error text. A request to this node itself calls the handler
// directly.
func (m *Mesh) Request(ctx context.Context, node, kind string, payload []byte) ([]byte, error) {
	return m.request(ctx, node, kind, payload, callOpts{})
}

// CallOptions shape a Call.
type CallOptions struct {
	// AckWithin is how long the owner has to acknowledge receipt (default
	// RequestTimeout, capped by ctx's deadline). An owner that does not is
	// silent (link cut, process stopped, overloaded): Call fails with
	// ErrNoAck then, long before a slow operation's own deadline.
	AckWithin time.Duration
	// Commit makes the request two-phase: the owner acknowledges, then
	// waits (at most its RequestTimeout, on its own monotonic clock) for
	// the requester's go-ahead before serving the request. A request that
	// sat in a stopped owner's socket buffer is therefore never served
	// late, and an error before the go-ahead left means nothing was done.
	// After it, a missing answer is ErrOutcomeUnknown.
	Commit bool
}

// Call is Request for operations that may take longer than RequestTimeout
// (routed reads and actuations): the owner acknowledges receipt within
// AckWithin, and the reply may then take until ctx's deadline. Errors are
// Request's, plus ErrNoAck (no acknowledgement) and, with Commit,
// ErrOutcomeUnknown (the go-ahead left, no answer came).
func (m *Mesh) Call(ctx context.Context, node, kind string, payload []byte, o CallOptions) ([]byte, error) {
	if o.AckWithin <= 0 {
		o.AckWithin = m.cfg.RequestTimeout
	}
	return m.request(ctx, node, kind, payload, callOpts{ack: o.AckWithin, commit: o.Commit})
}

type callOpts struct {
	late   *atomic.Int64
	ack    time.Duration // > 0: the owner must acknowledge within this
	commit bool
}

// RetryInterval is how long a request waits for its message to get out
// (or, for Call, for the owner's acknowledgement) before it tries again on
// a new connection: RequestTimeout/4, between 20 and 250 ms.
func (m *Mesh) RetryInterval() time.Duration {
	return min(max(m.cfg.RequestTimeout/4, 20*time.Millisecond), 250*time.Millisecond)
}

// DecisionMargin is how long before its deadline a quorum round decides,
// so that the caller's answer (a partition_no_quorum refusal) reaches the
// client within the deadline: RequestTimeout/10, between 10 and 100 ms.
func (m *Mesh) DecisionMargin() time.Duration {
	return min(max(m.cfg.RequestTimeout/10, 10*time.Millisecond), 100*time.Millisecond)
}

func (m *Mesh) request(ctx context.Context, node, kind string, payload []byte, o callOpts) ([]byte, error) {
	if m.closed.Load() {
		return nil, ErrShutdown
	}
	if len(payload) > MaxPayload {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(payload), MaxPayload)
	}
	if kind == "" || len(kind) > maxWireString {
		return nil, fmt.Errorf("mesh: invalid request kind %q", kind)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.cfg.RequestTimeout)
		defer cancel()
	}
	if node == m.cfg.NodeName {
		out, err := m.dispatch(ctx, node, kind, payload)
		if err != nil {
			return nil, &RemoteError{Node: node, Kind: kind, Msg: err.Error()}
		}
		return out, nil
	}
	target, err := m.lookup(node)
	if err != nil {
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	start := time.Now()
	budget := deadline.Sub(start)
	if budget <= 0 || ctx.Err() != nil {
		return nil, m.ctxError(ctx, node, kind)
	}
	id := m.nextID.Add(1)
	c := &call{node: node, ch: make(chan result, 1), ack: make(chan struct{}), late: o.late}
	m.callMu.Lock()
	m.calls[id] = c
	m.callMu.Unlock()
	w := &message{typ: msgRequest, id: id, from: m.cfg.NodeName, addr: m.SelfAddr(), text: kind,
		budget: uint64(max(budget.Milliseconds(), 1)), payload: payload}
	ackBy := deadline
	if o.ack > 0 {
		w.flags |= flagAck
		if o.commit {
			w.flags |= flagCommit
		}
		ackBy = earliest(deadline, start.Add(o.ack))
	}
	msg := w.encode()

	// Attempts end at the acknowledgement deadline (Call) or the deadline.
	sendCtx, cancelSend := context.WithDeadline(ctx, ackBy)
	defer cancelSend()
	stop := make(chan struct{})
	stopOnce := sync.OnceFunc(func() { close(stop) })
	defer stopOnce()
	sent := make(chan delivery, 1)
	// Attempts go on until the acknowledgement or the reply arrives: a
	// message written to a socket may still be lost on the wire, and a
	// fresh attempt is faster than TCP's retransmission.
	if !m.spawn(func() { sent <- m.deliver(sendCtx, target, msg, stop, true, o.ack == 0) }) {
		m.forget(id)
		return nil, ErrShutdown
	}
	var ackTimer <-chan time.Time
	if o.ack > 0 {
		t := time.NewTimer(time.Until(ackBy))
		defer t.Stop()
		ackTimer = t.C
	}
	ackCh := (<-chan struct{})(c.ack)
	var (
		commitSent    chan delivery // the go-ahead's delivery (Commit)
		commitStarted bool
	)
	for {
		select {
		case r := <-c.ch:
			if re, ok := r.err.(*RemoteError); ok {
				re.Kind = kind
			}
			if r.err != nil && !r.reply && errors.Is(r.err, ErrUnreachable) {
				m.suspectPeer(node)
			}
			return r.payload, r.err
		case <-ackCh:
			ackCh, ackTimer = nil, nil
			stopOnce()
			if o.commit {
				commitStarted = true
				commitSent = make(chan delivery, 1)
				go_ := (&message{typ: msgCommit, id: id, from: m.cfg.NodeName, addr: m.SelfAddr()}).encode()
				cctx, ccancel := context.WithDeadline(ctx, earliest(deadline, time.Now().Add(m.cfg.RequestTimeout)))
				if !m.spawn(func() { defer ccancel(); commitSent <- m.deliver(cctx, target, go_, nil, false, false) }) {
					ccancel()
					m.forget(id)
					return nil, ErrShutdown
				}
			}
		case d := <-commitSent:
			commitSent = nil
			if !d.connected {
				// The go-ahead never reached the owner: it did nothing.
				m.forget(id)
				m.suspectPeer(node)
				return nil, fmt.Errorf("%w: %s acknowledged %s but the go-ahead could not be delivered (%v); nothing was done", ErrUnreachable, node, kind, d.err)
			}
		case d := <-sent:
			sent = nil
			if d.err != nil && !d.sent && refused(d.err) {
				m.forget(id)
				m.suspectPeer(node)
				return nil, fmt.Errorf("%w: %s: %v", ErrUnreachable, node, d.err)
			}
		case <-ackTimer:
			m.abandon(id)
			m.suspectPeer(node)
			return nil, fmt.Errorf("%w: %s did not acknowledge %s within %v (link cut, process stopped or overloaded)",
				ErrNoAck, node, kind, ackBy.Sub(start).Round(time.Millisecond))
		case <-ctx.Done():
			m.abandon(id)
			if commitStarted {
				// Whether the caller gave up or the deadline came, the
				// owner may be acting.
				return nil, fmt.Errorf("%w: %s acknowledged %s and was told to go ahead, but did not answer within the deadline (%v)",
					ErrOutcomeUnknown, node, kind, ctx.Err())
			}
			return nil, m.ctxError(ctx, node, kind)
		case <-m.done:
			m.forget(id)
			return nil, ErrShutdown
		}
	}
}

// lossyFor is how long a link that needed a retry is treated as lossy.
const lossyFor = time.Minute

// lossy reports whether a delivery to name needed a retry lately.
func (m *Mesh) lossy(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.peers[name]
	return p != nil && time.Now().Before(p.lossyUntil)
}

func (m *Mesh) markLossy(name string) {
	m.mu.Lock()
	if p := m.peers[name]; p != nil {
		p.lossyUntil = time.Now().Add(lossyFor)
	}
	m.mu.Unlock()
}

// maxPacketMessage is the largest message that is also sent as a UDP
// packet (memberlist's UDPBufferSize is 1400 bytes, less its headers, the
// label and the encryption overhead).
const maxPacketMessage = 1000

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// delivery is what deliver achieved.
type delivery struct {
	sent      bool  // an attempt's send completed
	connected bool  // an attempt connected (the message may have arrived)
	err       error // the last attempt's error
}

// deliver gets msg to the node over memberlist's reliable channel within
// ctx. It starts a new attempt every RetryInterval while none has
// completed (with untilStop, until stop is closed, whatever the sends
// did, the interval doubling once one did if backoff); it returns when an attempt
// completed (without untilStop), stop is closed, ctx ends, or a connection
// was refused before anything got out.
func (m *Mesh) deliver(ctx context.Context, to *memberlist.Node, msg []byte, stop <-chan struct{}, untilStop, backoff bool) delivery {
	const maxAttempts = 32
	type res struct {
		connected bool
		err       error
	}
	every := m.RetryInterval()
	lossy := m.lossy(to.Name)
	if lossy {
		// This link lost messages lately: hedge (two connections at
		// once) and retry twice as often.
		every /= 2
	}
	results := make(chan res, maxAttempts)
	var d delivery
	attempts, inflight := 0, 0
	stuck := false // a retry started because no attempt had got out
	defer func() {
		if stuck || (d.err != nil && !d.sent && !errors.Is(d.err, ErrShutdown)) {
			m.markLossy(to.Name)
		}
	}()
	launch := func() {
		if attempts >= maxAttempts {
			return
		}
		if len(msg) <= maxPacketMessage && (lossy || attempts > 0) {
			// On a lossy link (or a retry), a small message also goes as
			// one UDP packet (encrypted and labelled like the stream): it
			// arrives without a handshake to lose. Duplicates are
			// harmless. (Not on a clean link: it would cost every
			// request a second receive.)
			_ = m.list.SendBestEffort(to, msg)
		}
		if m.spawn(func() {
			tn, tag, release := m.dial.tag(ctx, to)
			err := m.list.SendReliable(tn, msg)
			release()
			results <- res{tag.connected.Load(), err}
		}) {
			attempts++
			inflight++
		}
	}
	launch()
	if inflight == 0 {
		d.err = ErrShutdown
		return d
	}
	if lossy && len(msg) > maxPacketMessage {
		launch()
	}
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case r := <-results:
			inflight--
			d.connected = d.connected || r.connected
			if r.err == nil {
				d.sent = true
				if !untilStop {
					return d
				}
				continue
			}
			d.err = r.err
			if refused(r.err) && !d.sent {
				return d
			}
		case <-t.C:
			if (untilStop || !d.sent) && ctx.Err() == nil {
				if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > every/4 {
					stuck = stuck || !d.sent
					launch()
				}
			}
			if d.sent && backoff {
				// The message got out: the answer may just be slow (a
				// long handler, a big reply). Back off.
				every *= 2
			}
			t.Reset(every)
		case <-stop:
			return d
		case <-ctx.Done():
			if d.err == nil && !d.sent {
				d.err = ctx.Err()
			}
			return d
		case <-m.done:
			d.err = ErrShutdown
			return d
		}
	}
}

func (m *Mesh) ctxError(ctx context.Context, node, kind string) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("mesh: %s to %s: %w", kind, node, context.Canceled)
	}
	return fmt.Errorf("%w: %s did not answer %s within the deadline", ErrTimeout, node, kind)
}

// lookup returns the address of a live (alive or suspect) member.
func (m *Mesh) lookup(node string) (*memberlist.Node, error) {
	live := m.liveNames()
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.peers[node]
	switch {
	case live[node] && p != nil && p.addr != "":
		return &memberlist.Node{Name: node, Addr: p.ip, Port: p.port}, nil
	case p != nil:
		state := StateDead
		if p.left {
			state = StateLeft
		}
		since := ""
		if !p.downAt.IsZero() {
			since = " since " + p.downAt.UTC().Format(time.RFC3339)
		}
		return nil, &NotAliveError{Node: node, State: state, Since: p.downAt, err: fmt.Errorf("%w: %s is %s%s", ErrNodeNotAlive, node, state, since)}
	default:
		return nil, fmt.Errorf("%w: %s", ErrUnknownNode, node)
	}
}

// NotAliveError is Request's error for a member known to be dead or
// left; it wraps ErrNodeNotAlive.
type NotAliveError struct {
	Node, State string
	Since       time.Time // when it went down (zero if never seen up)
	err         error
}

func (e *NotAliveError) Error() string { return e.err.Error() }
func (e *NotAliveError) Unwrap() error { return e.err }

// finish delivers r to the waiting call, or counts a late reply.
func (m *Mesh) finish(id uint64, r result) {
	m.callMu.Lock()
	c := m.calls[id]
	if c == nil {
		m.callMu.Unlock()
		return
	}
	delete(m.calls, id)
	abandoned := !c.abandoned.IsZero()
	m.callMu.Unlock()
	if abandoned {
		if r.reply {
			m.lateTotal.Add(1)
			if c.late != nil {
				c.late.Add(1)
			}
			m.log.Debug("mesh: late reply dropped", "peer", c.node)
		}
		return
	}
	c.ch <- r // buffered 1, one finish per call
}

// abandon marks a call whose requester gave up; its reply will be counted
// as late (until sweep forgets it).
func (m *Mesh) abandon(id uint64) {
	m.callMu.Lock()
	if c := m.calls[id]; c != nil {
		c.abandoned = time.Now()
	}
	m.callMu.Unlock()
}

func (m *Mesh) forget(id uint64) {
	m.callMu.Lock()
	delete(m.calls, id)
	m.callMu.Unlock()
}

// Fanout sends the same request to every node in nodes concurrently and
// returns when all have answered or at ctx's deadline (RequestTimeout when
// ctx has none), whichever is first. replies and errs are keyed by node;
// a node that had not answered by the deadline is in errs with ErrTimeout.
// Answers arriving after the deadline are dropped and counted in late,
// which keeps counting after Fanout returns.
func (m *Mesh) Fanout(ctx context.Context, nodes []string, kind string, payload []byte) (replies map[string][]byte, errs map[string]error, late *atomic.Int64) {
	r := m.Consult(ctx, nodes, kind, payload, 0)
	return r.Replies, r.Errs, r.Late
}

// ConsultResult is what Consult gathered.
type ConsultResult struct {
	Replies map[string][]byte
	Errs    map[string]error
	// NotConsulted were never asked: the deadline came before a slot
	// (of limit) was free for them.
	NotConsulted []string
	// Peak is the most requests that were in flight at once (≤ limit).
	Peak int
	// Late counts answers that arrived after the deadline (it keeps
	// counting after Consult returns).
	Late *atomic.Int64
}

// Consult is Fanout with at most limit requests in flight (0: no limit):
// limit bounds concurrency, not coverage. Nodes are asked in order as slots
// free up; while more wait than slots are free, a request holds its slot
// for at most its share of the time left (time left × limit / waiting, at
// least 2 RetryIntervals). A node is asked only while at least
// RetryInterval/2 remains before the deadline; the rest are returned in
// NotConsulted.
func (m *Mesh) Consult(ctx context.Context, nodes []string, kind string, payload []byte, limit int) ConsultResult {
	out := ConsultResult{Replies: map[string][]byte{}, Errs: map[string]error{}, Late: new(atomic.Int64)}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.cfg.RequestTimeout)
		defer cancel()
	}
	var todo []string
	seen := map[string]bool{}
	for _, n := range nodes {
		if !seen[n] {
			seen[n] = true
			todo = append(todo, n)
		}
	}
	if limit <= 0 || limit > len(todo) {
		limit = len(todo)
	}
	type res struct {
		node string
		b    []byte
		err  error
	}
	deadline, _ := ctx.Deadline()
	minLeft := m.RetryInterval() / 2
	ch := make(chan res, len(todo))
	next, inflight := 0, 0
	for next < len(todo) || inflight > 0 {
		for inflight < limit && next < len(todo) && ctx.Err() == nil && time.Until(deadline) >= minLeft {
			node := todo[next]
			next++
			// While more nodes wait than slots are free, a request may
			// hold its slot only for its share of the time left (at least
			// two retry intervals): a silent node must not starve the
			// ones behind it.
			rctx, rcancel := ctx, context.CancelFunc(func() {})
			if waiting := len(todo) - next + 1; waiting > limit-inflight {
				share := max(time.Until(deadline)*time.Duration(limit)/time.Duration(waiting), 2*m.RetryInterval())
				rctx, rcancel = context.WithTimeout(ctx, share)
			}
			if !m.spawn(func() {
				defer rcancel()
				b, err := m.request(rctx, node, kind, payload, callOpts{late: out.Late})
				ch <- res{node, b, err}
			}) {
				rcancel()
				out.Errs[node] = ErrShutdown
				continue
			}
			inflight++
			out.Peak = max(out.Peak, inflight)
		}
		if inflight == 0 {
			break
		}
		r := <-ch
		inflight--
		if r.err != nil {
			out.Errs[r.node] = r.err
		} else {
			out.Replies[r.node] = r.b
		}
	}
	out.NotConsulted = append(out.NotConsulted, todo[next:]...)
	return out
}

// Quorum counts the nodes that are reachable now: this node (1) plus every
// live member (alive or suspect in the membership) that answers a
// fresh quorum_ack request. The round ends DecisionMargin before
// RequestTimeout (or before ctx's deadline if sooner), so the caller can
// answer within its deadline; acks are retried on a new connection every
// RetryInterval while they have not got out. It never trusts the
// membership alone: a member the membership still lists as alive counts
// only if it answers. With need > 0 it returns as soon as need is reached
// (then alive ≥ need); otherwise, or when need is not reached, it returns
// the full count at the decision time. A member that fails to ack is marked
// suspect. Its signature is policy.QuorumFunc's.
func (m *Mesh) Quorum(ctx context.Context, need int) (alive int) {
	alive = 1
	if need > 0 && alive >= need {
		return alive
	}
	var peers []string
	for name := range m.liveNames() {
		if name != m.cfg.NodeName {
			peers = append(peers, name)
		}
	}
	if len(peers) == 0 || m.closed.Load() {
		return alive
	}
	decide := time.Now().Add(m.cfg.RequestTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(decide) {
		decide = d
	}
	ctx, cancel := context.WithDeadline(ctx, decide.Add(-m.DecisionMargin()))
	defer cancel()
	acks := make(chan bool, len(peers))
	for _, name := range peers {
		if !m.spawn(func() {
			_, err := m.request(ctx, name, KindQuorumAck, nil, callOpts{})
			if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, ErrShutdown) {
				m.suspectPeer(name)
			}
			acks <- err == nil
		}) {
			acks <- false
		}
	}
	for range peers {
		if <-acks {
			alive++
			if need > 0 && alive >= need {
				return alive
			}
		}
	}
	return alive
}

// QuorumError is returned by RequireQuorum; its text is PhysMCP's
// partition_no_quorum reason.
type QuorumError struct {
	Alive, Required int
}

func (e *QuorumError) Error() string {
	return fmt.Sprintf("partition_no_quorum: alive %d, required %d", e.Alive, e.Required)
}

// RequireQuorum runs Quorum(ctx, need) and returns a *QuorumError when
// fewer than need nodes answered. need ≤ 0 means a majority of ExpectedSize.
func (m *Mesh) RequireQuorum(ctx context.Context, need int) error {
	if need <= 0 {
		need = m.Majority()
	}
	if alive := m.Quorum(ctx, need); alive < need {
		return &QuorumError{Alive: alive, Required: need}
	}
	return nil
}

// --- receiving ---

// srvKey identifies a request being served: its requester and id.
type srvKey struct {
	from string
	id   uint64
}

// serving is the owner's record of one request. Duplicates (retried
// attempts) are recognised by it and never served twice.
type serving struct {
	w         message
	go_       chan struct{} // closed by the requester's msgCommit
	committed bool
	done      time.Time // when the reply left (zero while serving)
}

// onMessage handles a user message from memberlist (it must not block).
func (m *Mesh) onMessage(buf []byte) {
	if !m.listSet.Load() {
		// Still inside memberlist.Create: nothing can be answered yet. The
		// sender's call retries within its deadline, as for a lost packet.
		return
	}
	w, err := decodeMessage(buf)
	if err != nil {
		m.log.Warn("mesh: dropping a malformed message (a peer on another physd version?)", "bytes", len(buf))
		return
	}
	m.sawPeer(w.from)
	switch w.typ {
	case msgReply:
		var r result
		r.reply = true
		if w.text != "" {
			r.err = &RemoteError{Node: w.from, Msg: w.text}
		} else {
			r.payload = w.payload
		}
		m.callMu.Lock()
		c := m.calls[w.id]
		m.callMu.Unlock()
		if c == nil {
			return
		}
		if c.node != w.from {
			m.log.Warn("mesh: dropping a reply from the wrong node", "want", c.node, "got", w.from)
			return
		}
		m.finish(w.id, r)
	case msgAck:
		m.callMu.Lock()
		c := m.calls[w.id]
		if c != nil && c.node == w.from && c.abandoned.IsZero() && !c.acked {
			c.acked = true
			close(c.ack)
		}
		m.callMu.Unlock()
	case msgCommit:
		m.callMu.Lock()
		s := m.serving[srvKey{w.from, w.id}]
		if s != nil && s.go_ != nil && !s.committed {
			s.committed = true
			close(s.go_)
		}
		m.callMu.Unlock()
	case msgRequest:
		key := srvKey{w.from, w.id}
		m.callMu.Lock()
		if s := m.serving[key]; s != nil && (s.done.IsZero() || s.w.flags&(flagAck|flagCommit) != 0) {
			// A retried attempt of a request being served, or of a Call:
			// acknowledge again (the first ack may be what got lost),
			// serve once. (A plain Request whose reply already left is
			// served again: its reply was lost, and its kinds are
			// idempotent.)
			again := w.flags&(flagAck|flagCommit) != 0 && s.done.IsZero()
			m.callMu.Unlock()
			if again {
				m.spawn(func() { m.control(w, msgAck) })
			}
			return
		}
		s := &serving{w: w}
		if w.flags&flagCommit != 0 {
			s.go_ = make(chan struct{})
		}
		m.serving[key] = s
		m.callMu.Unlock()
		select {
		case m.handlerSem <- struct{}{}:
		default:
			m.spawn(func() { m.reply(s, nil, errors.New("busy: too many concurrent requests")) })
			return
		}
		if !m.spawn(func() {
			defer func() { <-m.handlerSem }()
			m.serve(s)
		}) {
			<-m.handlerSem
		}
	}
}

func (m *Mesh) serve(s *serving) {
	w := s.w
	received := time.Now()
	budget := time.Duration(w.budget) * time.Millisecond
	budget = min(max(budget, time.Millisecond), 10*time.Minute)
	ctx, cancel := context.WithTimeout(m.ctx, budget)
	defer cancel()
	if w.flags&(flagAck|flagCommit) != 0 {
		m.spawn(func() { m.control(w, msgAck) })
	}
	if s.go_ != nil {
		// Two-phase: serve only on a go-ahead that arrives within
		// RequestTimeout of receipt, measured on this node's monotonic
		// clock (a request or go-ahead that waited in the buffers of a
		// stopped process is refused, whatever the clocks say).
		wait := min(m.cfg.RequestTimeout, budget)
		t := time.NewTimer(wait)
		select {
		case <-s.go_:
		case <-t.C:
		case <-m.done:
		}
		t.Stop()
		m.callMu.Lock()
		ok := s.committed
		m.callMu.Unlock()
		if !ok || time.Since(received) > wait {
			m.log.Warn("mesh: no go-ahead in time; request not served", "from", w.from, "kind", w.text, "waited", time.Since(received))
			m.reply(s, nil, fmt.Errorf("not_committed: no go-ahead from %s within %v of receipt; nothing was done", w.from, wait))
			return
		}
	}
	out, err := m.dispatch(ctx, w.from, w.text, w.payload)
	m.reply(s, out, err)
}

// dispatch serves the reserved kinds and hands the rest to the Handler.
func (m *Mesh) dispatch(ctx context.Context, from, kind string, payload []byte) (out []byte, err error) {
	switch kind {
	case KindQuorumAck:
		return nil, nil
	case KindCatalog:
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.catBytes, nil
	case KindLeave:
		if from != m.cfg.NodeName {
			m.markLeft(from)
		}
		return nil, nil
	}
	if m.h == nil {
		return nil, errors.New("this node serves no mesh requests")
	}
	defer func() {
		if p := recover(); p != nil {
			m.log.Error("mesh: handler panic", "kind", kind, "from", from, "panic", p)
			out, err = nil, fmt.Errorf("handler panic: %v", p)
		}
	}()
	return m.h(ctx, from, kind, payload)
}

// replyTo is the requester's reply address as a memberlist node.
func (m *Mesh) replyTo(w message) *memberlist.Node {
	host, ps, perr := net.SplitHostPort(w.addr)
	port, _ := strconv.Atoi(ps)
	ip := net.ParseIP(host)
	if perr != nil || ip == nil || port <= 0 || port > 65535 {
		m.log.Warn("mesh: request without a valid reply address", "from", w.from, "addr", w.addr)
		return nil
	}
	return &memberlist.Node{Name: w.from, Addr: ip, Port: uint16(port)}
}

// control sends a msgAck (owner) for request w, within RequestTimeout.
func (m *Mesh) control(w message, typ byte) {
	to := m.replyTo(w)
	if to == nil {
		return
	}
	ctx, cancel := context.WithTimeout(m.ctx, m.cfg.RequestTimeout)
	defer cancel()
	msg := (&message{typ: typ, id: w.id, from: m.cfg.NodeName}).encode()
	if d := m.deliver(ctx, to, msg, nil, false, false); !d.sent {
		m.log.Debug("mesh: acknowledgement not delivered", "to", w.from, "err", d.err)
	}
}

// reply sends the answer to s back to its sender's reply address, retrying
// within the request's budget (at least RequestTimeout).
func (m *Mesh) reply(s *serving, out []byte, err error) {
	w := s.w
	defer func() {
		m.callMu.Lock()
		s.done = time.Now()
		s.w.payload = nil // kept only to recognise retried attempts
		m.callMu.Unlock()
	}()
	if err == nil && len(out) > MaxPayload {
		err = fmt.Errorf("reply is %d bytes, over the %d-byte limit", len(out), MaxPayload)
	}
	r := message{typ: msgReply, id: w.id, from: m.cfg.NodeName}
	if err != nil {
		r.text = err.Error()
		if r.text == "" {
			r.text = "error"
		}
		if len(r.text) > maxErrorText {
			r.text = r.text[:maxErrorText]
		}
	} else {
		r.payload = out
	}
	to := m.replyTo(w)
	if to == nil {
		return
	}
	ctx, cancel := context.WithTimeout(m.ctx, max(time.Duration(w.budget)*time.Millisecond, m.cfg.RequestTimeout))
	defer cancel()
	if d := m.deliver(ctx, to, r.encode(), nil, false, false); !d.sent {
		m.log.Debug("mesh: reply not delivered", "to", w.from, "err", d.err)
	}
}
