// Package audit writes physd's audit trail: one JSON object per line, each
// fsynced before Append returns, so an actuation the caller was told about
// is on disk. Rotation and retention build on this file layout.
package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Record is one audit line. Fields beyond the common ones go in Data.
type Record struct {
	Seq            uint64         `json:"seq"`
	Time           time.Time      `json:"time"`
	Event          string         `json:"event"` // do, do_refused, do_replay, recovery
	Tool           string         `json:"tool,omitempty"`
	IdempotencyKey string         `json:"idempotency_key,omitempty"`
	Caller         string         `json:"caller,omitempty"`
	Status         string         `json:"status,omitempty"`
	Permission     string         `json:"permission,omitempty"`
	Requested      any            `json:"requested_value,omitempty"`
	Applied        any            `json:"applied_value,omitempty"`
	Previous       any            `json:"previous_value,omitempty"`
	Reason         string         `json:"reason,omitempty"`
	Data           map[string]any `json:"data,omitempty"`
}

// Log is an append-only, fsynced JSONL file.
type Log struct {
	mu   sync.Mutex
	f    *os.File
	path string
	seq  uint64
	buf  []byte
}

// Open opens (creating) dir/audit.jsonl and resumes the sequence number
// from its last complete line. A torn last line (crash mid-write) is cut off
// so the file stays valid JSONL.
func Open(dir string) (*Log, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("audit directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, "audit.jsonl")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("audit log %s: %w", path, err)
	}
	seq, good, err := lastSeq(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("audit log %s: %w", path, err)
	}
	if err := f.Truncate(good); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(good, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return &Log{f: f, path: path, seq: seq}, nil
}

// lastSeq scans for the last complete line; it returns its seq and the
// offset just after it.
func lastSeq(f *os.File) (uint64, int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	size := st.Size()
	if size == 0 {
		return 0, 0, nil
	}
	// Read a tail large enough for a few records.
	const tail = 256 << 10
	start := max(size-tail, 0)
	buf := make([]byte, size-start)
	if _, err := f.ReadAt(buf, start); err != nil && !errors.Is(err, io.EOF) {
		return 0, 0, err
	}
	good := int64(len(buf))
	for good > 0 && buf[good-1] != '\n' {
		good--
	}
	var seq uint64
	sc := bufio.NewScanner(bytes.NewReader(buf[:good]))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var r struct {
			Seq uint64 `json:"seq"`
		}
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.Seq > seq {
			seq = r.Seq
		}
	}
	return seq, start + good, nil
}

// Append assigns the next sequence number, writes r as one line and fsyncs.
func (l *Log) Append(r *Record) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return 0, errors.New("audit log is closed")
	}
	r.Seq = l.seq + 1
	if r.Time.IsZero() {
		r.Time = time.Now().UTC()
	}
	b, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("audit record: %w", err)
	}
	l.buf = append(append(l.buf[:0], b...), '\n')
	if _, err := l.f.Write(l.buf); err != nil {
		return 0, fmt.Errorf("audit write: %w", err)
	}
	if err := l.f.Sync(); err != nil {
		return 0, fmt.Errorf("audit fsync: %w", err)
	}
	l.seq = r.Seq
	return r.Seq, nil
}

// Path is the file written.
func (l *Log) Path() string { return l.path }

// Close flushes and closes the file.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// Scan calls fn for every record in the file, oldest first, until fn
// returns false. It is for recovery and tests, not the hot path.
func (l *Log) Scan(fn func(Record) bool) error {
	f, err := os.Open(l.path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var r Record
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		if !fn(r) {
			break
		}
	}
	return sc.Err()
}
