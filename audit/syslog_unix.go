//go:build unix

package audit

import (
	"log/syslog"
	"strings"
)

// dialSyslog connects to syslog (network "" is the local one).
func dialSyslog(network, raddr string) (send func([]byte) error, closeFn func() error, err error) {
	w, err := syslog.Dial(network, raddr, syslog.LOG_NOTICE|syslog.LOG_DAEMON, "physd")
	if err != nil {
		return nil, nil, err
	}
	return func(line []byte) error { return w.Notice(strings.TrimSuffix(string(line), "\n")) }, w.Close, nil
}
