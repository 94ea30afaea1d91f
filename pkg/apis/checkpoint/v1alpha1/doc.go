// Package v1alpha1 is the PodCheckpoint API of cri-shim, group
// checkpoint.cri-shim.io: KEP-5823's PodCheckpoint in the project's own group
// (the upstream group checkpoint.k8s.io is reserved for the built-in type).
// The deepcopy code and the CRD in deploy/crd are generated from these types
// by controller-gen (make generate); docs/podcheckpoint.md describes the flow.
//
// +kubebuilder:object:generate=true
// +groupName=checkpoint.cri-shim.io
package v1alpha1
