package podcheckpoint

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// Client reads and writes PodCheckpoints: a REST client over the generated
// types. One resource needs no generated clientset (docs/podcheckpoint.md).
type Client struct {
	rc rest.Interface
	// watch is rc without the config's request timeout, which client-go
	// applies to the whole HTTP exchange (rest/transport.go, http.Client
	// Timeout) and so would cut every watch after it.
	watch rest.Interface
}

// NewClient makes a Client from a client-go config (copied, not changed).
func NewClient(cfg *rest.Config) (*Client, error) {
	scheme := runtime.NewScheme()
	if err := cpv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &cpv1.SchemeGroupVersion
	c.APIPath = "/apis"
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("podcheckpoint client: %w", err)
	}
	c.Timeout = 0
	wc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("podcheckpoint client: %w", err)
	}
	return &Client{rc: rc, watch: wc}, nil
}

// Get reads one object.
func (c *Client) Get(ctx context.Context, ns, name string) (*cpv1.PodCheckpoint, error) {
	out := &cpv1.PodCheckpoint{}
	err := c.rc.Get().Namespace(ns).Resource(cpv1.Resource).Name(name).Do(ctx).Into(out)
	return out, err
}

// List lists the objects of ns ("" for all namespaces) that opts selects.
func (c *Client) List(ctx context.Context, ns string, opts metav1.ListOptions) (*cpv1.PodCheckpointList, error) {
	out := &cpv1.PodCheckpointList{}
	err := c.rc.Get().Namespace(ns).Resource(cpv1.Resource).
		VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(out)
	return out, err
}

// Watch watches the objects of ns ("" for all namespaces) that opts selects.
func (c *Client) Watch(ctx context.Context, ns string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.watch.Get().Namespace(ns).Resource(cpv1.Resource).
		VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
}

// Create creates pc.
func (c *Client) Create(ctx context.Context, pc *cpv1.PodCheckpoint) (*cpv1.PodCheckpoint, error) {
	out := &cpv1.PodCheckpoint{}
	err := c.rc.Post().Namespace(pc.Namespace).Resource(cpv1.Resource).Body(pc).Do(ctx).Into(out)
	return out, err
}

// Update writes pc's metadata and spec (optimistic: pc.ResourceVersion must be current).
func (c *Client) Update(ctx context.Context, pc *cpv1.PodCheckpoint) (*cpv1.PodCheckpoint, error) {
	out := &cpv1.PodCheckpoint{}
	err := c.rc.Put().Namespace(pc.Namespace).Resource(cpv1.Resource).Name(pc.Name).Body(pc).Do(ctx).Into(out)
	return out, err
}

// UpdateStatus writes pc's status through the status subresource (optimistic).
func (c *Client) UpdateStatus(ctx context.Context, pc *cpv1.PodCheckpoint) (*cpv1.PodCheckpoint, error) {
	out := &cpv1.PodCheckpoint{}
	err := c.rc.Put().Namespace(pc.Namespace).Resource(cpv1.Resource).Name(pc.Name).
		SubResource("status").Body(pc).Do(ctx).Into(out)
	return out, err
}

// SetLabel sets the label key of the object to value if the object is still
// at resourceVersion: a merge patch that carries the version, so the API
// server answers Conflict when the object changed.
func (c *Client) SetLabel(ctx context.Context, ns, name, resourceVersion, key, value string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": resourceVersion, "labels": map[string]string{key: value}}})
	if err != nil {
		return err
	}
	return c.rc.Patch(types.MergePatchType).Namespace(ns).Resource(cpv1.Resource).Name(name).Body(patch).Do(ctx).Error()
}

// Route sets the object's routing to node if the object is still at
// resourceVersion (the router's write: docs/podcheckpoint.md, "Routing"):
// the label v1alpha1.NodeLabel to NodeLabelValue(node) and, when that
// value is hashed, the annotation v1alpha1.NodeNameAnnotation to node, in
// one merge patch carrying the version; for a name the label holds whole
// the annotation is removed (null: RFC 7386).
func (c *Client) Route(ctx context.Context, ns, name, resourceVersion, node string) error {
	var full any // JSON null
	if cpv1.NodeLabelValue(node) != node {
		full = node
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": resourceVersion,
		"labels":      map[string]string{cpv1.NodeLabel: cpv1.NodeLabelValue(node)},
		"annotations": map[string]any{cpv1.NodeNameAnnotation: full}}})
	if err != nil {
		return err
	}
	return c.rc.Patch(types.MergePatchType).Namespace(ns).Resource(cpv1.Resource).Name(name).Body(patch).Do(ctx).Error()
}

// Delete deletes the object.
func (c *Client) Delete(ctx context.Context, ns, name string) error {
	return c.rc.Delete().Namespace(ns).Resource(cpv1.Resource).Name(name).Do(ctx).Error()
}
