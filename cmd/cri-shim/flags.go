package main

import (
	"encoding/json"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/cri-shim/cri-shim/internal/config"
)

const defaultConfigUsage = "config file (absent default file: built-in defaults)"

// loadConfig loads the file a command's --config names: the default path may
// be absent (built-in defaults), a path the operator named may not.
func loadConfig(cmd *cobra.Command, path string, validate bool) (config.Config, error) {
	cfg, err := config.Load(path, cmd.Flags().Changed("config"))
	if err == nil && validate {
		err = cfg.Validate()
	}
	return cfg, err
}

// listingConfig is the start of every listing command: the -o format is
// checked before any work (a usage error), then the configuration loaded.
func listingConfig(cmd *cobra.Command, path, format string, validate bool) (config.Config, error) {
	if err := checkOutput(format); err != nil {
		return config.Config{}, err
	}
	return loadConfig(cmd, path, validate)
}

// Output formats of the listings (-o), as crictl's and kubectl's.
var outputFormats = []string{"table", "json", "yaml"}

// outputFlag adds -o/--output to a listing command.
func outputFlag(cmd *cobra.Command, format *string) {
	cmd.Flags().StringVarP(format, "output", "o", "table", "output format: "+strings.Join(outputFormats, ", "))
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputFormats, cobra.ShellCompDirectiveNoFileComp))
}

// checkOutput refuses an unknown -o before the command does any work.
func checkOutput(format string) error {
	for _, f := range outputFormats {
		if f == format {
			return nil
		}
	}
	return usageErrorf("unknown output format %q (want %s)", format, strings.Join(outputFormats, ", "))
}

// printOutput writes v as JSON or YAML (its json tags are the keys of both),
// or calls table.
func printOutput(w io.Writer, format string, v any, table func(io.Writer)) error {
	switch format {
	case "json":
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		_, err = w.Write(append(b, '\n'))
		return err
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	table(w)
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
