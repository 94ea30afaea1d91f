package podcheckpoint

import (
	"errors"
	"fmt"

	gcrname "github.com/google/go-containerregistry/pkg/name"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// exportRecord is the repository pc records that its holder pushed its
// checkpoint to, when the record is one a node of this cluster wrote for an
// export the namespace asked for: spec.export is set; Exported is True;
// status.export is set; the holder (status.nodeName) is the node the router
// routed pc to (v1alpha1.RoutedTo: the admission policy lets only that node
// write its status, so a status naming another holder was not written under
// the policy); and status.export.image is spec.export.image's repository at
// status.export.digest (the namespace chose the repository; the status only
// says what was pushed there). Provenance and restore by name on another
// node trust a record only so. The error says which part fails.
func exportRecord(pc *cpv1.PodCheckpoint) (gcrname.Repository, error) {
	s := pc.Status.Export
	if pc.Spec.Export == nil {
		return gcrname.Repository{}, errors.New("it has no spec.export")
	}
	if c := meta.FindStatusCondition(pc.Status.Conditions, cpv1.ConditionExported); c == nil || c.Status != metav1.ConditionTrue {
		return gcrname.Repository{}, errors.New("its Exported condition is not True")
	}
	if s == nil {
		return gcrname.Repository{}, errors.New("it has no status.export")
	}
	if h := pc.Status.NodeName; h == "" || !cpv1.RoutedTo(pc.Labels, pc.Annotations, h) {
		return gcrname.Repository{}, fmt.Errorf("its holder %q is not the node it is routed to (label %s %q)", h, cpv1.NodeLabel, pc.Labels[cpv1.NodeLabel])
	}
	// Parsed as the push names it: no tag is ":latest"; the registry is
	// spelt out (the schema's pattern, and the push refuses it otherwise).
	tag, err := gcrname.NewTag(pc.Spec.Export.Image)
	if err != nil {
		return gcrname.Repository{}, fmt.Errorf("spec.export.image: %v", err)
	}
	if want := tag.Context().Digest(s.Digest).String(); s.Image != want {
		return gcrname.Repository{}, fmt.Errorf("status.export.image %q is not spec.export.image's repository at status.export.digest (%s)", s.Image, want)
	}
	return tag.Context(), nil
}
