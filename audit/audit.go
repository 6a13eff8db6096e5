// Package audit writes physd's audit trail: one JSON object per line, each
// fsynced before Append returns, so an actuation the caller was told about
// is on disk. Rotation and retention build on this file layout.
package audit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// Record is one audit line. Fields beyond the common ones go in Data.
type Record struct {
	Seq uint64 `json:"seq"`
	// Prev chains the trail: the lower-case hex SHA-256 of the previous
	// line's exact bytes (without its newline), across rotated files and
	// restarts; GenesisPrev on the very first line. Append sets it.
	Prev           string    `json:"prev,omitempty"`
	Time           time.Time `json:"time"`
	Event          string    `json:"event"` // do, do_refused, do_replay, recovery
	Tool           string    `json:"tool,omitempty"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Caller         string    `json:"caller,omitempty"`
	// Credentials are every credential the caller proved (who the caller
	// is; Caller is how it is shown).
	Credentials []string       `json:"credentials,omitempty"`
	Status      string         `json:"status,omitempty"`
	Permission  string         `json:"permission,omitempty"`
	Requested   any            `json:"requested_value,omitempty"`
	Applied     any            `json:"applied_value,omitempty"`
	Previous    any            `json:"previous_value,omitempty"`
	Reason      string         `json:"reason,omitempty"`
	Data        map[string]any `json:"data,omitempty"`
	// Answer is the exact do_ answer sent to the caller (it carries this
	// record's seq). The fsynced line makes the answer durable: crash
	// recovery replays it byte for byte (node's recovery).
	Answer json.RawMessage `json:"answer,omitempty"`
}

// GenesisPrev is the prev of the first line of a new audit trail.
var GenesisPrev = strings.Repeat("0", 2*sha256.Size)

var genesis [sha256.Size]byte

// Log is an append-only, fsynced JSONL file, rotated by size and by UTC
// day into audit-YYYY-MM-DD[.N].jsonl beside it; rotated files older than
// the retention are deleted.
type Log struct {
	mu   sync.Mutex
	f    *os.File
	dir  string
	path string
	seq  uint64
	buf  []byte
	last [sha256.Size]byte // hash of the last line written: the next line's prev
	size int64
	day  string // UTC day of the records in the current file

	opts Options

	// readAt is where the last ReadAfter stopped (read.go), so that a
	// reader that follows the trail record by record (the fleet uplink)
	// does not parse the current file from its start for every record.
	readMu sync.Mutex
	readAt readPos
}

// Options tune rotation, retention and forwarding.
type Options struct {
	// MaxBytes rotates the current file when it would grow past this
	// (default 64 MiB).
	MaxBytes int64
	// RetentionDays deletes rotated files older than this many days
	// (default 7, the PhysMCP default; 0 keeps the default).
	RetentionDays int
	// Sink, when set, receives every record after it is on disk. It must
	// not block; a slow or broken sink never fails an append.
	Sink Sink
}

// Sink forwards records elsewhere (syslog, HTTP); see NewRemoteSink.
type Sink interface {
	Send(line []byte)
	Close() error
}

// Open opens (creating) dir/audit.jsonl and resumes the sequence number
// from its last complete line. A torn last line (crash mid-write) is cut off
// so the file stays valid JSONL.
func Open(dir string) (*Log, error) { return OpenWith(dir, Options{}) }

// OpenWith is Open with rotation, retention and forwarding options.
func OpenWith(dir string, opts Options) (*Log, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 64 << 20
	}
	if opts.RetentionDays <= 0 {
		opts.RetentionDays = 7
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("audit directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, "audit.jsonl")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("audit log %s: %w", path, err)
	}
	seq, good, last, err := lastSeq(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("audit log %s: %w", path, err)
	}
	if good == 0 {
		// Just rotated (or new): the chain and the numbering continue from
		// the newest rotated file.
		if seq, last, err = lastOfRotated(dir); err != nil {
			f.Close()
			return nil, fmt.Errorf("audit log %s: %w", dir, err)
		}
	}
	if err := f.Truncate(good); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(good, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	l := &Log{f: f, dir: dir, path: path, seq: seq, last: last, size: good, opts: opts}
	l.day = fileDay(f, good)
	l.prune(time.Now())
	return l, nil
}

// fileDay is the UTC day a non-empty file's records belong to (its
// modification time), so a restart on a new day still rotates.
func fileDay(f *os.File, size int64) string {
	if size == 0 {
		return time.Now().UTC().Format(time.DateOnly)
	}
	st, err := f.Stat()
	if err != nil {
		return time.Now().UTC().Format(time.DateOnly)
	}
	return st.ModTime().UTC().Format(time.DateOnly)
}

// rotate renames the current file to audit-<day>[.N].jsonl and starts a
// new one. Called with l.mu held.
func (l *Log) rotate(now time.Time) error {
	if err := l.f.Sync(); err != nil {
		return err
	}
	if err := l.f.Close(); err != nil {
		return err
	}
	name := filepath.Join(l.dir, "audit-"+l.day+".jsonl")
	for i := 1; ; i++ {
		if _, err := os.Stat(name); os.IsNotExist(err) {
			break
		}
		name = filepath.Join(l.dir, fmt.Sprintf("audit-%s.%d.jsonl", l.day, i))
	}
	if err := os.Rename(l.path, name); err != nil {
		return err
	}
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	if d, err := os.Open(l.dir); err == nil { // make the rename durable
		_ = d.Sync()
		d.Close()
	}
	l.f, l.size, l.day = f, 0, now.UTC().Format(time.DateOnly)
	l.prune(now)
	return nil
}

// prune deletes rotated files whose day is past the retention.
func (l *Log) prune(now time.Time) {
	cut := now.UTC().AddDate(0, 0, -l.opts.RetentionDays).Format(time.DateOnly)
	for _, name := range l.rotated() {
		day := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(name), "audit-"), ".jsonl")
		if i := strings.IndexByte(day, '.'); i >= 0 {
			day = day[:i]
		}
		if day < cut {
			_ = os.Remove(name)
		}
	}
}

// rotated lists rotated files, oldest first.
func (l *Log) rotated() []string { return rotatedIn(l.dir) }

func rotatedIn(dir string) []string {
	names, _ := filepath.Glob(filepath.Join(dir, "audit-*.jsonl"))
	sort.Slice(names, func(i, j int) bool { return rotKey(names[i]) < rotKey(names[j]) })
	return names
}

// rotKey orders audit-2026-01-02.jsonl before audit-2026-01-02.1.jsonl.
func rotKey(name string) string {
	base := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(name), "audit-"), ".jsonl")
	day, n, _ := strings.Cut(base, ".")
	return fmt.Sprintf("%s.%06s", day, n)
}

// lastSeq scans for the last complete line; it returns its seq, the
// offset just after it, and its hash (genesis for an empty file).
func lastSeq(f *os.File) (uint64, int64, [sha256.Size]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, 0, genesis, err
	}
	size := st.Size()
	if size == 0 {
		return 0, 0, genesis, nil
	}
	// Read a tail large enough for a few records; more when the last line
	// is longer than the tail.
	for tail := int64(256 << 10); ; tail *= 4 {
		start := max(size-tail, 0)
		buf := make([]byte, size-start)
		if _, err := f.ReadAt(buf, start); err != nil && !errors.Is(err, io.EOF) {
			return 0, 0, genesis, err
		}
		good := int64(len(buf))
		for good > 0 && buf[good-1] != '\n' {
			good--
		}
		if good == 0 && start > 0 {
			continue // no complete line in the tail
		}
		if good == 0 {
			return 0, 0, genesis, nil
		}
		lineStart := int64(bytes.LastIndexByte(buf[:good-1], '\n') + 1)
		if lineStart == 0 && start > 0 {
			continue // the last line began before the tail
		}
		// The highest seq in the tail (a damaged line is skipped here and
		// reported by Verify); the chain links to the last line as it is.
		var seq uint64
		sc := bufio.NewScanner(bytes.NewReader(buf[:good]))
		sc.Buffer(make([]byte, 1<<20), len(buf)+1)
		for sc.Scan() {
			var r struct {
				Seq uint64 `json:"seq"`
			}
			if json.Unmarshal(sc.Bytes(), &r) == nil && r.Seq > seq {
				seq = r.Seq
			}
		}
		return seq, start + good, sha256.Sum256(buf[lineStart : good-1]), nil
	}
}

// lastOfRotated is lastSeq of the newest rotated file (0 and genesis when
// there is none).
func lastOfRotated(dir string) (uint64, [sha256.Size]byte, error) {
	files := rotatedIn(dir)
	if len(files) == 0 {
		return 0, genesis, nil
	}
	f, err := os.Open(files[len(files)-1])
	if err != nil {
		return 0, genesis, err
	}
	defer f.Close()
	seq, _, last, err := lastSeq(f)
	return seq, last, err
}

// Append assigns the next sequence number, writes r as one line and fsyncs.
func (l *Log) Append(r *Record) (uint64, error) {
	return l.AppendFunc(func(uint64) (*Record, error) { return r, nil })
}

// AppendFunc is Append for a record that must contain its own sequence
// number (a do_ answer carries audit.seq): build gets the number the
// record will have and returns the record. It runs under the log's lock;
// it must be quick and must not call the log.
func (l *Log) AppendFunc(build func(seq uint64) (*Record, error)) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return 0, errors.New("audit log is closed")
	}
	r, err := build(l.seq + 1)
	if err != nil {
		return 0, fmt.Errorf("audit record: %w", err)
	}
	r.Seq = l.seq + 1
	r.Prev = hex.EncodeToString(l.last[:])
	if r.Time.IsZero() {
		r.Time = time.Now().UTC()
	}
	b, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("audit record: %w", err)
	}
	l.buf = append(append(l.buf[:0], b...), '\n')
	if day := r.Time.UTC().Format(time.DateOnly); l.size > 0 && (day != l.day || l.size+int64(len(l.buf)) > l.opts.MaxBytes) {
		if err := l.rotate(r.Time); err != nil {
			return 0, fmt.Errorf("audit rotation: %w", err)
		}
	}
	if _, err := l.f.Write(l.buf); err != nil {
		l.cutTorn()
		return 0, fmt.Errorf("audit write: %w", err)
	}
	if err := l.f.Sync(); err != nil {
		l.cutTorn()
		return 0, fmt.Errorf("audit fsync: %w", err)
	}
	l.size += int64(len(l.buf))
	l.seq = r.Seq
	l.last = sha256.Sum256(b)
	if l.opts.Sink != nil {
		l.opts.Sink.Send(append([]byte(nil), l.buf...))
	}
	return r.Seq, nil
}

// cutTorn removes what a failed append may have left after the last
// complete line, so the next append starts a line of its own. Called with
// l.mu held.
func (l *Log) cutTorn() {
	if l.f.Truncate(l.size) == nil {
		_, _ = l.f.Seek(l.size, io.SeekStart)
	}
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
	if l.opts.Sink != nil {
		_ = l.opts.Sink.Close()
	}
	return err
}

// Scan calls fn for every record, rotated files first, oldest first, until
// fn returns false. It is for recovery and tests, not the hot path.
func (l *Log) Scan(fn func(Record) bool) error { return l.ScanSince(time.Time{}, fn) }

// ScanSince is Scan over the files that may hold records written at or
// after since: rotated files last modified before it are skipped.
func (l *Log) ScanSince(since time.Time, fn func(Record) bool) error {
	l.mu.Lock()
	files := append(l.rotated(), l.path)
	l.mu.Unlock()
	for _, name := range files {
		if name != l.path {
			if st, err := os.Stat(name); err == nil && st.ModTime().Before(since) {
				continue
			}
		}
		more, err := scanFile(name, fn)
		if err != nil || !more {
			return err
		}
	}
	return nil
}

func scanFile(name string, fn func(Record) bool) (bool, error) {
	f, err := os.Open(name)
	if err != nil {
		return false, err
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
			return false, nil
		}
	}
	return true, sc.Err()
}
