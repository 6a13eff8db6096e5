package mesh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
)

// Deadlines end to end. memberlist's SendReliable takes no context: it dials
// with its TCPTimeout (10 s on the LAN profile) and writes with no deadline
// at all, so a silent peer (link cut, process stopped) could hold a send for
// 10 s or, once the socket buffer is full, forever. Every stream the mesh
// opens for a request, an acknowledgement, a commit or a reply is therefore
// tagged: the memberlist.Address's Name carries "node\x00tag", memberlist
// hands it to the transport untouched, and the transport below dials with
// the tag's context (net.Dialer.DialContext on the real network) and sets
// the connection's deadline to the tag's deadline before memberlist writes
// the label, header and message. Streams memberlist opens itself (push/pull,
// TCP fallback probes) carry no tag and keep memberlist's own timeouts.

// tagSep separates the node name from the dial tag in Address.Name.
const tagSep = "\x00"

// dialTag is one tagged send: its deadline (ctx) and whether the dial
// connected (after which the message may have been delivered).
type dialTag struct {
	ctx       context.Context
	connected atomic.Bool
}

// dialer wraps the node's transport; see above.
type dialer struct {
	memberlist.NodeAwareTransport
	net *memberlist.NetTransport // the real transport, dialed with DialContext; nil for injected ones

	mu   sync.Mutex
	seq  uint64
	tags map[string]*dialTag
}

func newDialer(t memberlist.NodeAwareTransport) *dialer {
	d := &dialer{NodeAwareTransport: t, tags: map[string]*dialTag{}}
	d.net, _ = t.(*memberlist.NetTransport)
	return d
}

// tag registers a send bounded by ctx and returns the node to pass to
// SendReliable and a release function.
func (d *dialer) tag(ctx context.Context, n *memberlist.Node) (*memberlist.Node, *dialTag, func()) {
	name, t, release := d.tagName(ctx, n.Name)
	cp := *n
	cp.Name = name
	return &cp, t, release
}

// tagName is tag for a bare node name (memberlist's Join takes
// "name/host:port" and passes the name to the dial).
func (d *dialer) tagName(ctx context.Context, name string) (string, *dialTag, func()) {
	d.mu.Lock()
	d.seq++
	key := strconv.FormatUint(d.seq, 36)
	t := &dialTag{ctx: ctx}
	d.tags[key] = t
	d.mu.Unlock()
	return name + tagSep + key, t, func() {
		d.mu.Lock()
		delete(d.tags, key)
		d.mu.Unlock()
	}
}

// joinTagged joins one "[name/]host:port" target with its dial bounded by
// ctx (memberlist's own join dial waits TCPTimeout, 10 s on the LAN
// profile, and would hold Shutdown that long).
func (m *Mesh) joinTagged(ctx context.Context, target string) error {
	name, addr, ok := strings.Cut(target, "/")
	if !ok {
		name, addr = "", target
	}
	tagged, _, release := m.dial.tagName(ctx, name)
	defer release()
	_, err := m.list.Join([]string{tagged + "/" + addr})
	return err
}

// DialAddressTimeout implements memberlist.NodeAwareTransport.
func (d *dialer) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	name, key, tagged := strings.Cut(a.Name, tagSep)
	if !tagged {
		return d.NodeAwareTransport.DialAddressTimeout(a, timeout)
	}
	a.Name = name
	d.mu.Lock()
	t := d.tags[key]
	d.mu.Unlock()
	if t == nil {
		return nil, errors.New("mesh: send abandoned before its dial")
	}
	deadline, ok := t.ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(timeout)
	}
	if err := t.ctx.Err(); err != nil {
		return nil, err
	}
	var (
		c   net.Conn
		err error
	)
	if d.net != nil {
		ctx, cancel := context.WithDeadline(t.ctx, deadline)
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", a.Addr)
		cancel()
	} else {
		c, err = d.NodeAwareTransport.DialAddressTimeout(a, time.Until(deadline))
	}
	if err != nil {
		return nil, err
	}
	// Bound memberlist's writes (label, header, message) by the same deadline.
	if err := c.SetDeadline(deadline); err != nil {
		_ = c.Close()
		return nil, err
	}
	t.connected.Store(true)
	return c, nil
}

// refused reports a dial that reached the peer's host and found nothing
// listening: the peer process is gone, and retrying within the same
// deadline is pointless.
func refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(err.Error(), "connection refused")
}

// newNetTransport builds memberlist's own TCP/UDP transport (as
// memberlist.Create would), so the mesh can wrap it.
func newNetTransport(cfg Config, mc *memberlist.Config) (*memberlist.NetTransport, error) {
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{cfg.BindAddr}, BindPort: cfg.BindPort, Logger: mc.Logger}
	limit := 1
	if cfg.BindPort == 0 {
		limit = 10 // the port must be free on both TCP and UDP: retry the race
	}
	var err error
	for range limit {
		var nt *memberlist.NetTransport
		if nt, err = memberlist.NewNetTransport(nc); err == nil {
			if cfg.BindPort == 0 {
				mc.BindPort = nt.GetAutoBindPort()
				if cfg.AdvertisePort == 0 {
					mc.AdvertisePort = mc.BindPort
				}
			}
			return nt, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, fmt.Errorf("could not set up network transport: %w", err)
}
