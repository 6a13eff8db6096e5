package store

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// OwnerFile, in the state directory, holds the PID of the physd that holds
// the state database's lock. The lock itself (flock) names no holder, and
// a second physd on the same directory — typically one an MCP client
// started, whose error only the client's log shows — should say which
// process to stop.
const OwnerFile = "physd.pid"

// writeOwner records this process as the lock's holder. It is a hint for
// the error above, never a lock: a failure to write it is ignored (the
// database, already open for writing, is what guards the directory).
func writeOwner(dir string) {
	_ = os.WriteFile(filepath.Join(dir, OwnerFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
}

// removeOwner removes the record on a stop, if it is still this process's.
func removeOwner(dir string) {
	if pid, ok := readOwner(dir); ok && pid == os.Getpid() {
		_ = os.Remove(filepath.Join(dir, OwnerFile))
	}
}

func readOwner(dir string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dir, OwnerFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, err == nil && pid > 0
}

// lockedError says who holds the database at path and the two ways out.
func lockedError(dir, path string) error {
	const other = "or give this one a state directory of its own with --state DIR"
	if pid, ok := readOwner(dir); ok {
		return fmt.Errorf("state database %s is locked by another physd process (PID %d, from %s); fix: stop that physd (kill %d), %s",
			path, pid, filepath.Join(dir, OwnerFile), pid, other)
	}
	return fmt.Errorf("state database %s is locked by another physd process (no %s names it: that physd predates the file; fuser %s shows it); fix: stop that physd, %s",
		path, OwnerFile, path, other)
}
