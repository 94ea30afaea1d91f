package v1alpha1

// SourcePodLabel carries SourcePodKey(spec.sourcePodName) on every
// PodCheckpoint: the MutatingAdmissionPolicy in deploy/admission sets it on
// create and update, and each node selects the objects of its own pods with
// `SourcePodLabel in (keys of its pods)`.
const SourcePodLabel = "checkpoint.cri-shim.io/source-pod"

// NodeDataFinalizer is set by the node holding a PodCheckpoint while its data
// is on the node; the node removes the data, then the finalizer.
const NodeDataFinalizer = "checkpoint.cri-shim.io/node-data"

// SourcePodKey is the value of SourcePodLabel for a pod name. A label value
// has at most 63 characters and a pod name up to 253: a longer name becomes
// its first 62 characters and "z" (still starting and ending with an
// alphanumeric). Names that share a key are told apart by the node. The
// admission policy's CEL expression computes the same.
func SourcePodKey(podName string) string {
	if len(podName) <= 63 {
		return podName
	}
	return podName[:62] + "z"
}
