package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/physd/physd/audit"
)

const auditUsage = "usage: physd audit verify STATE_DIR   (the --state directory, or its audit/ directory)"

// cmdAudit is "physd audit verify STATE_DIR": it checks the audit trail's
// hash chain across rotated files. Exit 0: intact; 1: the first break is
// printed (file:line, what is wrong); 2: usage or the files cannot be read.
func cmdAudit(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "verify" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Fprintln(stdout, auditUsage)
			return 0
		}
		fmt.Fprintln(stderr, auditUsage)
		return 2
	}
	fs := flag.NewFlagSet("physd audit verify", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprintln(fs.Output(), auditUsage) }
	if code, ok := parseFlags(fs, args[1:], stdout, stderr); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, auditUsage)
		return 2
	}
	dir := fs.Arg(0)
	if _, err := os.Stat(filepath.Join(dir, "audit")); err == nil {
		dir = filepath.Join(dir, "audit")
	}
	rep, err := audit.Verify(dir)
	var b *audit.Break
	switch {
	case errors.As(err, &b):
		fmt.Fprintf(stderr, "audit chain BROKEN at %s\n", b)
		fmt.Fprintf(stderr, "checked %d line(s) before it in %d file(s); everything from this line on is unproven\n", rep.Lines-1, len(rep.Files))
		return 1
	case err != nil:
		fmt.Fprintln(stderr, "physd audit verify:", err)
		return 2
	}
	fmt.Fprintf(stdout, "audit chain intact: %d line(s), seq %d..%d, %d file(s) in %s\n", rep.Lines, rep.FirstSeq, rep.LastSeq, len(rep.Files), dir)
	switch {
	case rep.FromGenesis:
		fmt.Fprintln(stdout, "from the trail's first line")
	case rep.Lines > 0:
		fmt.Fprintf(stdout, "from seq %d: older files were removed (audit.retention_days)\n", rep.FirstSeq)
	}
	if rep.Unchained > 0 {
		fmt.Fprintf(stdout, "%d leading line(s) predate the chain and are not covered by it\n", rep.Unchained)
	}
	if rep.TornTail {
		fmt.Fprintln(stdout, "the current file ends in an incomplete line (a crash mid-write; physd removes it at its next start)")
	}
	if rep.Head != "" {
		fmt.Fprintf(stdout, "head sha256:%s (keep it elsewhere: the chain cannot show a later change to the last line)\n", rep.Head)
	}
	return 0
}
