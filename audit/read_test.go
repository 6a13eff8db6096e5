package audit

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestReadAfter(t *testing.T) {
	dir := t.TempDir()
	l, err := OpenWith(dir, Options{MaxBytes: 600}) // a few lines a file
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := 0; i < 40; i++ {
		if _, err := l.Append(&Record{Event: "do", Tool: "do_x", Reason: "r"}); err != nil {
			t.Fatal(err)
		}
	}
	if len(l.rotated()) < 3 {
		t.Fatalf("want rotated files, got %d", len(l.rotated()))
	}
	var all [][]byte
	if err := l.Scan(func(Record) bool { return true }); err != nil {
		t.Fatal(err)
	}
	for _, name := range append(l.rotated(), l.path) {
		b, _ := os.ReadFile(name)
		all = append(all, bytes.Split(bytes.TrimSuffix(b, []byte{'\n'}), []byte{'\n'})...)
	}
	for _, after := range []uint64{0, 1, 7, 23, 39, 40, 41} {
		var got []uint64
		err := l.ReadAfter(after, func(seq uint64, line []byte) error {
			if !bytes.Equal(line, all[seq-1]) {
				t.Errorf("after %d: line %d differs from the file", after, seq)
			}
			got = append(got, seq)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		if after < 40 {
			want = int(40 - after)
		}
		if len(got) != want || (want > 0 && (got[0] != after+1 || got[len(got)-1] != 40)) {
			t.Errorf("after %d: got %v", after, got)
		}
	}
	// fn's error ends the read.
	stop := errors.New("stop")
	n := 0
	if err := l.ReadAfter(0, func(uint64, []byte) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Errorf("stop: %v after %d", err, n)
	}
	// A torn tail (a line being written) is not handed out.
	f, _ := os.OpenFile(filepath.Join(dir, "audit.jsonl"), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"seq":41,"event":"do"`)
	f.Close()
	l.seq = 41 // as if counted; the line is still incomplete
	var last uint64
	_ = l.ReadAfter(38, func(seq uint64, _ []byte) error { last = seq; return nil })
	if last != 40 {
		t.Errorf("torn tail: last = %d", last)
	}
}

func TestReadAfterGap(t *testing.T) {
	dir := t.TempDir()
	b := []byte(`{"seq":1,"event":"a"}` + "\n" + `{"seq":3,"event":"b"}` + "\n")
	if err := os.WriteFile(filepath.Join(dir, "audit.jsonl"), b, 0o640); err != nil {
		t.Fatal(err)
	}
	l, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var gap *ErrGap
	if err := l.ReadAfter(0, func(uint64, []byte) error { return nil }); !errors.As(err, &gap) || gap.Want != 2 || gap.Got != 3 {
		t.Errorf("gap: %v", err)
	}
}

// TestReadAfterFollows: a reader that follows the trail record by record,
// across rotations, gets every record once, in order, exactly as written,
// and resumes where it stopped instead of parsing the current file from
// its start each time.
func TestReadAfterFollows(t *testing.T) {
	l, err := OpenWith(t.TempDir(), Options{MaxBytes: 900})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var cursor uint64
	for i := 0; i < 60; i++ {
		if _, err := l.Append(&Record{Event: "do", Tool: "do_x", Reason: "r"}); err != nil {
			t.Fatal(err)
		}
		err := l.ReadAfter(cursor, func(seq uint64, line []byte) error {
			if seq != cursor+1 || !bytes.Contains(line, []byte(`"do_x"`)) {
				t.Fatalf("after %d: seq %d %s", cursor, seq, line)
			}
			cursor = seq
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if cursor != uint64(i+1) {
			t.Fatalf("record %d: the reader is at %d", i+1, cursor)
		}
		if l.readAt.seq != cursor+1 || l.readAt.off == 0 {
			t.Fatalf("record %d: no resume position kept: %+v", i+1, l.readAt)
		}
	}
	if len(l.rotated()) < 3 {
		t.Fatalf("want rotations during the follow, got %d files", len(l.rotated()))
	}
}
