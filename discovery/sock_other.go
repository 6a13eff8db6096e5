//go:build !unix

package discovery

import "syscall"

// reuse: SO_REUSEADDR is not set off Unix; 5353 must be free.
func reuse(_, _ string, _ syscall.RawConn) error { return nil }
