package kubeapi

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Resources is every call the shim makes on built-in resources, as the
// node. It is this short on purpose: client-go's typed clientset
// (k8s.io/client-go/kubernetes) and its scheme register every API group of
// Kubernetes, which doubled the binary and the memory of a shim that never
// talks to the API server (bench/results/footprint-*.txt). TestBinaryHasNoClientset
// in cmd/cri-shim keeps them out.
type Resources interface {
	GetNode(ctx context.Context, name string) (*corev1.Node, error)
	GetPod(ctx context.Context, ns, name string) (*corev1.Pod, error)
	// GetSecret reads a secret; the Node authorizer allows only those the
	// node's pods reference (a restore's image pull secrets).
	GetSecret(ctx context.Context, ns, name string) (*corev1.Secret, error)
	// ListPods and WatchPods cover all namespaces.
	ListPods(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	WatchPods(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	// PatchPodStatus applies a strategic merge patch to the pod's status.
	PatchPodStatus(ctx context.Context, ns, name string, patch []byte) error
	CreateEvent(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error)
	// PatchEvent applies a strategic merge patch to an event.
	PatchEvent(ctx context.Context, ns, name string, patch []byte) (*eventsv1.Event, error)
}

// codecs know only the types the shim reads and writes: core/v1 and
// events.k8s.io/v1 (metav1's Status and watch events come with each).
// Built on the first connection, so a standalone shim registers nothing.
var codecs = sync.OnceValues(func() (serializer.CodecFactory, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, eventsv1.AddToScheme} {
		if err := add(s); err != nil {
			return serializer.CodecFactory{}, err
		}
	}
	return serializer.NewCodecFactory(s), nil
})

// restResources is Resources on two REST clients with the node's config.
type restResources struct {
	core, events rest.Interface
	// coreWatch is core without the config's request timeout, which client-go
	// applies to the whole HTTP exchange (rest/transport.go, http.Client
	// Timeout) and so would cut every watch after it; a watch ends with its
	// context or the server's timeoutSeconds.
	coreWatch rest.Interface
}

func newRESTResources(cfg *rest.Config) (*restResources, error) {
	cf, err := codecs()
	if err != nil {
		return nil, err
	}
	client := func(apiPath string, gv schema.GroupVersion, timeout time.Duration) (rest.Interface, error) {
		c := rest.CopyConfig(cfg)
		c.Timeout = timeout
		c.APIPath = apiPath
		c.GroupVersion = &gv
		c.ContentType = runtime.ContentTypeJSON
		c.NegotiatedSerializer = cf.WithoutConversion()
		if c.UserAgent == "" {
			c.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		return rest.RESTClientFor(c)
	}
	core, err := client("/api", corev1.SchemeGroupVersion, cfg.Timeout)
	if err != nil {
		return nil, err
	}
	coreWatch, err := client("/api", corev1.SchemeGroupVersion, 0)
	if err != nil {
		return nil, err
	}
	events, err := client("/apis", eventsv1.SchemeGroupVersion, cfg.Timeout)
	if err != nil {
		return nil, err
	}
	return &restResources{core: core, coreWatch: coreWatch, events: events}, nil
}

func (r *restResources) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	out := &corev1.Node{}
	return out, r.core.Get().Resource("nodes").Name(name).Do(ctx).Into(out)
}

func (r *restResources) GetPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	out := &corev1.Pod{}
	return out, r.core.Get().Namespace(ns).Resource("pods").Name(name).Do(ctx).Into(out)
}

func (r *restResources) GetSecret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	out := &corev1.Secret{}
	return out, r.core.Get().Namespace(ns).Resource("secrets").Name(name).Do(ctx).Into(out)
}

func (r *restResources) ListPods(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	out := &corev1.PodList{}
	return out, r.core.Get().Resource("pods").VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(out)
}

func (r *restResources) WatchPods(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return r.coreWatch.Get().Resource("pods").VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
}

func (r *restResources) PatchPodStatus(ctx context.Context, ns, name string, patch []byte) error {
	return r.core.Patch(types.StrategicMergePatchType).Namespace(ns).Resource("pods").Name(name).
		SubResource("status").Body(patch).Do(ctx).Error()
}

func (r *restResources) CreateEvent(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	out := &eventsv1.Event{}
	return out, r.events.Post().Namespace(ev.Namespace).Resource("events").Body(ev).Do(ctx).Into(out)
}

func (r *restResources) PatchEvent(ctx context.Context, ns, name string, patch []byte) (*eventsv1.Event, error) {
	out := &eventsv1.Event{}
	return out, r.events.Patch(types.StrategicMergePatchType).Namespace(ns).Resource("events").Name(name).
		Body(patch).Do(ctx).Into(out)
}

// ResourcesFor is Resources on cfg, for a process that is not a node (the
// PodCheckpoint router) and loads its own configuration.
func ResourcesFor(cfg *rest.Config) (Resources, error) { return newRESTResources(cfg) }

// PodsListWatch lists and watches the pods of all namespaces that
// fieldSelector selects, for an informer.
func PodsListWatch(res Resources, fieldSelector string) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = fieldSelector
			return res.ListPods(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = fieldSelector
			return res.WatchPods(ctx, o)
		},
	}
}
