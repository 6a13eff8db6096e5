package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/physd/physd/discovery"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mesh"
)

// mdnsBrowseWait is how long one mDNS browse collects answers.
const mdnsBrowseWait = time.Second

// mdnsSettings is network.mesh.mdns with --mdns-interface applied; where
// names the interface's origin for errors ("file:line:col:
// network.mesh.mdns.interface" or "--mdns-interface").
func mdnsSettings(iface string, m *manifest.Manifest) (md manifest.MDNS, where string) {
	md = m.Network.Mesh.MDNS
	where = md.Pos.String() + ": " + md.Field
	if iface != "" {
		if !md.Enabled && md.Field == "" { // no mdns: block
			md = manifest.DefaultMDNS()
		}
		md.Enabled, md.Interface, where = true, iface, "physd run: --mdns-interface "+iface
	}
	return md, where
}

// CheckMDNS is preflight's mDNS check: the interface exists on this host,
// is up and has an IPv4 address, and carries the mesh's address (peers
// that find this gateway there must be able to reach its mesh).
func CheckMDNS(iface string, m *manifest.Manifest) error {
	md, where := mdnsSettings(iface, m)
	if !md.Enabled {
		return nil
	}
	fix := "name an interface of this host (ip -br addr lists them) in network.mesh.mdns.interface or with --mdns-interface, or remove the mdns: block"
	ifi, ips, err := discovery.Interface(md.Interface)
	if err != nil {
		return fmt.Errorf("%s: %v; fix: %s", where, err, fix)
	}
	ms := m.Network.Mesh
	if !ms.Enabled {
		return nil
	}
	addr, key := ms.AdvertiseAddr, "network.mesh.advertise"
	if addr == "" {
		addr, key = ms.Bind, "network.mesh.bind"
	}
	if ip := net.ParseIP(addr); ip != nil && !discovery.OnInterface(ifi, ips, ip) {
		return fmt.Errorf("%s: %s does not carry the mesh address %s (%s), so gateways that find this one on %s could not join its mesh; fix: bind the mesh to an address of %s (%s, with key_file or key_env), or set mDNS to the interface that carries %s",
			where, md.Interface, addr, key, md.Interface, md.Interface, joinIPs(ips), addr)
	}
	return nil
}

func joinIPs(ips []net.IP) string {
	s := ""
	for i, ip := range ips {
		if i > 0 {
			s += " or "
		}
		s += ip.String()
	}
	return s
}

// mdnsService is physd run's mDNS: the advertiser and the discovery loop.
// The zero value (mDNS off) does nothing; Found is safe before start.
type mdnsService struct {
	mu     sync.Mutex
	adv    *discovery.Advertiser
	disc   *discovery.Discoverer
	cancel context.CancelFunc
	done   chan struct{}
}

// start advertises the gateway (MCP at mcpAddr, nil over stdio only; the
// mesh site, nil without one) and starts discovery when seed_peers is
// empty. Nothing happens when mDNS is off. When ctx ends (SIGTERM) the
// goodbye goes out at once, before the listeners drain.
func (s *mdnsService) start(ctx context.Context, iface string, m *manifest.Manifest, site *mesh.Mesh, mcpAddr net.Addr, tls bool, log *slog.Logger) error {
	md, _ := mdnsSettings(iface, m)
	if !md.Enabled {
		return nil
	}
	ifi, ifIPs, err := discovery.Interface(md.Interface)
	if err != nil {
		return fmt.Errorf("mdns: %w", err)
	}
	rec := discovery.Record{DeviceID: m.Device.ID, PhysMCPVersion: m.PhysMCPVersion, Zone: m.Device.Location.Zone}
	var ips []net.IP
	if site != nil {
		host, port, _ := net.SplitHostPort(site.SelfAddr())
		rec.MeshPort, _ = strconv.Atoi(port)
		rec.MeshLabel = m.Network.Mesh.Label
		if ip := net.ParseIP(host); ip != nil {
			ips = []net.IP{ip}
		}
	}
	if tcp, ok := mcpAddr.(*net.TCPAddr); ok {
		rec.MCPPort, rec.MCPPath, rec.TLS = tcp.Port, "/mcp", tls
		if !tcp.IP.IsUnspecified() {
			if ips == nil && discovery.OnInterface(ifi, ifIPs, tcp.IP) {
				ips = []net.IP{tcp.IP}
			}
			if len(ips) == 0 || !ips[0].Equal(tcp.IP) {
				rec.MCPHost = tcp.IP.String()
			}
		}
	}
	if ips == nil {
		ips = ifIPs
	}
	srvPort := rec.MCPPort
	if srvPort == 0 {
		srvPort = rec.MeshPort
	}
	ms := m.Network.Mesh
	ms.MDNS = md
	discover := site != nil && ms.MDNSDiscovery()
	if srvPort == 0 && !discover {
		log.Warn("mdns: nothing to advertise (MCP on stdio only and no mesh)", "interface", md.Interface)
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	context.AfterFunc(ctx, s.Close)
	if md.Advertise && srvPort != 0 {
		if s.adv, err = discovery.Advertise(discovery.AdvertiseConfig{Interface: ifi, IPs: ips, Record: rec, Port: srvPort, Logger: log}); err != nil {
			return err
		}
	}
	if discover {
		s.disc = &discovery.Discoverer{
			Self: discovery.Self{ID: m.Device.ID, MeshAddr: site.SelfAddr(), Label: m.Network.Mesh.Label, Link: discovery.Link(ifi)},
			Mesh: meshJoiner{site},
			Browse: func(ctx context.Context) ([]discovery.Gateway, error) {
				return discovery.Browse(ctx, ifi, mdnsBrowseWait)
			},
			Interval: time.Duration(md.BrowseIntervalMS) * time.Millisecond,
			Healing:  func() bool { return site.PartitionState() != mesh.Healthy },
			Logger:   log.With("component", "mdns", "interface", md.Interface),
		}
		dctx, cancel := context.WithCancel(context.Background())
		s.cancel, s.done = cancel, make(chan struct{})
		go func() { defer close(s.done); s.disc.Run(dctx) }()
		log.Info("mdns: discovering gateways to join", "interface", md.Interface, "every", s.disc.Interval.String())
	}
	return nil
}

// Close sends the advertiser's goodbye, then stops discovery (a round
// under way ends within its browse wait and the mesh's join timeout).
func (s *mdnsService) Close() {
	s.mu.Lock()
	adv, cancel, done := s.adv, s.cancel, s.done
	s.adv, s.cancel = nil, nil
	s.mu.Unlock()
	if adv != nil {
		_ = adv.Close()
	}
	if cancel != nil {
		cancel()
		<-done
	}
}

// Found lists the gateways discovery has seen (nil without discovery).
func (s *mdnsService) Found() []discovery.Found {
	s.mu.Lock()
	d := s.disc
	s.mu.Unlock()
	if d == nil {
		return nil
	}
	return d.Found()
}

// meshJoiner is the mesh as discovery uses it.
type meshJoiner struct{ m *mesh.Mesh }

func (j meshJoiner) Live() map[string]bool {
	out := map[string]bool{}
	for _, mem := range j.m.Members() {
		if mem.State == mesh.StateAlive || mem.State == mesh.StateSuspect {
			out[mem.Name] = true
		}
	}
	return out
}

func (j meshJoiner) Join(targets []string) int { return j.m.Join(targets) }
