package podcheckpoint

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podtable"
)

// runningContainers returns the IDs of the sandbox's running containers, or the name
// of a container of the pod's spec (or a sidecar) that is not running.
func (r *Reconciler) runningContainers(ctx context.Context, sandbox string, pod *corev1.Pod) ([]string, string, error) {
	cs, err := r.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		PodSandboxId: sandbox, State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}}})
	if err != nil {
		return nil, "", fmt.Errorf("listing containers: %w", err)
	}
	names := map[string]bool{}
	var ids []string
	for _, c := range cs.Containers {
		names[c.GetMetadata().GetName()] = true
		ids = append(ids, c.Id)
	}
	for _, c := range pod.Spec.Containers {
		if !names[c.Name] {
			return nil, c.Name, nil
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways && !names[c.Name] {
			return nil, c.Name, nil
		}
	}
	return ids, "", nil
}

// sandbox is the ready sandbox of the pod on this node (the pod table's),
// nil if none.
func (r *Reconciler) sandbox(ns, pod string) *podtable.Sandbox {
	sbs := r.rt.List(func(s *podtable.Sandbox) bool {
		return s.Ready && s.Metadata.GetNamespace() == ns && s.Metadata.GetName() == pod
	})
	if len(sbs) == 0 {
		return nil
	}
	return &sbs[0]
}
