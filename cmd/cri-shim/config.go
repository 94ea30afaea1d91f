package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/cri-shim/cri-shim/internal/config"
)

func configCmd(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: cri-shim config default|check [--config FILE]")
		return 2
	}
	switch args[0] {
	case "default":
		b, err := config.Marshal(config.DefaultConfig())
		if err != nil {
			fmt.Fprintln(os.Stderr, "cri-shim:", err)
			return 1
		}
		os.Stdout.Write(b)
		return 0
	case "check":
		fs := flag.NewFlagSet("config check", flag.ContinueOnError)
		path := fs.String("config", config.DefaultPath, "config file to check")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		cfg, err := config.Load(*path, true)
		if err == nil {
			err = cfg.Validate()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "cri-shim: config %s: %v\n", *path, err)
			return 1
		}
		fmt.Printf("%s: ok\n", *path)
		return 0
	}
	fmt.Fprintf(os.Stderr, "cri-shim config: unknown subcommand %q\n", args[0])
	return 2
}
