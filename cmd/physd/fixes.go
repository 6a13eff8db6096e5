package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"github.com/physd/physd/strictyaml"
)

// The command line's own mistakes (an unknown flag or command, a file a
// flag names that cannot be read) get what manifest errors get: one line
// that names the flag or file and says what to do.

// flagError prints a flag parse error as one line: the problem, a "did
// you mean" for a misspelt flag, and where the flags are listed. The
// flag package's own 40-line usage dump hides the one line that matters.
func flagError(fs *flag.FlagSet, err error, stderr io.Writer) {
	// The flag package spells flags with one dash; physd's docs use two.
	msg := strings.Replace(err.Error(), " for flag -", " for flag --", 1)
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		msg = "unknown flag --" + name
		if s := closestFlag(fs, name); s != "" {
			msg += "; did you mean --" + s + "?"
		}
	}
	fmt.Fprintf(stderr, "%s: %s (%s -h lists the flags)\n", fs.Name(), msg, fs.Name())
}

// closestFlag is the defined flag nearest to name, or "".
func closestFlag(fs *flag.FlagSet, name string) string {
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return strictyaml.Closest(strings.TrimLeft(name, "-"), names)
}

// commands are physd's subcommands (the usage lists them).
var commands = []string{"run", "fleet", "validate", "lint", "client-config", "audit", "scan", "version", "help"}

// unknownCommand is the one line for a subcommand physd does not have.
func unknownCommand(name string) string {
	msg := fmt.Sprintf("physd: unknown command %q", name)
	if strings.HasPrefix(name, "-") {
		msg = fmt.Sprintf("physd: %q is not a command: the command comes first, e.g. physd run --manifest FILE", name)
	}
	if s := strictyaml.Closest(strings.TrimLeft(name, "-"), commands); s != "" {
		msg += fmt.Sprintf("; did you mean %q?", s)
	}
	return msg + " (physd help lists the commands)"
}

// fileError names the flag (or argument) whose file could not be read,
// with fix for a missing file; other errors pass unchanged (a parse error
// already names its file:line:col).
func fileError(what, path string, err error, fix string) error {
	var pe *fs.PathError
	if !errors.As(err, &pe) || pe.Path != path {
		return err
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case errors.Is(err, fs.ErrPermission):
		fix = "make it readable by the user physd runs as, or copy it somewhere that user can read"
	default:
		fix = "give a readable file"
	}
	return &unreadable{fmt.Sprintf("%s %s: cannot read it (%v); fix: %s", what, path, pe.Err, fix)}
}

// unreadable is fileError's error: a file a flag names could not be read.
type unreadable struct{ msg string }

func (e *unreadable) Error() string { return e.msg }

// prefixed puts the command's name before an unreadable file's error; a
// parse error already begins with its file:line:col and is printed as
// validate prints it.
func prefixed(cmd string, err error) string {
	var u *unreadable
	if errors.As(err, &u) {
		return cmd + ": " + err.Error()
	}
	return err.Error()
}

// The fix for each file physd run reads when it is missing.
const (
	fixManifest = "give the path of a physmcp.manifest.yml (examples/greenhouse/physmcp.manifest.yml runs on the built-in simulator; docs/manifest.md describes the file)"
	fixPolicy   = "give the path of a physmcp.policy.yml (examples/greenhouse/physmcp.policy.yml is a model; docs/policy.md describes the file), or run without --policy: the manifest's own limits then apply"
)
