package mesh

import (
	"context"
	"log"
	"log/slog"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// delegate implements memberlist's Delegate, EventDelegate,
// ConflictDelegate and PingDelegate. memberlist calls the event and
// conflict methods while holding its node lock: they only touch the mesh's
// own state and never call back into memberlist.
type delegate struct{ m *Mesh }

var (
	_ memberlist.Delegate         = (*delegate)(nil)
	_ memberlist.EventDelegate    = (*delegate)(nil)
	_ memberlist.ConflictDelegate = (*delegate)(nil)
	_ memberlist.PingDelegate     = (*delegate)(nil)
)

// NodeMeta carries only the catalog hash (the 512-byte limit rules out the
// catalog itself).
func (d *delegate) NodeMeta(limit int) []byte {
	d.m.mu.Lock()
	b := encodeMeta(d.m.cat.Hash)
	d.m.mu.Unlock()
	if len(b) > limit {
		return nil
	}
	return b
}

// NotifyMsg receives requests and replies sent with SendReliable.
func (d *delegate) NotifyMsg(b []byte) {
	if len(b) == 0 || len(b) > maxMessage {
		d.m.log.Warn("mesh: dropping an oversized or empty message", "bytes", len(b))
		return
	}
	d.m.onMessage(append([]byte(nil), b...))
}

// GetBroadcasts: the mesh sends nothing by gossip besides memberlist's own.
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState is the push/pull payload: catalogs.
func (d *delegate) LocalState(join bool) []byte { return d.m.localState() }

// MergeRemoteState stores the catalogs a peer holds whose hashes match
// what their owners gossip.
func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	if len(buf) > 0 {
		d.m.mergeState(buf)
	}
}

func (d *delegate) NotifyJoin(n *memberlist.Node)   { d.m.peerUp(n, true) }
func (d *delegate) NotifyUpdate(n *memberlist.Node) { d.m.peerUp(n, false) }
func (d *delegate) NotifyLeave(n *memberlist.Node)  { d.m.peerDown(n) }

// NotifyConflict: memberlist has already refused the second claimant of a
// name; make that loud, and stop this node if it is the newcomer.
func (d *delegate) NotifyConflict(existing, other *memberlist.Node) {
	if existing.Name == d.m.cfg.NodeName {
		d.m.selfConflict(existing, other)
		return
	}
	d.m.log.Error("mesh: DUPLICATE NODE ID refused: a second node claims a member's id",
		"node", existing.Name, "member_addr", existing.Address(), "refused_addr", other.Address())
}

func (d *delegate) AckPayload() []byte { return nil }

// NotifyPingComplete: a direct probe of other succeeded.
func (d *delegate) NotifyPingComplete(other *memberlist.Node, rtt time.Duration, payload []byte) {
	d.m.sawPeer(other.Name)
}

// memberlistLogger routes memberlist's log.Logger output through slog
// (slog.NewLogLogger), mapping its "[DEBUG]/[INFO]/[WARN]/[ERR]" prefixes
// to slog levels. It also watches for the failed-probe line: memberlist
// exposes no suspect state in its API, and "Suspect X has failed" is the
// moment this node starts suspecting X.
func memberlistLogger(l *slog.Logger, m *Mesh) *log.Logger {
	h := &mlHandler{inner: l.Handler(), m: m}
	return slog.NewLogLogger(h.withAttrs([]slog.Attr{slog.String("component", "memberlist"), slog.String("node", m.cfg.NodeName)}), slog.LevelInfo)
}

type mlHandler struct {
	inner slog.Handler
	m     *Mesh
}

func (h *mlHandler) withAttrs(as []slog.Attr) *mlHandler {
	return &mlHandler{inner: h.inner.WithAttrs(as), m: h.m}
}

func (h *mlHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *mlHandler) WithAttrs(as []slog.Attr) slog.Handler { return h.withAttrs(as) }

func (h *mlHandler) WithGroup(name string) slog.Handler {
	return &mlHandler{inner: h.inner.WithGroup(name), m: h.m}
}

func (h *mlHandler) Handle(ctx context.Context, r slog.Record) error {
	msg, level := r.Message, slog.LevelInfo
	for _, p := range []struct {
		prefix string
		level  slog.Level
	}{{"[DEBUG] ", slog.LevelDebug}, {"[INFO] ", slog.LevelInfo}, {"[WARN] ", slog.LevelWarn}, {"[ERR] ", slog.LevelError}, {"[ERROR] ", slog.LevelError}} {
		if strings.HasPrefix(msg, p.prefix) {
			msg, level = msg[len(p.prefix):], p.level
			break
		}
	}
	msg = strings.TrimPrefix(msg, "memberlist: ")
	if rest, ok := strings.CutPrefix(msg, "Suspect "); ok {
		if name, ok := strings.CutSuffix(rest, " has failed, no acks received"); ok {
			h.m.probeFailed(name)
		}
	}
	if !h.inner.Enabled(ctx, level) {
		return nil
	}
	nr := slog.NewRecord(r.Time, level, msg, r.PC)
	r.Attrs(func(a slog.Attr) bool { nr.AddAttrs(a); return true })
	return h.inner.Handle(ctx, nr)
}
