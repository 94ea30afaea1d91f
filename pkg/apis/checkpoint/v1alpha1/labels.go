package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
)

// NodeLabel routes a PodCheckpoint to the node that runs its source pod:
// the router (`cri-shim router`, internal/ckptrouter) sets it to
// NodeLabelValue(spec.nodeName of the source pod), and each node watches
// `NodeLabel=NodeLabelValue(<its name>)`. It is also the ticket: the
// ValidatingAdmissionPolicies in deploy/admission let no one but the router
// set or change it, and a node write only the objects routed to it
// (RoutedTo).
const NodeLabel = "checkpoint.cri-shim.io/node"

// NodeNameAnnotation carries the routed node's full name when NodeLabel
// holds its hashed value (a name over 63 characters): an admission policy
// cannot compute a SHA-256, so it compares this with the writing node's
// name instead. The router sets it with the label and removes it for a
// name the label holds whole; no one else may write it.
const NodeNameAnnotation = "checkpoint.cri-shim.io/node-name"

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

// RoutedTo says whether the router routed an object with labels and
// annotations to node: NodeLabel is NodeLabelValue(node), and for a hashed
// value NodeNameAnnotation is node (the rule the node-writes admission
// policy applies).
func RoutedTo(labels, annotations map[string]string, node string) bool {
	v := NodeLabelValue(node)
	if node == "" || labels[NodeLabel] != v {
		return false
	}
	return v == node || annotations[NodeNameAnnotation] == node
}
