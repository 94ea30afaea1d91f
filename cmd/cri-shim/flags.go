package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/cri-shim/cri-shim/internal/config"
)

// loadConfig parses a command's --config flag and loads the file: the default
// path may be absent (built-in defaults), a path the operator named may not.
// It returns the exit code to use when ok is false.
func loadConfig(name string, args []string, validate bool) (cfg config.Config, code int, ok bool) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	path := fs.String("config", config.DefaultPath, "config file (absent default file: built-in defaults)")
	if err := fs.Parse(args); err != nil {
		return cfg, 2, false
	}
	return loadParsed(fs, *path, validate)
}

// loadParsed loads the file a parsed flag set's --config names (the default
// path may be absent, a path the operator named may not), for commands with
// flags of their own.
func loadParsed(fs *flag.FlagSet, path string, validate bool) (config.Config, int, bool) {
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "config" })
	cfg, err := config.Load(path, explicit)
	if err == nil && validate {
		err = cfg.Validate()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-shim: %v\n", err)
		return cfg, 1, false
	}
	return cfg, 0, true
}
