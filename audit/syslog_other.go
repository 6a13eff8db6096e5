//go:build !unix

package audit

import "errors"

// dialSyslog: Go's log/syslog exists on Unix only.
func dialSyslog(string, string) (func([]byte) error, func() error, error) {
	return nil, nil, errors.New("syslog is not available on this platform; fix: use audit.remote_sink type: http")
}
