// Package kubeapitest puts client-go's fake clientset behind
// kubeapi.Resources, for tests: its object tracker keeps objects as the API
// server does for what the shim calls (strategic merge patches of a pod's
// status and of events, NotFound, AlreadyExists). Only tests import it; the
// shim does not link the clientset.
package kubeapitest

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Clientset is kubeapi.Resources on a clientset (usually fake.NewClientset).
type Clientset struct{ kubernetes.Interface }

// GetNode reads a node.
func (c Clientset) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	return c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

// GetPod reads a pod.
func (c Clientset) GetPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	return c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
}

// GetSecret reads a secret.
func (c Clientset) GetSecret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	return c.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
}

// ListPods lists the pods of all namespaces.
func (c Clientset) ListPods(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	return c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
}

// WatchPods watches the pods of all namespaces.
func (c Clientset) WatchPods(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return c.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, opts)
}

// PatchPodStatus applies a strategic merge patch to a pod's status.
func (c Clientset) PatchPodStatus(ctx context.Context, ns, name string, patch []byte) error {
	_, err := c.CoreV1().Pods(ns).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

// CreateEvent creates an event.
func (c Clientset) CreateEvent(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	return c.EventsV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})
}

// PatchEvent applies a strategic merge patch to an event.
func (c Clientset) PatchEvent(ctx context.Context, ns, name string, patch []byte) (*eventsv1.Event, error) {
	return c.EventsV1().Events(ns).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
}
