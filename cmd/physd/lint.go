package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/physd/physd/lint"
)

const lintUsage = `usage: physd lint [flags] <http(s) URL | tools.json>
       physd lint [flags] -- <stdio server command> [args...]

Checks an MCP server against proMCP v0.4: every promcp-lint rule on the
listed tool definitions (outputSchema is the response contract), then
runtime checks on real answers: can_do probes, every read_, and (only with
--allow-do) each do_ once with its current value. A tools.json file (an
array, or {"tools": [...]}) gets the static rules only.

Exit status: 0 pass, 1 findings (errors; warnings too with --strict),
2 cannot connect or load.

Flags:
`

// headerFlag collects repeated --header "K: V".
type headerFlag struct{ h http.Header }

func (f *headerFlag) String() string { return "" }

func (f *headerFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, ":")
	if !ok || strings.TrimSpace(k) == "" {
		return fmt.Errorf("%q: want \"Name: value\"", s)
	}
	if f.h == nil {
		f.h = http.Header{}
	}
	f.h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	return nil
}

func cmdLint(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("physd lint", flag.ContinueOnError)
	// Parse reports nothing itself: -h prints the usage on stdout, a bad
	// flag one line on stderr (flagError).
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	printUsage := func(w io.Writer) {
		fmt.Fprint(w, lintUsage)
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	jsonOut := fs.Bool("json", false, "print the report as JSON (promcp-lint's shape plus target and runtime)")
	strict := fs.Bool("strict", false, "warnings fail too (exit 1)")
	allowDo := fs.Bool("allow-do", false, "call each do_ tool once with its current value (never without this flag)")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on the whole run against a live server")
	var headers headerFlag
	fs.Var(&headers, "header", `extra HTTP header "Name: value" (repeatable), e.g. "Authorization: Bearer …"`)

	// Everything after "--" is a stdio command; flags may come before or
	// after the URL or file.
	var command []string
	for i, a := range args {
		if a == "--" {
			command, args = args[i+1:], args[:i]
			break
		}
	}
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printUsage(stdout)
				return 0
			}
			flagError(fs, err, stderr)
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	switch {
	case len(command) > 0 && len(positional) == 0:
	case len(command) == 0 && len(positional) == 1:
	default:
		printUsage(stderr)
		return 2
	}

	var (
		rep *lint.Report
		err error
	)
	switch {
	case len(command) > 0:
		rep, err = lint.Run(context.Background(), lint.Target{Command: command}, lint.Options{AllowDo: *allowDo, Timeout: *timeout, ClientVersion: buildVersion()})
	case strings.HasPrefix(positional[0], "http://") || strings.HasPrefix(positional[0], "https://"):
		rep, err = lint.Run(context.Background(), lint.Target{URL: positional[0], Header: headers.h}, lint.Options{AllowDo: *allowDo, Timeout: *timeout, ClientVersion: buildVersion()})
	default:
		rep, err = lintFile(positional[0])
	}
	if err != nil {
		fmt.Fprintln(stderr, "physd lint:", err)
		return 2
	}
	rep.Strict(*strict)
	if *jsonOut {
		if err := rep.WriteJSON(stdout); err != nil {
			fmt.Fprintln(stderr, "physd lint:", err)
			return 2
		}
	} else {
		rep.WriteText(stdout)
	}
	return rep.ExitCode()
}

func lintFile(path string) (*lint.Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tools, err := lint.LoadTools(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	rep := lint.LintTools(tools)
	rep.Target, rep.Transport = path, "file"
	return rep, nil
}
