package fleet

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/kubeapi"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/ociartifact"
	"github.com/cri-shim/cri-shim/internal/podcheckpoint"
	"github.com/cri-shim/cri-shim/internal/podstatus"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/restartapi"
)

// simRuntime is a node's runtime as the PodCheckpoint controller sees it:
// every pod the harness bound to the node has a ready sandbox whose
// containers run.
type simRuntime struct {
	mu   sync.Mutex
	pods map[string]*corev1.Pod // by UID
}

func (r *simRuntime) set(p *corev1.Pod) {
	r.mu.Lock()
	r.pods[string(p.UID)] = p
	r.mu.Unlock()
}

func (r *simRuntime) remove(uid string) {
	r.mu.Lock()
	delete(r.pods, uid)
	r.mu.Unlock()
}

func (r *simRuntime) List(keep func(*podtable.Sandbox) bool) []podtable.Sandbox {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []podtable.Sandbox
	for uid, p := range r.pods {
		sb := podtable.Sandbox{ID: "sb-" + uid, Ready: true, Metadata: &runtimeapi.PodSandboxMetadata{Name: p.Name, Namespace: p.Namespace, Uid: uid}}
		if keep(&sb) {
			out = append(out, sb)
		}
	}
	return out
}

func (r *simRuntime) ListContainers(_ context.Context, in *runtimeapi.ListContainersRequest, _ ...grpc.CallOption) (*runtimeapi.ListContainersResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := &runtimeapi.ListContainersResponse{}
	for uid, p := range r.pods {
		if f := in.GetFilter(); f != nil && f.PodSandboxId != "" && f.PodSandboxId != "sb-"+uid {
			continue
		}
		for _, c := range p.Spec.Containers {
			out.Containers = append(out.Containers, &runtimeapi.Container{Id: uid + "-" + c.Name, PodSandboxId: "sb-" + uid,
				Metadata: &runtimeapi.ContainerMetadata{Name: c.Name}, Image: &runtimeapi.ImageSpec{Image: c.Image},
				State: runtimeapi.ContainerState_CONTAINER_RUNNING})
		}
	}
	return out, nil
}

// CheckpointPod writes the manifest of a capture of the asked containers, as
// the node's checkpoint service does (the images themselves do not matter
// to the API side).
func (r *simRuntime) CheckpointPod(_ context.Context, req *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error) {
	m := layout.Manifest{FormatVersion: layout.Version, SizeBytes: 4096, CheckpointedAt: time.Now()}
	for _, id := range req.ContainerIds {
		m.Containers = append(m.Containers, layout.ContainerEntry{Name: "app", ID: id, Archive: "containers/app.tar", Image: "registry.example/app:1"})
	}
	b, _ := json.Marshal(m)
	return &runtimeapi.CheckpointPodResponse{}, os.WriteFile(filepath.Join(req.OutputPath, "manifest.json"), b, 0o600)
}

// simNode is one node's shim, API side only.
type simNode struct {
	name     string
	rt       *simRuntime
	reporter *podstatus.Reporter
	api      *kubeapi.API
	reg      *prometheus.Registry // the writer's metrics
	restores *podcheckpoint.Restores
}

// registryAnswer is how long the simulated registry takes to answer a
// source check (one index GET).
const registryAnswer = 200 * time.Millisecond

// simSource answers every spec.sourceImage check as a registry serving a
// checkpoint of pod team-0/origin would (the registry itself is not what
// the harness measures).
type simSource struct{}

func (simSource) CheckSource(ctx context.Context, ns, pod, uid, ref string) (ociartifact.SourceInfo, error) {
	select {
	case <-ctx.Done():
		return ociartifact.SourceInfo{}, ctx.Err()
	case <-time.After(registryAnswer):
	}
	_, digest, _ := strings.Cut(ref, "@")
	return ociartifact.SourceInfo{Digest: digest, PodNamespace: ns, PodName: "origin", PodUID: "origin-uid", Containers: []string{"app"}}, nil
}

// pending is how many writes the node's API writer and event recorder
// have waiting.
func (n *simNode) pending() float64 {
	return n.metric("cri_shim_kubeapi_queue_items") + n.metric("cri_shim_kubeapi_event_queue_items")
}

