package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// chainedTrail writes 20 records rotated by size and by day, with restarts
// (one right after a rotation, when audit.jsonl is still empty), and
// returns the directory and its files, oldest first.
func chainedTrail(t *testing.T) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	open := func() *Log {
		l, err := OpenWith(dir, Options{MaxBytes: 1200, RetentionDays: 30})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l := open()
	for i := range 20 {
		if _, err := l.Append(&Record{Event: "do", Tool: "do_fan", Reason: strings.Repeat("x", 40)}); err != nil {
			t.Fatal(err)
		}
		switch i {
		case 6: // a restart mid-file
			l.Close()
			l = open()
		case 11: // a crash right after a rotation: audit.jsonl is empty
			l.mu.Lock()
			if err := l.rotate(time.Now()); err != nil {
				t.Fatal(err)
			}
			l.mu.Unlock()
			l.Close()
			l = open()
		}
	}
	l.Close()
	rep, err := Verify(dir)
	if err != nil {
		t.Fatalf("intact chain: %v", err)
	}
	if len(rep.Files) < 4 || rep.Lines != 20 || rep.FirstSeq != 1 || rep.LastSeq != 20 || !rep.FromGenesis || rep.Head == "" {
		t.Fatalf("intact chain report: %+v", rep)
	}
	return dir, rep.Files
}

func TestVerifyIntactChainAcrossRotationAndRestart(t *testing.T) {
	dir, files := chainedTrail(t)
	// A new file's first line links to the previous file's last line.
	first, _ := os.ReadFile(files[1])
	prevFile, _ := os.ReadFile(files[0])
	lines := strings.Split(strings.TrimSuffix(string(prevFile), "\n"), "\n")
	if !strings.Contains(string(first), `"prev":"`+hashHex(lines[len(lines)-1])+`"`) {
		t.Errorf("the first line of %s does not link to the last of %s", files[1], files[0])
	}
	// Restarting on an empty audit.jsonl after a rotation continues seq
	// and chain (no second genesis).
	b, _ := os.ReadFile(filepath.Join(dir, "audit.jsonl"))
	if strings.Contains(string(b), GenesisPrev) {
		t.Error("a restart started a new chain")
	}
}

func hashHex(line string) string {
	l := verifier{rep: &Report{}}
	l.line([]byte(line))
	return hexOf(l.last)
}

func TestVerifyFindsTampering(t *testing.T) {
	edit := func(t *testing.T, file string, fn func(lines []string) []string) {
		t.Helper()
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		lines = fn(lines)
		if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name    string
		file    int // index into the trail's files
		change  func(lines []string) []string
		line    int
		problem string
	}{
		{"edited", 1, func(l []string) []string { l[0] = strings.Replace(l[0], `"do_fan"`, `"do_fun"`, 1); return l }, 2, "the line before it (or this line's prev) was altered"},
		{"edited across files", 0, func(l []string) []string {
			l[len(l)-1] = strings.Replace(l[len(l)-1], "xxxx", "xxxy", 1)
			return l
		}, 1, "the line before it (or this line's prev) was altered"},
		{"deleted", 1, func(l []string) []string { return append(l[:1], l[2:]...) }, 2, "seq jumps"},
		{"reordered", 1, func(l []string) []string { l[1], l[2] = l[2], l[1]; return l }, 2, "removed or moved"},
		{"moved back", 1, func(l []string) []string { l[1] = l[0]; return l }, 2, "moved or inserted"},
		{"not JSON", 2, func(l []string) []string { l[1] = l[1][:20]; return l }, 2, "not an audit record"},
		{"prev removed", 2, func(l []string) []string { l[1] = strings.Replace(l[1], `"prev"`, `"prex"`, 1); return l }, 2, "has no prev"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, files := chainedTrail(t)
			edit(t, files[c.file], c.change)
			_, err := Verify(dir)
			var b *Break
			if !errors.As(err, &b) {
				t.Fatalf("tampering not detected: %v", err)
			}
			want := files[c.file]
			if c.name == "edited across files" {
				want = files[c.file+1]
			}
			if b.File != want || b.Line != c.line || !strings.Contains(b.Problem, c.problem) {
				t.Errorf("break = %v; want %s:%d %q", b, want, c.line, c.problem)
			}
		})
	}
}

func TestVerifyPrunedAndLegacyTrails(t *testing.T) {
	dir, files := chainedTrail(t)
	// Retention removed the oldest file: checked from the oldest line kept.
	os.Remove(files[0])
	rep, err := Verify(dir)
	if err != nil || rep.FromGenesis {
		t.Errorf("pruned trail: %+v, %v", rep, err)
	}
	// A trail written before the chain: unchained lines, then the chain
	// continues from them.
	legacy := t.TempDir()
	os.WriteFile(filepath.Join(legacy, "audit.jsonl"), []byte(`{"seq":1,"event":"do"}`+"\n"+`{"seq":2,"event":"do"}`+"\n"), 0o640)
	l, err := Open(legacy)
	if err != nil {
		t.Fatal(err)
	}
	l.Append(&Record{Event: "do"})
	l.Append(&Record{Event: "do"})
	l.Close()
	rep, err = Verify(legacy)
	if err != nil || rep.Unchained != 2 || rep.Lines != 4 || rep.LastSeq != 4 {
		t.Errorf("legacy trail: %+v, %v", rep, err)
	}
	// A torn last line of the current file is a crash, not a break.
	f, _ := os.OpenFile(filepath.Join(legacy, "audit.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"seq":5,"ev`)
	f.Close()
	if rep, err = Verify(legacy); err != nil || !rep.TornTail {
		t.Errorf("torn tail: %+v, %v", rep, err)
	}
}

// BenchmarkChainLink is what the chain adds to an append: hashing the
// line just written (a do_ line with its answer is about 1.5 KB) and
// encoding the next line's prev. The append's fsync is unchanged.
func BenchmarkChainLink(b *testing.B) {
	line := []byte(strings.Repeat("x", 1500))
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		h := sha256.Sum256(line)
		_ = hex.EncodeToString(h[:])
	}
}
