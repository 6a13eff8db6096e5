// Package discovery is physd's mDNS (PhysMCP §7.1 bootstrap): it
// advertises this gateway as _physmcp._tcp on one network interface and
// browses that interface for the other gateways of the site, whose mesh
// address it hands to the mesh to join.
//
// The records (PTR, SRV, TXT, A) are hashicorp/mdns's MDNSService zone.
// The sockets are this package's own, for three reasons found in
// hashicorp/mdns v1.0.7: its Server listens on 0.0.0.0:5353 and, with
// Linux's IP_MULTICAST_ALL default, receives and answers queries from
// every interface where any program (avahi on a Raspberry Pi) joined the
// mDNS group, not only the configured one; its Query joins the group on
// the default-route interface whatever QueryParam.Interface says; and it
// sends no announcement at start and no goodbye at stop. Here every
// packet is read with its arrival interface (IP_PKTINFO) and dropped
// unless it came in on the configured interface, every packet sent
// leaves through that interface, the browser joins no group at all (it
// sends one-shot queries from an ephemeral port, answered by unicast,
// RFC 6762 §5.1), and the advertiser announces itself at start and says
// goodbye (TTL 0) at stop. IPv4 only.
//
// Nothing here runs unless the manifest's network.mesh.mdns block (or
// physd run --mdns-interface) turns it on, and the interface defaults to
// loopback.
package discovery
