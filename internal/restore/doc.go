// Package restore starts containers from checkpoints (KEP-5823): it serves
// RestorePod, stages the restore of every container created from a
// checkpoint, whichever call created it (RestorePod, a warm start or a warm
// restart of internal/warm), ends it at the container's start, and takes up
// the restores a killed shim left staged.
//
// A restore creates each container through the CRI from the new pod's own
// config, stages the CRIU images and rootfs changes of the container's
// archive (internal/ckptarchive), checks them against the container's spec
// (internal/criucheck), and leaves a mark for cri-shim's runtime shim, which
// creates the task as a restore (docs/restore-route.md).
package restore
