// Package podcheckpoint connects PodCheckpoint objects (pkg/apis/checkpoint)
// to the node's checkpoints: a client for the objects, and the reconciler
// that checkpoints the pods of this node that objects name and writes the
// outcome back (docs/podcheckpoint.md). The checkpoint itself is
// internal/capture's.
package podcheckpoint
