package main

import (
	"fmt"

	"github.com/cri-shim/cri-shim/internal/version"
)

func printVersion() int {
	fmt.Println(version.String())
	return 0
}
