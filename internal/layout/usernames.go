package layout

import (
	"errors"
	"fmt"
	"strings"
)

// Names a user or a pod gives, and the error classes every checkpoint
// package shares.

// ReservedPrefix returns the reserved prefix name begins with, or "".
func ReservedPrefix(name string) string {
	for _, p := range []string{ObjectDirPrefix, PulledDirPrefix} {
		if strings.HasPrefix(name, p) {
			return p
		}
	}
	return ""
}

// CheckNewName is CheckName for the name of a checkpoint a user makes
// ('cri-shim checkpoint --name', 'cri-shim checkpoint pull'): names
// beginning with a reserved prefix belong to the shim's own directories.
func CheckNewName(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	if p := ReservedPrefix(name); p != "" {
		return fmt.Errorf("checkpoint name %q: names beginning %q are reserved (%q: PodCheckpoint objects' data, %q: checkpoints pulled for a restore from an image reference)",
			name, p, ObjectDirPrefix, PulledDirPrefix)
	}
	return nil
}

// IsImageRef reports whether a restore-from value is an image reference
// rather than a checkpoint or PodCheckpoint name: names never hold '/',
// ':' or '@' (CheckName), every reference with a registry holds '/'.
func IsImageRef(s string) bool { return strings.ContainsAny(s, "/:@") }

// ErrForeignCheckpoint is a pulled checkpoint of a pod in a namespace the
// restoring pod may not restore from (the namespace binding): a PullRestore
// error of this class is answered as a missing checkpoint (noCheckpoint).
var ErrForeignCheckpoint = errors.New("checkpoint of a namespace the pod may not restore from")

// ErrCheckpointRefused is a pulled checkpoint whose content no restore may
// use (an archive or manifest the checks refuse): a PullRestore error of
// this class is a refusal, counted and told as an event on the pod like the
// image check's, and the same digest is refused again without a pull.
var ErrCheckpointRefused = errors.New("checkpoint refused")
