// Package version reports what build of the shim is running.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version, Revision and CommitTime are set at link time (-X
// github.com/cri-shim/cri-shim/internal/version.Version=..., see the
// Makefile); a build without them falls back to what the Go toolchain
// recorded, which -buildvcs=false (common in CI) leaves empty.
var (
	Version    = "dev"
	Revision   = ""
	CommitTime = ""
)

// Info is what the binary knows of its build: the version it was given, and
// what the Go toolchain recorded (VCS revision and commit time, whether the
// tree had uncommitted changes).
type Info struct {
	Version   string
	Revision  string
	Time      string
	Modified  bool
	GoVersion string
	Platform  string
}

// Get reads the build information.
func Get() Info {
	i := Info{Version: Version, Revision: "unknown", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Revision = s.Value
			case "vcs.time":
				i.Time = s.Value
			case "vcs.modified":
				i.Modified = s.Value == "true"
			}
		}
	}
	if Revision != "" {
		i.Revision, i.Modified = Revision, false
	}
	if CommitTime != "" {
		i.Time = CommitTime
	}
	return i
}

// String is the one-line version report.
func String() string {
	i := Get()
	rev := i.Revision
	if i.Modified {
		rev += "-dirty"
	}
	if i.Time != "" {
		rev += " " + i.Time
	}
	return fmt.Sprintf("cri-shim %s (revision %s, %s, %s)", i.Version, rev, i.GoVersion, i.Platform)
}
