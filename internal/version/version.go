// Package version reports what build of the shim is running.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is set at link time (-X github.com/cri-shim/cri-shim/internal/version.Version=...).
var Version = "dev"

// String is the one-line version report.
func String() string {
	rev := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				rev = s.Value
			}
		}
	}
	return fmt.Sprintf("cri-shim %s (revision %s, %s, %s/%s)", Version, rev, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
