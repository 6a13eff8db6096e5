package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionStamp(t *testing.T) {
	const rev = "0123456789abcdef0123456789abcdef01234567"
	vcs := func(modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev},
			{Key: "vcs.time", Value: "2026-11-30T12:00:00Z"}, {Key: "vcs.modified", Value: modified}, {Key: "GOARM", Value: "7"}}
	}
	cases := []struct {
		name, ldflags string
		bi            *debug.BuildInfo
		want          []string
	}{
		{"release build, clean tree", "v0.2.0", &debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Version: "(devel)"}, Settings: vcs("false")},
			[]string{"physd v0.2.0\n", "commit:   " + rev + ", clean\n", "committed: 2026-11-30T12:00:00Z\n", "go:       go1.27.3 ", "/v7\n"}},
		{"go build in a modified checkout", "", &debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Version: "v0.0.0-20261130120000-0123456789ab+dirty"}, Settings: vcs("true")},
			[]string{"physd v0.0.0-20261130120000-0123456789ab+dirty\n", "commit:   " + rev + ", modified (built from a tree with uncommitted changes)\n"}},
		{"go install module@version (no VCS stamp)", "", &debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Version: "v0.2.0"}},
			[]string{"physd v0.2.0\n", "commit:   unknown (no VCS stamp: "}},
		{"go run or -buildvcs=false", "", &debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Version: "(devel)"}},
			[]string{"physd dev\n", "commit:   unknown (", "-buildvcs=false"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			old := version
			version = tc.ldflags
			defer func() { version = old }()
			var b strings.Builder
			readStamp(tc.bi, true).write(&b)
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("missing %q in:\n%s", w, b.String())
				}
			}
		})
	}
	if code, stdout, _ := runCLI("version"); code != 0 || !strings.HasPrefix(stdout, "physd ") || !strings.Contains(stdout, "\ncommit:") {
		t.Errorf("physd version: exit %d\n%s", code, stdout)
	}
}
