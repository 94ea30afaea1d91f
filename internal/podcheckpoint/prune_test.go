package podcheckpoint

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// listOnly is a ListWatch the reflector lists (it does not stream the
// initial objects through the watch, as a real API server may).
type listOnly struct{ *cache.ListWatch }

func (listOnly) IsWatchListSemanticsUnSupported() bool { return true }

// staticInformer lists objs and then watches nothing.
func staticInformer(objs ...*cpv1.PodCheckpoint) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			l := &cpv1.PodCheckpointList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}
			for _, o := range objs {
				l.Items = append(l.Items, *o)
			}
			return l, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return watch.NewFake(), nil },
	}
	return cache.NewSharedIndexInformer(listOnly{lw}, &cpv1.PodCheckpoint{}, 0, cache.Indexers{})
}

// Issue 28 item 5: when the node's pod set changes, the objects only the
// cancelled watch held are forgotten once the new watches have synced:
// restore by name no longer answers from their last copy.
func TestObjectsOfACancelledWatchAreForgotten(t *testing.T) {
	e := newEnv(t)
	w := &Watches{r: e.r, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	obj := func(name string) *cpv1.PodCheckpoint {
		return &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("u-" + name)}}
	}
	for _, n := range []string{"held", "source", "stale"} {
		e.r.Observe(obj(n))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held, src := staticInformer(obj("held")), staticInformer(obj("source"))
	go held.Run(ctx.Done())
	go src.Run(ctx.Done())
	done := make(chan struct{})
	go func() { w.pruneAfterSync(ctx, held, src); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("prune did not finish once the informers synced")
	}
	if e.r.Lookup("ns", "stale") != nil {
		t.Fatal("an object no watch holds any more is still answered")
	}
	for _, n := range []string{"held", "source"} {
		if e.r.Lookup("ns", n) == nil {
			t.Fatalf("object %q, which a watch holds, was forgotten", n)
		}
	}
	// A sources informer replaced before it synced: its prune gives up
	// when its context ends, forgetting nothing.
	e.r.Observe(obj("stale"))
	never := cache.NewSharedIndexInformer(listOnly{&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, _ metav1.ListOptions) (runtime.Object, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return watch.NewFake(), nil },
	}}, &cpv1.PodCheckpoint{}, 0, cache.Indexers{})
	srcCtx, srcCancel := context.WithCancel(ctx)
	go never.Run(srcCtx.Done())
	done = make(chan struct{})
	go func() { w.pruneAfterSync(srcCtx, held, never); close(done) }()
	srcCancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("prune of a replaced informer did not give up")
	}
	if e.r.Lookup("ns", "stale") == nil {
		t.Fatal("a prune whose informer never synced forgot an object")
	}
}
