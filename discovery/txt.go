package discovery

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Service is the DNS-SD service type physd advertises and browses.
const Service = "_physmcp._tcp"

// TXT keys (RFC 6763 §6: key=value, keys compared case-insensitively).
const (
	keyTxtVers   = "txtvers"
	keyID        = "id"
	keyVersion   = "physmcp_version"
	keyMCPPort   = "mcp_port"
	keyMCPPath   = "mcp_path"
	keyMCPHost   = "mcp_host"
	keyTLS       = "tls"
	keyMeshPort  = "mesh_port"
	keyMeshLabel = "mesh_label"
	keyZone      = "zone"
)

// txtVersion is the version of the TXT layout below.
const txtVersion = "1"

// Record is what a gateway advertises in its TXT record.
type Record struct {
	// DeviceID is the manifest's device.id (also the instance name).
	DeviceID       string `json:"id"`
	PhysMCPVersion string `json:"physmcp_version"`
	// MCPPort, MCPPath and TLS say where MCP is served over HTTP (0: not
	// over HTTP); MCPHost is the listener's address when it is a specific
	// address other than the one advertised (e.g. 127.0.0.1).
	MCPPort int    `json:"mcp_port,omitempty"`
	MCPPath string `json:"mcp_path,omitempty"`
	MCPHost string `json:"mcp_host,omitempty"`
	TLS     bool   `json:"tls"`
	// MeshPort is the mesh (memberlist) port at the advertised address;
	// 0 when the gateway runs no mesh. MeshLabel is its site label.
	MeshPort  int    `json:"mesh_port,omitempty"`
	MeshLabel string `json:"mesh_label,omitempty"`
	Zone      string `json:"zone,omitempty"`
}

// TXT encodes r as TXT strings, in a fixed order.
func (r Record) TXT() []string {
	out := []string{keyTxtVers + "=" + txtVersion, keyID + "=" + r.DeviceID, keyVersion + "=" + r.PhysMCPVersion}
	if r.MCPPort > 0 {
		out = append(out, keyMCPPort+"="+strconv.Itoa(r.MCPPort), keyMCPPath+"="+r.MCPPath, keyTLS+"="+strconv.FormatBool(r.TLS))
		if r.MCPHost != "" {
			out = append(out, keyMCPHost+"="+r.MCPHost)
		}
	}
	if r.MeshPort > 0 {
		out = append(out, keyMeshPort+"="+strconv.Itoa(r.MeshPort))
		if r.MeshLabel != "" {
			out = append(out, keyMeshLabel+"="+r.MeshLabel)
		}
	}
	if r.Zone != "" {
		out = append(out, keyZone+"="+r.Zone)
	}
	return out
}

// Validate checks what TXT would carry: an id, ports in range, and no
// string longer than a TXT string can hold (255 bytes).
func (r Record) Validate() error {
	var errs []error
	if r.DeviceID == "" {
		errs = append(errs, errors.New("no device id"))
	}
	if r.MCPPort < 0 || r.MCPPort > 65535 {
		errs = append(errs, fmt.Errorf("mcp_port %d out of range", r.MCPPort))
	}
	if r.MeshPort < 0 || r.MeshPort > 65535 {
		errs = append(errs, fmt.Errorf("mesh_port %d out of range", r.MeshPort))
	}
	for _, s := range r.TXT() {
		if len(s) > 255 {
			k, _, _ := strings.Cut(s, "=")
			errs = append(errs, fmt.Errorf("TXT %s is %d bytes, more than 255", k, len(s)))
		}
	}
	return errors.Join(errs...)
}

// ParseTXT decodes a TXT record. Unknown keys are ignored (a later physd
// may add some); a txtvers other than 1, a missing id, a key given twice
// or a port or tls value that does not parse is an error.
func ParseTXT(txt []string) (Record, error) {
	var r Record
	seen := map[string]bool{}
	for _, s := range txt {
		k, v, hasValue := strings.Cut(s, "=")
		k = strings.ToLower(k)
		if k == "" {
			continue // RFC 6763 §6.4: a string without a key is ignored
		}
		if seen[k] {
			return Record{}, fmt.Errorf("TXT key %s given twice", k)
		}
		seen[k] = true
		var err error
		switch k {
		case keyTxtVers:
			if v != txtVersion {
				return Record{}, fmt.Errorf("TXT txtvers=%s: this physd reads version %s", v, txtVersion)
			}
		case keyID:
			r.DeviceID = v
		case keyVersion:
			r.PhysMCPVersion = v
		case keyMCPPort:
			r.MCPPort, err = parsePort(k, v)
		case keyMCPPath:
			r.MCPPath = v
		case keyMCPHost:
			r.MCPHost = v
		case keyTLS:
			if !hasValue {
				r.TLS = true // RFC 6763 §6.4: a key alone is a boolean true
			} else if r.TLS, err = strconv.ParseBool(v); err != nil {
				err = fmt.Errorf("TXT tls=%q is not true or false", v)
			}
		case keyMeshPort:
			r.MeshPort, err = parsePort(k, v)
		case keyMeshLabel:
			r.MeshLabel = v
		case keyZone:
			r.Zone = v
		}
		if err != nil {
			return Record{}, err
		}
	}
	if r.DeviceID == "" {
		return Record{}, errors.New("TXT has no id")
	}
	return r, nil
}

func parsePort(k, v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("TXT %s=%q is not a port (1..65535)", k, v)
	}
	return n, nil
}

func itoa(n int) string { return strconv.Itoa(n) }
