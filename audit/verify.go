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
)

// Report is what Verify found in an intact chain.
type Report struct {
	Files     []string // checked, oldest first
	Lines     int      // records checked
	Unchained int      // leading lines written before the chain existed (no prev)
	FirstSeq  uint64
	LastSeq   uint64
	// FromGenesis: the oldest line checked is the trail's first line. When
	// false, older files were removed (retention) and the chain is checked
	// from the oldest line kept.
	FromGenesis bool
	// Head is the hex SHA-256 of the last line: keep a copy elsewhere to
	// detect a later change of the tail, which no successor line covers.
	Head string
	// TornTail: the current file ends in an incomplete line (a crash
	// mid-write; physd cuts it off at its next start). Not a break.
	TornTail bool
}

// Break is the first place where the chain does not hold.
type Break struct {
	File    string
	Line    int // 1-based line in File
	Seq     uint64
	Problem string
}

func (b *Break) Error() string {
	s := fmt.Sprintf("%s:%d", b.File, b.Line)
	if b.Seq > 0 {
		s += fmt.Sprintf(" (seq %d)", b.Seq)
	}
	return s + ": " + b.Problem
}

// Verify checks the hash chain of the audit trail in dir across its
// rotated files (oldest first) and the current file: every line must be a
// JSON record whose prev is the SHA-256 of the line before it (across file
// boundaries) and whose seq is one more than that line's. It returns the
// first break as a *Break; other errors are I/O errors.
//
// What a chain shows: a line changed, removed, inserted or moved anywhere
// before the last line. It cannot show a change to the last line itself or
// the loss of whole files at the old end or lines at the new end; Report.Head
// anchored elsewhere (the remote sink receives every line) covers those.
func Verify(dir string) (Report, error) {
	var rep Report
	files := rotatedIn(dir)
	cur := filepath.Join(dir, "audit.jsonl")
	if _, err := os.Stat(cur); err == nil {
		files = append(files, cur)
	} else if !errors.Is(err, os.ErrNotExist) {
		return rep, err
	}
	if len(files) == 0 {
		return rep, fmt.Errorf("no audit files (audit.jsonl, audit-*.jsonl) in %s", dir)
	}
	v := verifier{rep: &rep}
	for i, name := range files {
		rep.Files = append(rep.Files, name)
		if err := v.file(name, i == len(files)-1); err != nil {
			return rep, err
		}
	}
	if rep.Lines > 0 {
		rep.Head = hex.EncodeToString(v.last[:])
	}
	return rep, nil
}

type verifier struct {
	rep     *Report
	last    [sha256.Size]byte // hash of the previous line
	lastSeq uint64
	chained bool // a line with prev has been seen
	any     bool // a line has been seen
}

func (v *verifier) file(name string, current bool) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<16)
	for n := 1; ; n++ {
		line, err := r.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			if len(line) == 0 {
				return nil
			}
			if current {
				v.rep.TornTail = true
				return nil
			}
			return &Break{File: name, Line: n, Problem: "the file ends in an incomplete line: a rotated file is always complete, so it was cut or edited"}
		}
		if err != nil {
			return err
		}
		if b := v.line(bytes.TrimSuffix(line, []byte("\n"))); b != nil {
			b.File, b.Line = name, n
			return b
		}
	}
}

// line checks one line against the previous one.
func (v *verifier) line(line []byte) *Break {
	var r struct {
		Seq  *uint64 `json:"seq"`
		Prev *string `json:"prev"`
	}
	if err := json.Unmarshal(line, &r); err != nil || r.Seq == nil {
		return &Break{Problem: "not an audit record (invalid JSON or no seq): the line was altered"}
	}
	seq := *r.Seq
	hash := sha256.Sum256(line)
	defer func() { v.last, v.lastSeq, v.any = hash, seq, true }()
	if !v.any {
		v.rep.FirstSeq = seq
	}
	v.rep.Lines++
	v.rep.LastSeq = seq
	switch {
	case r.Prev == nil && v.chained:
		return &Break{Seq: seq, Problem: "the line has no prev although earlier lines are chained: it was altered or inserted"}
	case r.Prev == nil:
		v.rep.Unchained++ // written before physd chained its audit
		return v.seqCheck(seq)
	}
	first := !v.chained
	v.chained = true
	want := hex.EncodeToString(v.last[:])
	switch {
	case !v.any && *r.Prev == GenesisPrev:
		v.rep.FromGenesis = true
		if seq != 1 {
			return &Break{Seq: seq, Problem: fmt.Sprintf("the first line of the trail has seq %d, not 1", seq)}
		}
		return nil
	case !v.any:
		// Older files were pruned by retention: the chain is checked from here.
		return nil
	case *r.Prev == want:
		return v.seqCheck(seq)
	case first && v.rep.Unchained > 0:
		return &Break{Seq: seq, Problem: "the first chained line's prev is not the SHA-256 of the last unchained line before it: a line between them was altered, removed or inserted"}
	}
	p := fmt.Sprintf("prev %s is not the SHA-256 of the line before it (%s, seq %d): ", short(*r.Prev), short(want), v.lastSeq)
	switch {
	case seq == v.lastSeq+1:
		p += "the line before it (or this line's prev) was altered"
	case seq > v.lastSeq+1:
		p += fmt.Sprintf("seq jumps from %d to %d, so %d line(s) were removed or moved", v.lastSeq, seq, seq-v.lastSeq-1)
	default:
		p += fmt.Sprintf("seq %d follows %d, so lines were moved or inserted", seq, v.lastSeq)
	}
	return &Break{Seq: seq, Problem: p}
}

func (v *verifier) seqCheck(seq uint64) *Break {
	if v.any && seq != v.lastSeq+1 {
		return &Break{Seq: seq, Problem: fmt.Sprintf("seq %d follows %d: lines were removed, reordered or inserted", seq, v.lastSeq)}
	}
	return nil
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	return h
}

func hexOf(h [sha256.Size]byte) string { return hex.EncodeToString(h[:]) }
