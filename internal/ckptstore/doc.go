// Package ckptstore is the node's checkpoint store: the checkpoint
// directories under the root and what keeps them in bounds. It admits a
// capture before its pause against the store's bounds (admission.go),
// applies retention once a checkpoint is written (retention.go), takes the
// checkpoints pods schedule (schedule.go), and keeps the cache of
// checkpoints pulled from registries under its cap (pulled.go,
// pulledcap.go). Its ledger says which directories a warm start or a warm
// restart is reading: retention, the sweep and the cap leave those alone.
// Restores read the store (internal/restore, internal/warm); captures write
// it (internal/capture, which tells it of each new checkpoint: Retain).
package ckptstore
