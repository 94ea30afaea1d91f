package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/cri-shim/cri-shim/internal/config"
)

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Print the default configuration or check a configuration file",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "default",
		Short: "Print every configuration key with its default value and a comment",
		Long: `Print every configuration key with its default value and a comment. A key
that is unset by default (backoff.max_container_restart_period,
checkpoint.restore_namespace_allow, checkpoint.registries) is shown commented
out, with an example value.`,
		Example: "  cri-shim config default > /etc/cri-shim/config.toml",
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			b, err := config.Marshal(config.DefaultConfig())
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		}),
	})
	var path string
	check := &cobra.Command{
		Use:   "check [FILE]",
		Short: "Check a configuration file: TOML syntax, unknown keys and values",
		Long: `Check a configuration file: TOML syntax, unknown keys, every value, and
what the values name on this host (the socket group, the metrics host, the
CA and credential files), as 'serve' does: it refuses to start on the same
errors. FILE, or --config, must exist; the default is ` + config.DefaultPath + `.`,
		Example: "  cri-shim config check /etc/cri-shim/config.toml",
		Args:    cobra.MaximumNArgs(1),
	}
	configFlag(check.Flags(), &path, config.DefaultPath, "config file to check (or give it as FILE)")
	check.RunE = runE(func(cmd *cobra.Command, args []string) error {
		if len(args) == 1 {
			if cmd.Flags().Changed("config") && path != args[0] {
				return usageErrorf("two files to check: --config %s and %s", path, args[0])
			}
			path = args[0]
		}
		cfg, err := config.Load(path, true) // its errors name the file
		if err != nil {
			return err
		}
		if err := checkConfig(cfg); err != nil {
			return fmt.Errorf("config %s: %w", path, err)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%s: ok\n", path)
		return nil
	})
	cmd.AddCommand(check)
	return cmd
}
