// Command cri-shim is a CRI proxy between the kubelet and containerd. The
// command tree is in root.go, one file per command group beside it;
// `cri-shim --help` lists the commands.
package main

import "os"

func main() {
	os.Exit(run(os.Args[1:]))
}
