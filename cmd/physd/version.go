package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// stamp is what a binary knows about how it was built.
type stamp struct {
	Version  string // -X main.version, else the module version, else "dev"
	Commit   string // vcs.revision; "" when the build was not stamped
	Time     string // vcs.time: the commit's time
	Modified string // vcs.modified: "true" when the tree had uncommitted changes
	Go       string
	Platform string
}

// readStamp reads the build information the go command records. VCS
// fields are present only when the binary was built by `go build` or `go
// install` inside a git checkout with -buildvcs not false (deploy/release.sh
// passes -buildvcs=true: some machines set GOFLAGS=-buildvcs=false);
// `go run`, a module zip (`go install …@v1.2.3`) or -buildvcs=false leave
// them out.
func readStamp(bi *debug.BuildInfo, ok bool) stamp {
	s := stamp{Version: "dev", Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if arm := armVariant(bi); arm != "" {
		s.Platform += "/v" + arm
	}
	if ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		s.Version = bi.Main.Version
	}
	if version != "" {
		s.Version = version
	}
	if !ok {
		return s
	}
	s.Go = bi.GoVersion
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			s.Commit = kv.Value
		case "vcs.time":
			s.Time = kv.Value
		case "vcs.modified":
			s.Modified = kv.Value
		}
	}
	return s
}

func armVariant(bi *debug.BuildInfo) string {
	if bi == nil {
		return ""
	}
	for _, kv := range bi.Settings {
		if kv.Key == "GOARM" {
			return kv.Value
		}
	}
	return ""
}

// write prints the stamp: the first line is "physd VERSION" for scripts.
func (s stamp) write(w io.Writer) {
	fmt.Fprintln(w, "physd", s.Version)
	switch {
	case s.Commit == "":
		fmt.Fprintln(w, "commit:   unknown (no VCS stamp: built by go run, from a module zip, outside a git checkout, or with -buildvcs=false; deploy/release.sh stamps its builds)")
	case s.Modified == "true":
		fmt.Fprintf(w, "commit:   %s, modified (built from a tree with uncommitted changes)\n", s.Commit)
	default:
		fmt.Fprintf(w, "commit:   %s, clean\n", s.Commit)
	}
	if s.Time != "" {
		fmt.Fprintln(w, "committed:", s.Time)
	}
	fmt.Fprintf(w, "go:       %s %s\n", s.Go, s.Platform)
}

func writeVersion(w io.Writer) {
	bi, ok := debug.ReadBuildInfo()
	readStamp(bi, ok).write(w)
}
