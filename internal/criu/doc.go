// Package criu holds pod-level checkpoint and restore (KEP-5823 CheckpointPod / RestorePod) on containerd and CRIU. Not implemented yet: see the checkpoint/restore issue.
package criu
