// Package criu is pod-level checkpoint and restore (KEP-5823): the CRI calls
// CheckpointPod and RestorePod, served by the shim on containerd and runc/CRIU,
// and warm start of a pod whose annotation names a checkpoint, for kubelets that
// do not make those calls yet.
//
// A pod checkpoint is one consistent cut: every selected container is paused
// (containerd task pause, the cgroup freezer) before any is captured, all stay
// paused until every capture is written, and all are resumed before the call
// returns, on success, on error and on deadline expiry. Each container is
// captured by containerd's own CheckpointContainer (task checkpoint with runc
// and CRIU, leaving the processes running), whose archive containerd restores
// when it is given as a container's image. The layout is in docs/checkpoint.md.
package criu
