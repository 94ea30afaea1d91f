package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
)

// NodeLabel routes a PodCheckpoint to the node that runs its source pod:
// the router (`cri-shim router`, internal/ckptrouter) sets it to
// NodeLabelValue(spec.nodeName of the source pod), and each node watches
// `NodeLabel=NodeLabelValue(<its name>)`. It is routing, not authority: a
// node acts only on objects whose source pod its own pod informer holds.
// The ValidatingAdmissionPolicy in deploy/admission lets no one but the
// router set or change it.
const NodeLabel = "checkpoint.cri-shim.io/node"

// NodeDataFinalizer is set by the node holding a PodCheckpoint while its data
// is on the node; the node removes the data, then the finalizer.
const NodeDataFinalizer = "checkpoint.cri-shim.io/node-data"

// NodeLabelValue is the value of NodeLabel for a node: its name when that
// is a valid label value (a node name is a DNS subdomain, so when it has at
// most 63 characters), else its first 30 characters, "-" and 32 hex digits
// of the name's SHA-256, so that long names sharing a prefix differ.
func NodeLabelValue(node string) string {
	if len(node) <= 63 {
		return node
	}
	sum := sha256.Sum256([]byte(node))
	return node[:30] + "-" + hex.EncodeToString(sum[:16])
}
