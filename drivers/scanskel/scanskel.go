// Package scanskel is what the manifest skeletons of every scan share
// (physd scan modbus, scan i2c, scan opcua): the manifest's opening — its
// version, a device whose id and zone a person must decide, and a network
// on loopback without a mesh — and text kept on one line. Each driver
// writes its own buses and capabilities after it.
package scanskel

import (
	"fmt"
	"io"
	"strings"
)

// Opening writes physmcp_version, device and network: deviceType names
// the gateway (modbus_gateway), zone is the zone's DECIDE comment ("where
// the devices are").
func Opening(w io.Writer, deviceID, deviceType, zone string) {
	fmt.Fprintf(w, `physmcp_version: "0.1"

device:
  id: %s   # DECIDE: a unique id for this gateway
  type: %s
  location:
    zone: unassigned   # DECIDE: %s

network:
  protocols:
    - {type: ip, address: 127.0.0.1, mcp_port: 8080, role: native}
  mesh:
    enabled: false

`, deviceID, deviceType, zone)
}

// OneLine keeps text a device or server reported on its comment line:
// control characters (a newline would end the comment) become spaces.
func OneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7F {
			return ' '
		}
		return r
	}, s)
}
