// Package criu is pod-level checkpoint and restore (KEP-5823) on the node:
// RestorePod, warm start of a pod whose annotation names a checkpoint (for
// kubelets that do not make those calls yet), warm restarts, the checkpoints'
// retention, schedules and the cache of checkpoints pulled from registries.
// CheckpointPod is served by internal/capture, which the service composes:
// its checkpoints are retained here.
//
// A restore creates each container through the CRI from the new pod's own
// config, stages the CRIU images and rootfs changes of the container's
// archive (internal/ckptarchive), checks them against the container's spec
// (internal/criucheck), and leaves a mark for cri-shim's runtime shim, which
// creates the task as a restore (docs/restore-route.md).
package criu
