package v1alpha1

// SourcePodLabel carries SourcePodKey(namespace, spec.sourcePodName) on every
// PodCheckpoint: the MutatingAdmissionPolicy in deploy/admission sets it on
// create and update, and each node selects the objects of its own pods with
// `SourcePodLabel in (keys of its pods)`.
const SourcePodLabel = "checkpoint.cri-shim.io/source-pod"

// NodeDataFinalizer is set by the node holding a PodCheckpoint while its data
// is on the node; the node removes the data, then the finalizer.
const NodeDataFinalizer = "checkpoint.cri-shim.io/node-data"

// SourcePodKey is the value of SourcePodLabel for the pod namespace/name:
// "<namespace>.<name>" (a dot is in neither a namespace nor a label value's
// way), so that pods of one name in two namespaces have two keys. A label
// value has at most 63 characters: a longer key becomes its first 62
// characters and "z" (still starting and ending with an alphanumeric). Pods
// whose keys are cut alike are told apart by the node. The admission
// policy's CEL expression computes the same.
func SourcePodKey(namespace, podName string) string {
	k := namespace + "." + podName
	if len(k) <= 63 {
		return k
	}
	return k[:62] + "z"
}
