package ckptrouter

import (
	"context"
	"log/slog"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
	"github.com/cri-shim/cri-shim/internal/podcheckpoint"
)

// NewForConfig is a router on the API server of cfg: the bound pods of all
// namespaces (field selector spec.nodeName!=), every PodCheckpoint, and the
// routing written as a merge patch at the object's version (Client.Route).
func NewForConfig(cfg *rest.Config, log *slog.Logger) (*Router, error) {
	res, err := kubeapi.ResourcesFor(cfg)
	if err != nil {
		return nil, err
	}
	objects, err := podcheckpoint.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	pods := kubeapi.PodsListWatch(res, fields.OneTermNotEqualSelector("spec.nodeName", "").String())
	objs := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return objects.List(ctx, "", o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return objects.Watch(ctx, "", o)
		},
	}
	return New(pods, objs, objects.Route, log), nil
}
