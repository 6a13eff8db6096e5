package audit

import "fmt"

// Reserve is the room an actuation needs in the audit trail before it may
// touch a device: several do_ lines (each at most a few KiB) with margin.
const Reserve = 256 << 10

// Headroom reports whether the next need bytes of records certainly fit:
// the file system holding the trail has them free (for unprivileged
// writers), and the process's file-size limit (RLIMIT_FSIZE) leaves room
// in the current file. After a failed append a small check line may still
// fit where a do_ line does not; the node asks this before every
// actuation, so it never moves a device it could not record.
func (l *Log) Headroom(need int64) error {
	l.mu.Lock()
	dir, size := l.dir, l.size
	l.mu.Unlock()
	if free, ok := fsFree(dir); ok && free < need {
		return fmt.Errorf("the audit's file system has %d bytes free, under the %d kept for the next actuations' records (free space on %s)", free, need, dir)
	}
	if limit, ok := fileSizeLimit(); ok && size+need > limit {
		return fmt.Errorf("the audit file is %d bytes and the process's file-size limit (RLIMIT_FSIZE) is %d: no room for the next actuations' records (raise the limit, or lower the audit's rotation size)", size, limit)
	}
	return nil
}