// metric sums the samples of one of the writer's metrics.
func (n *simNode) metric(name string) float64 {
	mfs, _ := n.reg.Gather()
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return sum
}

func startShimNode(ctx context.Context, t testing.TB, cp *controlPlane, name, root string, log *slog.Logger) *simNode {
	t.Helper()
	_, kc := cp.pki.client(t, cp.host, "system:node:"+name, []string{"system:nodes"})
	kcfg := config.DefaultConfig().Kubernetes
	kcfg.Kubeconfig, kcfg.NodeName = kc, name
	api, err := kubeapi.Open(kcfg, log)
	if err != nil {
		t.Fatal(err)
	}
	n := &simNode{name: name, rt: &simRuntime{pods: map[string]*corev1.Pod{}}, api: api, reg: prometheus.NewRegistry()}
	n.reg.MustRegister(api.Collectors()...)
	n.reporter = podstatus.New(api, func() []restartapi.PodState { return nil }, log)
	events := func(ref corev1.ObjectReference, eventType, reason, note string) {
		api.Writes().Event(kubeapi.Event{Regarding: ref, Type: eventType, Reason: reason, Action: "Checkpoint", Note: note})
	}
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	go api.Run(ctx)
	go n.reporter.Run(ctx)
	n.restores = podcheckpoint.NewRestores(name, 15*time.Second, events)
	go podcheckpoint.Run(ctx, api.Client, name, dir, n.rt, n.rt, n.restores, nil, simSource{}, events, log)
	return n
}

// restart reports one in-place restart of pod through the node's real
// status writer and event recorder, as podstate does: started, then ended.
func (n *simNode) restart(p *corev1.Pod) bool {
	ref := restartapi.PodRef{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)}
	tr := restartapi.Trigger{Container: "app", ContainerID: string(p.UID) + "-app", ExitCode: 88, StartedAt: time.Now().Add(-time.Minute), FinishedAt: time.Now(), Action: "RestartAllContainers"}
	n.reporter.RestartStarted(ref, tr)
	n.reporter.RestartEnded(ref, tr, restartapi.Restarted)
	return true
}

// startBaselineNode runs what a kubelet asks of the API server at rest:
// the watches a kubelet 1.37 with no pods adds (measured on the test stack:
// bench/results/kubelet-watches-20261127.txt) but its PodCertificateRequests
// (certificates.k8s.io/v1, which this client-go does not have): its pods
// (spec.nodeName), its Node (metadata.name), Services, RuntimeClasses and
// CSIDrivers; and a lease renewed every 10 s (pkg/kubelet/nodelease,
// renewInterval 10 s). Node status reports every 5 minutes are left out:
// no phase here lasts that long.
func startBaselineNode(ctx context.Context, t testing.TB, cp *controlPlane, name string) {
	t.Helper()
	cfg, _ := cp.pki.client(t, cp.host, "system:node:"+name, []string{"system:nodes"})
	cfg.QPS, cfg.Burst = 50, 100 // the kubelet's defaults (kubeAPIQPS, kubeAPIBurst)
	cfg.UserAgent = "kubelet-baseline/fleet"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pods := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", name).String()
	}))
	_ = pods.Core().V1().Pods().Informer()
	node := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
	}))
	_ = node.Core().V1().Nodes().Informer()
	all := informers.NewSharedInformerFactory(cs, 0)
	_ = all.Core().V1().Services().Informer()
	_ = all.Node().V1().RuntimeClasses().Informer()
	_ = all.Storage().V1().CSIDrivers().Informer()
	for _, f := range []informers.SharedInformerFactory{pods, node, all} {
		f.Start(ctx.Done())
	}
	go func() {
		leases := cs.CoordinationV1().Leases(corev1.NamespaceNodeLease)
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		// As the kubelet: an update of the lease it last wrote, a read
		// only when that fails.
		var last *coordv1.Lease
		for {
			now := metav1.NewMicroTime(time.Now())
			if last != nil {
				l := last.DeepCopy()
				l.Spec.RenewTime = &now
				if l, err = leases.Update(ctx, l, metav1.UpdateOptions{}); err == nil {
					last = l
				} else {
					last = nil
				}
			}
			if last == nil {
				l, err := leases.Get(ctx, name, metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					l, err = leases.Create(ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name},
						Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now}}, metav1.CreateOptions{})
				}
				if err == nil {
					last = l
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}
