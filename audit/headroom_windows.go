package audit

import "golang.org/x/sys/windows"

// fsFree is the space the caller may still use on dir's volume.
func fsFree(dir string) (int64, bool) {
	p, err := windows.UTF16PtrFromString(dir)
	if err != nil {
		return 0, false
	}
	var avail uint64
	if err := windows.GetDiskFreeSpaceEx(p, &avail, nil, nil); err != nil {
		return 0, false
	}
	return int64(avail), true
}

// fileSizeLimit: Windows has no per-process file-size limit.
func fileSizeLimit() (int64, bool) { return 0, false }
