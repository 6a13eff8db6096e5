//go:build unix

package audit

import "syscall"

// fsFree is the space an unprivileged writer may still use on dir's file
// system (ok false when it cannot be asked).
func fsFree(dir string) (int64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(st.Bavail) * int64(st.Bsize), true
}

// fileSizeLimit is the process's RLIMIT_FSIZE (ok false when unlimited).
func fileSizeLimit() (int64, bool) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &rl); err != nil || rl.Cur >= 1<<62 { // RLIM_INFINITY is all ones
		return 0, false
	}
	return int64(rl.Cur), true
}
