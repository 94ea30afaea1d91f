// Package ckptarchive is a container checkpoint archive's bytes: the
// layout of containerd's CRI checkpoint archive (checkpoint/, rootfs-diff.tar,
// config.dump, spec.dump, status.dump, container.log), written with the
// memory pages copied in the kernel, during the capture (Stream) or after it
// (WriteComplete), then the rest (WriteRest); and read back, as untrusted
// input, for a restore (Extract, CopyLog). What the archive means (which
// container, its manifest entry, its checks) is internal/restore's and
// internal/layout's.
package ckptarchive
