package main

import (
	"fmt"
	"time"
)

// backoffCmd prints the effective restart curve of a config, so an operator can
// check a node's setting before rolling it out.
func backoffCmd(args []string) int {
	cfg, code, ok := loadConfig("backoff", args, true)
	if !ok {
		return code
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
