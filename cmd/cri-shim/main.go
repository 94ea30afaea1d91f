// Command cri-shim is a CRI proxy between the kubelet and containerd.
//
//	cri-shim serve [--config F] [--listen S] [--runtime-endpoint S] [--log-level L]
//	cri-shim version
//	cri-shim config default|check [--config F]
//	cri-shim backoff [--config F]
//	cri-shim pods [--config F]
//	cri-shim doctor [--config F]
package main

import (
	"fmt"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		usage()
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(args[1:])
	case "version", "--version":
		return printVersion()
	case "config":
		return configCmd(args[1:])
	case "backoff":
		return backoffCmd(args[1:])
	case "pods":
		return podsCmd(args[1:])
	case "checkpoint":
		return checkpointCmd(args[1:])
	case "checkpoints":
		return checkpointsCmd(args[1:])
	case "doctor":
		return doctorCmd(args[1:])
	case "completed":
		return completedCmd(args[1:])
	case "help", "-h", "--help":
		usage()
		return 0
	}
	fmt.Fprintf(os.Stderr, "cri-shim: unknown command %q\n", args[0])
	usage()
	return 2
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: cri-shim <command> [flags]

commands:
  serve     run the CRI proxy daemon
  version   print the version
  config    default: print the default config; check: validate a config file
  backoff   print the effective restart backoff curve of a config
  pods      list the pods cri-shim governs (restart phase, restarts, problems)
  checkpoint  --namespace NS --pod NAME [--name CP] [--timeout 60s]: checkpoint a pod (CheckpointPod)
  checkpoints [rm NAME...]: list the checkpoints under checkpoint.root, or remove some
  doctor    check the node for what the shim needs (kernel, cgroup, CRIU, containerd, socket, kubelet) and say what to fix
`)
}
