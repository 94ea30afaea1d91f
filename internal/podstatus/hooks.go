package podstatus

import (
	"context"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
	"github.com/cri-shim/cri-shim/internal/podtable"
)

var _ podtable.Admitter = (*Reporter)(nil)

// Admit queues, once the sandbox exists and every other feature recorded it
// (the reporter is registered last), the pod's readiness gate and the events
// for its refused annotations.
func (r *Reporter) Admit(_ context.Context, p *podtable.Pod) (podtable.Admission, error) {
	return podtable.Admission{Commit: func(context.Context, string) error {
		md := p.Request.GetConfig().GetMetadata()
		r.sandboxStarted(kubeapi.PodRef{Namespace: md.GetNamespace(), Name: md.GetName(), UID: md.GetUid()}, p.Request.GetConfig().GetAnnotations(), p.Spec)
		return nil
	}}, nil
}
