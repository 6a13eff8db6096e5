package mesh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Request sends payload to node and waits for its reply, over memberlist's
// reliable (TCP, encrypted, labelled) channel. The deadline is ctx's, or
// RequestTimeout when ctx has none; the remote handler gets the time left
// as its own deadline. A reply arriving after the deadline is dropped and
// counted (LateDropped). Errors wrap ErrUnknownNode, ErrNodeNotAlive,
// ErrUnreachable, ErrTimeout, ErrTooLarge or ErrShutdown, or are a
// *RemoteError carrying the remote handler's error text. A request to this
// node itself calls the handler directly.
func (m *Mesh) Request(ctx context.Context, node, kind string, payload []byte) ([]byte, error) {
	return m.request(ctx, node, kind, payload, nil)
}

func (m *Mesh) request(ctx context.Context, node, kind string, payload []byte, late *atomic.Int64) ([]byte, error) {
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
	budget := time.Until(deadline)
	if budget <= 0 || ctx.Err() != nil {
		return nil, m.ctxError(ctx, node, kind)
	}
	id := m.nextID.Add(1)
	c := &call{node: node, ch: make(chan result, 1), late: late}
	m.callMu.Lock()
	m.calls[id] = c
	m.callMu.Unlock()
	msg := (&message{
		typ: msgRequest, id: id, from: m.cfg.NodeName, addr: m.SelfAddr(), text: kind,
		budget: uint64(max(budget.Milliseconds(), 1)), payload: payload,
	}).encode()
	if !m.spawn(func() {
		if err := m.list.SendReliable(target, msg); err != nil {
			m.finish(id, result{err: fmt.Errorf("%w: %s: %v", ErrUnreachable, node, err)})
		}
	}) {
		m.forget(id)
		return nil, ErrShutdown
	}
	select {
	case r := <-c.ch:
		if re, ok := r.err.(*RemoteError); ok {
			re.Kind = kind
		}
		if r.err != nil && !r.reply && errors.Is(r.err, ErrUnreachable) {
			m.suspectPeer(node)
		}
		return r.payload, r.err
	case <-ctx.Done():
		m.abandon(id)
		return nil, m.ctxError(ctx, node, kind)
	case <-m.done:
		m.forget(id)
		return nil, ErrShutdown
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
		state := "dead"
		if p.left {
			state = "left"
		}
		return nil, fmt.Errorf("%w: %s is %s", ErrNodeNotAlive, node, state)
	default:
		return nil, fmt.Errorf("%w: %s", ErrUnknownNode, node)
	}
}

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
	late = new(atomic.Int64)
	replies, errs = map[string][]byte{}, map[string]error{}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.cfg.RequestTimeout)
		defer cancel()
	}
	type res struct {
		node string
		b    []byte
		err  error
	}
	seen := map[string]bool{}
	ch := make(chan res, len(nodes))
	n := 0
	for _, node := range nodes {
		if seen[node] {
			continue
		}
		seen[node] = true
		n++
		if !m.spawn(func() {
			b, err := m.request(ctx, node, kind, payload, late)
			ch <- res{node, b, err}
		}) {
			ch <- res{node, nil, ErrShutdown}
		}
	}
	for range n {
		r := <-ch
		if r.err != nil {
			errs[r.node] = r.err
		} else {
			replies[r.node] = r.b
		}
	}
	return replies, errs, late
}

// Quorum counts the nodes that are reachable now: this node (1) plus every
// live member (alive or suspect in the membership view) that answers a
// fresh quorum_ack request within RequestTimeout (or ctx's deadline if
// sooner). It never trusts the membership view alone: a member the view
// still lists as alive counts only if it answers. With need > 0 it returns
// as soon as need is reached (then alive ≥ need); otherwise, or when need
// is not reached, it returns the full count at the deadline. A member that
// fails to ack is marked suspect. Its signature is policy.QuorumFunc's.
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
	ctx, cancel := context.WithTimeout(ctx, m.cfg.RequestTimeout)
	defer cancel()
	acks := make(chan bool, len(peers))
	for _, name := range peers {
		if !m.spawn(func() {
			_, err := m.request(ctx, name, KindQuorumAck, nil, nil)
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

// onMessage handles a user message from memberlist (it must not block).
func (m *Mesh) onMessage(buf []byte) {
	w, err := decodeMessage(buf)
	if err != nil {
		m.log.Warn("mesh: dropping a malformed message", "bytes", len(buf))
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
	case msgRequest:
		select {
		case m.handlerSem <- struct{}{}:
		default:
			m.spawn(func() { m.reply(w, nil, errors.New("busy: too many concurrent requests")) })
			return
		}
		if !m.spawn(func() {
			defer func() { <-m.handlerSem }()
			m.serve(w)
		}) {
			<-m.handlerSem
		}
	}
}

func (m *Mesh) serve(w message) {
	budget := time.Duration(w.budget) * time.Millisecond
	budget = min(max(budget, time.Millisecond), 10*time.Minute)
	ctx, cancel := context.WithTimeout(m.ctx, budget)
	defer cancel()
	out, err := m.dispatch(ctx, w.from, w.text, w.payload)
	m.reply(w, out, err)
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

// reply sends the answer to w back to its sender's reply address.
func (m *Mesh) reply(w message, out []byte, err error) {
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
	host, ps, perr := net.SplitHostPort(w.addr)
	port, _ := strconv.Atoi(ps)
	ip := net.ParseIP(host)
	if perr != nil || ip == nil || port <= 0 || port > 65535 {
		m.log.Warn("mesh: request without a valid reply address", "from", w.from, "addr", w.addr)
		return
	}
	to := &memberlist.Node{Name: w.from, Addr: ip, Port: uint16(port)}
	if err := m.list.SendReliable(to, r.encode()); err != nil {
		m.log.Debug("mesh: reply not delivered", "to", w.from, "err", err)
	}
}
