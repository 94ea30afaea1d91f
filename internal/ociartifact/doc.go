// Package ociartifact moves a pod checkpoint (the directory internal/capture
// writes) to and from an OCI registry as an image index: one checkpoint image
// per captured container, in the format CRI-O, checkpointctl and containerd's
// CRI restore read, plus the pod's own manifest.json and sandbox.json as an
// artifact. docs/checkpoint-oci.md describes the format.
//
// Registry traffic goes through go-containerregistry. Archives are streamed
// from and to disk, never held in memory, and everything read from a registry
// is hostile input: sizes are capped before a byte is read, every blob's
// digest is checked while it streams, archive members are checked like
// internal/layout confines paths, and the pod manifest is validated by layout's
// parser before the checkpoint directory exists under its name.
package ociartifact
