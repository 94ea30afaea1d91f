package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of PodCheckpoint.
const GroupName = "checkpoint.cri-shim.io"

// Resource is the plural resource name PodCheckpoints are served under.
const Resource = "podcheckpoints"

// SchemeGroupVersion is the group and version of these types.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

var (
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme registers PodCheckpoint and PodCheckpointList.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &PodCheckpoint{}, &PodCheckpointList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}
