package discovery

import (
	"fmt"
	"net"
	"sort"
	"strings"
)

// Interface looks name up and returns it with its IPv4 addresses. An
// interface this host does not have is an error that lists the ones it
// has; one that is down or has no IPv4 address is an error too.
func Interface(name string) (*net.Interface, []net.IP, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		var names []string
		if all, e := net.Interfaces(); e == nil {
			for _, i := range all {
				names = append(names, i.Name)
			}
		}
		sort.Strings(names)
		return nil, nil, fmt.Errorf("this host has no interface %q (it has: %s)", name, strings.Join(names, ", "))
	}
	if ifi.Flags&net.FlagUp == 0 {
		return nil, nil, fmt.Errorf("interface %s is down", name)
	}
	if ifi.Flags&net.FlagLoopback == 0 && ifi.Flags&net.FlagMulticast == 0 {
		return nil, nil, fmt.Errorf("interface %s does not do multicast (ip link set %s multicast on)", name, name)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, nil, fmt.Errorf("interface %s: %w", name, err)
	}
	var ips []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			ips = append(ips, n.IP.To4())
		}
	}
	if len(ips) == 0 {
		return nil, nil, fmt.Errorf("interface %s has no IPv4 address (physd's mDNS is IPv4)", name)
	}
	return ifi, ips, nil
}

// Link returns the interface's IPv4 subnets (127.0.0.0/8 for a loopback
// interface): where discovered gateways may be.
func Link(ifi *net.Interface) []*net.IPNet {
	if ifi.Flags&net.FlagLoopback != 0 {
		return []*net.IPNet{{IP: net.IPv4(127, 0, 0, 0).To4(), Mask: net.CIDRMask(8, 32)}}
	}
	addrs, _ := ifi.Addrs()
	var out []*net.IPNet
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			out = append(out, &net.IPNet{IP: n.IP.To4().Mask(n.Mask[len(n.Mask)-4:]), Mask: n.Mask[len(n.Mask)-4:]})
		}
	}
	return out
}

// OnInterface reports whether ip is one of the interface's addresses (or,
// on a loopback interface, any loopback address: 127.0.0.2 is lo's too).
func OnInterface(ifi *net.Interface, ips []net.IP, ip net.IP) bool {
	if ifi.Flags&net.FlagLoopback != 0 && ip.IsLoopback() {
		return true
	}
	for _, a := range ips {
		if a.Equal(ip) {
			return true
		}
	}
	return false
}
