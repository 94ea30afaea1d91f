package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/cri-shim/cri-shim/internal/config"
)

// backoffCmd prints the effective restart curve of a config, so an operator can
// check a node's setting before rolling it out.
func backoffCmd(args []string) int {
	fs := flag.NewFlagSet("backoff", flag.ContinueOnError)
	path := fs.String("config", config.DefaultPath, "config file (absent default file: built-in defaults)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "config" })
	cfg, err := config.Load(*path, explicit)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-shim: %v\n", err)
		return 1
	}
	c, _ := cfg.BackoffCurve() // validated
	fmt.Printf("effective initial delay: %s\neffective maximum delay: %s\nreset after running:     %s\n", c.Initial, c.Max, 10*time.Minute)
	fmt.Print("delays before restarts 1-10:")
	for i := 1; i <= 10; i++ {
		fmt.Printf(" %s", c.Delay(i))
	}
	fmt.Println()
	return 0
}
