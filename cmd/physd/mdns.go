package main

import (
	"flag"
	"time"
)

// mdnsBrowseWait is how long one mDNS browse collects answers.
const mdnsBrowseWait = time.Second

// mdnsFlags are physd run's mDNS flags.
type mdnsFlags struct{ iface string }

func (f *mdnsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.iface, "mdns-interface", "", "mDNS: advertise this gateway (_physmcp._tcp) and, without seed_peers, find and join the site's gateways on this one interface (e.g. eth0; lo keeps it on this host); turns mDNS on and overrides network.mesh.mdns.interface")
}
