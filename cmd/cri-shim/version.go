package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/cri-shim/cri-shim/internal/version"
)

// versionOutput is the -o json|yaml form of version: what the one line says.
type versionOutput struct {
	Version string `json:"version"`
	// Revision is the commit the binary was built from ("unknown" when
	// neither the build nor the Go toolchain recorded one).
	Revision string `json:"revision"`
	// Modified: the tree had uncommitted changes (the line's "-dirty").
	Modified bool `json:"modified"`
	// CommitTime is the commit's time, RFC 3339; empty when unknown. Builds
	// are reproducible: there is no separate build time.
	CommitTime string `json:"commitTime"`
	GoVersion  string `json:"goVersion"`
	Platform   string `json:"platform"`
}

func newVersionCmd() *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:     "version",
		Short:   "Print the version, commit and build information",
		Example: "  cri-shim version\n  cri-shim version -o json",
	}
	outputFlag(cmd, &format)
	cmd.RunE = runE(func(cmd *cobra.Command, _ []string) error {
		if err := checkOutput(format); err != nil {
			return err
		}
		i := version.Get()
		out := versionOutput{Version: i.Version, Revision: i.Revision, Modified: i.Modified, CommitTime: i.Time,
			GoVersion: i.GoVersion, Platform: i.Platform}
		return printOutput(cmd.OutOrStdout(), format, out, func(w io.Writer) {
			fmt.Fprintln(w, version.String())
		})
	})
	return cmd
}
