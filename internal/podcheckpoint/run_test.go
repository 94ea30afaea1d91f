package podcheckpoint

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// listOnly is a ListWatch the reflector lists (it does not stream the
// initial objects through the watch, as a real API server may).
type listOnly struct{ *cache.ListWatch }

func (listOnly) IsWatchListSemanticsUnSupported() bool { return true }

// The reconciler reads pods from the node's pod informer: an error until it
// has listed, then the node's pods, NotFound for any other.
func TestInformerPodsReadTheCache(t *testing.T) {
	mine := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "u1"}, Spec: corev1.PodSpec{NodeName: "node-1"}}
	list := make(chan struct{})
	inf := cache.NewSharedIndexInformer(listOnly{&cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			<-list
			return &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: []corev1.Pod{mine}}, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return watch.NewFake(), nil },
	}}, &corev1.Pod{}, 0, cache.Indexers{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go inf.Run(ctx.Done())
	pods := informerPods{inf}
	if _, err := pods.GetPod(ctx, "ns", "web"); err == nil {
		t.Fatal("a pod was answered before the informer listed")
	}
	close(list)
	deadline := time.Now().Add(10 * time.Second)
	for !inf.HasSynced() {
		if time.Now().After(deadline) {
			t.Fatal("the pod informer did not sync")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if p, err := pods.GetPod(ctx, "ns", "web"); err != nil || p.UID != "u1" {
		t.Fatalf("the node's pod: %v, %v", p, err)
	}
	if _, err := pods.GetPod(ctx, "ns", "db"); !apierrors.IsNotFound(err) {
		t.Fatalf("a pod the node does not run: %v, want NotFound", err)
	}
}

// A list or watch that fails because the CRD or its RBAC is missing is
// told once, with the switch that turns the controller off.
func TestWatchErrorNamesTheSwitchOnce(t *testing.T) {
	var buf strings.Builder
	w := &Watches{log: slog.New(slog.NewTextHandler(&buf, nil))}
	notFound := apierrors.NewNotFound(schema.GroupResource{Group: "checkpoint.cri-shim.io", Resource: "podcheckpoints"}, "")
	for range 3 {
		w.watchError(context.Background(), nil, notFound)
	}
	if n := strings.Count(buf.String(), "level=WARN"); n != 1 || !strings.Contains(buf.String(), "pod_checkpoints = false") {
		t.Fatalf("%d warnings, want one naming the switch:\n%s", n, buf.String())
	}
	w.watchError(context.Background(), nil, errors.New("connection refused"))
	if n := strings.Count(buf.String(), "level=WARN"); n != 2 {
		t.Fatalf("another cause not told: %d warnings", n)
	}
}
