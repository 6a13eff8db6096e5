package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrGap is returned by ReadAfter when the next line's seq is not the one
// expected: a file rotated between the listing and the read (read again),
// or a damaged line (Verify names it).
type ErrGap struct{ Want, Got uint64 }

func (e *ErrGap) Error() string {
	return fmt.Sprintf("audit: expected seq %d, found %d", e.Want, e.Got)
}

// Seq is the sequence number of the last record on disk (fsynced).
func (l *Log) Seq() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq
}

// ReadAfter calls fn, in order, with the exact bytes (without the
// newline) of every complete line whose seq is after `after` and at most
// the last fsynced one, until fn returns an error (returned) or the
// lines end. The seqs it hands out are consecutive from after+1; a line
// that breaks the run ends the read with *ErrGap. It reads the files
// (rotated first) with one line in memory at a time, starting at the
// newest file whose first record is at most after+1, so a reader that
// is hours behind costs no more memory than one that is not.
func (l *Log) ReadAfter(after uint64, fn func(seq uint64, line []byte) error) error {
	l.mu.Lock()
	files := append(l.rotated(), l.path)
	upTo := l.seq
	l.mu.Unlock()
	if upTo <= after {
		return nil
	}
	start := 0
	for i := len(files) - 1; i > 0; i-- {
		if first, ok := firstSeq(files[i]); ok && first <= after+1 {
			start = i
			break
		}
	}
	next := after + 1
	for i, name := range files[start:] {
		var from readPos
		if i == 0 {
			from = l.resumeAt(name, next)
		}
		done, err := readLines(name, from, &next, upTo, fn, l.remember)
		if err != nil || done {
			return err
		}
	}
	return nil
}

// firstSeq is the seq of a file's first line.
func firstSeq(name string) (uint64, bool) {
	f, err := os.Open(name)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	line, err := bufio.NewReaderSize(f, 4096).ReadBytes('\n')
	if err != nil {
		return 0, false
	}
	var r struct {
		Seq uint64 `json:"seq"`
	}
	if json.Unmarshal(line, &r) != nil {
		return 0, false
	}
	return r.Seq, true
}

// readPos is a line boundary of a file and the seq of the line there.
type readPos struct {
	name string
	file os.FileInfo // the file itself: a rotation puts another under name
	off  int64
	seq  uint64
}

// resumeAt is where the line of seq next starts in name, when the last
// read stopped there; else the zero position (the file's start).
func (l *Log) resumeAt(name string, next uint64) readPos {
	l.readMu.Lock()
	defer l.readMu.Unlock()
	if l.readAt.name == name && l.readAt.seq == next {
		return l.readAt
	}
	return readPos{}
}

func (l *Log) remember(p readPos) {
	l.readMu.Lock()
	l.readAt = p
	l.readMu.Unlock()
}

// readLines hands fn the lines of name from the remembered position from
// (a line boundary of this very file, or the zero position: its start) and
// calls mark with the position after each line handed out. A position in
// another file under the name (it rotated), or whose line is not the one
// expected, is read again from the start.
func readLines(name string, from readPos, next *uint64, upTo uint64, fn func(uint64, []byte) error, mark func(readPos)) (bool, error) {
	f, err := os.Open(name)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil // pruned or rotated away meanwhile
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, err
	}
	off := from.off
	if from.file == nil || !os.SameFile(fi, from.file) {
		off = 0
	}
	if off > 0 {
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return false, err
		}
	}
	br := bufio.NewReaderSize(f, 64<<10)
	for first := off > 0; ; first = false {
		line, err := br.ReadBytes('\n')
		if err == io.EOF {
			return false, nil // the end, or a line still being written
		}
		if err != nil {
			return false, err
		}
		off += int64(len(line))
		line = bytes.TrimSuffix(line, []byte{'\n'})
		var r struct {
			Seq uint64 `json:"seq"`
		}
		if first && (json.Unmarshal(line, &r) != nil || r.Seq != *next) {
			return readLines(name, readPos{}, next, upTo, fn, mark)
		}
		if json.Unmarshal(line, &r) != nil {
			continue
		}
		if r.Seq < *next {
			continue
		}
		if r.Seq > upTo {
			return true, nil
		}
		if r.Seq != *next {
			return true, &ErrGap{Want: *next, Got: r.Seq}
		}
		if err := fn(r.Seq, line); err != nil {
			return true, err
		}
		*next++
		mark(readPos{name: name, file: fi, off: off, seq: *next})
		if *next > upTo {
			return true, nil
		}
	}
}
