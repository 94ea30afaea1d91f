package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/cri-shim/cri-shim/internal/config"
)

// resetAfter is how long a container must run for the kubelet to forget its
// backoff (kubelet's backOffPeriod reset, 10 minutes).
const resetAfter = 10 * time.Minute

// backoffCurve is the -o json|yaml form of `cri-shim backoff`.
type backoffCurve struct {
	InitialDelaySeconds float64 `json:"initialDelaySeconds"`
	MaxDelaySeconds     float64 `json:"maxDelaySeconds"`
	ResetAfterSeconds   float64 `json:"resetAfterSeconds"`
	// DelaysSeconds are the delays before restarts 1-10.
	DelaysSeconds []float64 `json:"delaysSeconds"`
}

func newBackoffCmd() *cobra.Command {
	var path, format string
	cmd := &cobra.Command{
		Use:   "backoff",
		Short: "Print the effective restart backoff curve of a configuration",
		Long: `Print the effective restart backoff curve of a configuration (initial and
maximum delay, the delays before restarts 1-10), so an operator can check a
node's setting before rolling it out. Reads only the file.`,
		Example: "  cri-shim backoff --config /etc/cri-shim/config.toml -o json",
	}
	configFlag(cmd.Flags(), &path, config.DefaultPath, defaultConfigUsage)
	outputFlag(cmd, &format)
	cmd.RunE = runE(func(cmd *cobra.Command, _ []string) error {
		cfg, err := listingConfig(cmd, path, format, true)
		if err != nil {
			return err
		}
		c, _ := cfg.BackoffCurve() // validated
		out := backoffCurve{InitialDelaySeconds: c.Initial.Seconds(), MaxDelaySeconds: c.Max.Seconds(), ResetAfterSeconds: resetAfter.Seconds()}
		for i := 1; i <= 10; i++ {
			out.DelaysSeconds = append(out.DelaysSeconds, c.Delay(i).Seconds())
		}
		return printOutput(cmd.OutOrStdout(), format, out, func(w io.Writer) {
			fmt.Fprintf(w, "effective initial delay: %s\neffective maximum delay: %s\nreset after running:     %s\n", c.Initial, c.Max, resetAfter)
			fmt.Fprint(w, "delays before restarts 1-10:")
			for i := 1; i <= 10; i++ {
				fmt.Fprintf(w, " %s", c.Delay(i))
			}
			fmt.Fprintln(w)
		})
	})
	return cmd
}
