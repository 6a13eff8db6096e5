//go:build unix

package discovery

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// reuse lets the advertiser share UDP 5353 with the host's own mDNS
// responder (avahi) and with other physd processes on the same host:
// multicast datagrams reach every socket bound with SO_REUSEADDR.
func reuse(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); serr != nil {
			return
		}
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	})
	if err != nil {
		return err
	}
	return serr
}
