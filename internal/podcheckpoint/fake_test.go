package podcheckpoint

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podtable"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

var gr = schema.GroupResource{Group: cpv1.GroupName, Resource: cpv1.Resource}

// fakeAPI keeps objects as the API server does for what the reconciler
// uses: a resource version per write, Conflict on a stale one, NotFound,
// status and object written separately, and a deleted object with
// finalizers kept until they are gone.
type fakeAPI struct {
	mu      sync.Mutex
	rv      int
	objs    map[string]*cpv1.PodCheckpoint
	history []string // Ready reasons written, in order
	// statusWrites are the status writes made, as "<name> <Exported
	// reason>", in order.
	statusWrites []string
	down         bool // every call fails as if the server did not answer
	// hold, when not nil, keeps every Get from answering until it is
	// closed (or the Get's context ends): a server that does not answer.
	hold        chan struct{}
	gets, inGet int // Get calls made, and those not returned yet
	// statusFault, when set, is asked before each status write with the
	// Ready reason it writes: an error fails the write, before it is
	// applied or, with applied, after (a server whose answer was lost).
	statusFault func(reason string) (applied bool, err error)
}

func newFakeAPI() *fakeAPI { return &fakeAPI{objs: map[string]*cpv1.PodCheckpoint{}} }

func (f *fakeAPI) put(pc *cpv1.PodCheckpoint) *cpv1.PodCheckpoint {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rv++
	pc = pc.DeepCopy()
	pc.ResourceVersion = strconv.Itoa(f.rv)
	f.objs[key(pc.Namespace, pc.Name)] = pc
	return pc.DeepCopy()
}

func (f *fakeAPI) Get(ctx context.Context, ns, name string) (*cpv1.PodCheckpoint, error) {
	f.mu.Lock()
	f.gets++
	f.inGet++
	hold := f.hold
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inGet--
		f.mu.Unlock()
	}()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, apierrors.NewServiceUnavailable("down")
	}
	pc := f.objs[key(ns, name)]
	if pc == nil {
		return nil, apierrors.NewNotFound(gr, name)
	}
	return pc.DeepCopy(), nil
}

func (f *fakeAPI) write(pc *cpv1.PodCheckpoint, statusOnly bool) (*cpv1.PodCheckpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, apierrors.NewServiceUnavailable("down")
	}
	cur := f.objs[key(pc.Namespace, pc.Name)]
	if cur == nil {
		return nil, apierrors.NewNotFound(gr, pc.Name)
	}
	if cur.ResourceVersion != pc.ResourceVersion {
		return nil, apierrors.NewConflict(gr, pc.Name, fmt.Errorf("stale %s, now %s", pc.ResourceVersion, cur.ResourceVersion))
	}
	var fault error
	if statusOnly && f.statusFault != nil {
		reason := ""
		if c := ready(pc); c != nil {
			reason = c.Reason
		}
		applied, err := f.statusFault(reason)
		if err != nil && !applied {
			return nil, err
		}
		fault = err
	}
	next := cur.DeepCopy()
	if statusOnly {
		next.Status = *pc.Status.DeepCopy()
		if c := ready(next); c != nil {
			f.history = append(f.history, c.Reason)
		}
		exp := ""
		if c := meta.FindStatusCondition(next.Status.Conditions, cpv1.ConditionExported); c != nil {
			exp = c.Reason
		}
		f.statusWrites = append(f.statusWrites, pc.Name+" "+exp)
	} else {
		next.Finalizers = append([]string(nil), pc.Finalizers...)
	}
	f.rv++
	next.ResourceVersion = strconv.Itoa(f.rv)
	if next.DeletionTimestamp != nil && len(next.Finalizers) == 0 {
		delete(f.objs, key(pc.Namespace, pc.Name))
	} else {
		f.objs[key(pc.Namespace, pc.Name)] = next
	}
	if fault != nil {
		return nil, fault
	}
	return next.DeepCopy(), nil
}

func (f *fakeAPI) Update(_ context.Context, pc *cpv1.PodCheckpoint) (*cpv1.PodCheckpoint, error) {
	return f.write(pc, false)
}

func (f *fakeAPI) UpdateStatus(_ context.Context, pc *cpv1.PodCheckpoint) (*cpv1.PodCheckpoint, error) {
	return f.write(pc, true)
}

// outage makes the server fail every call while then runs, and for d after.
func (f *fakeAPI) outage(d time.Duration, then func()) {
	f.mu.Lock()
	f.down = true
	f.mu.Unlock()
	then()
	time.Sleep(d)
	f.mu.Lock()
	f.down = false
	f.mu.Unlock()
}

// getCalls reports the Get calls made and those still running.
func (f *fakeAPI) getCalls() (made, running int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gets, f.inGet
}

func (f *fakeAPI) reasons() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.history...)
}

// fakePods serves pods by namespace/name.
type fakePods map[string]*corev1.Pod

func (p fakePods) GetPod(_ context.Context, ns, name string) (*corev1.Pod, error) {
	if pod := p[key(ns, name)]; pod != nil {
		return pod.DeepCopy(), nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, name)
}

// fakeRuntime lists sandboxes as the pod table does and their running
// containers as containerd's CRI does.
type fakeRuntime struct {
	sandboxes  []*runtimeapi.PodSandbox
	containers []*runtimeapi.Container
}

// List is the pod table's: the sandboxes keep selects.
func (r *fakeRuntime) List(keep func(*podtable.Sandbox) bool) []podtable.Sandbox {
	var out []podtable.Sandbox
	for _, sb := range r.sandboxes {
		s := podtable.Sandbox{ID: sb.Id, Metadata: sb.Metadata, Labels: sb.Labels, Annotations: sb.Annotations,
			Ready: sb.State == runtimeapi.PodSandboxState_SANDBOX_READY}
		if keep == nil || keep(&s) {
			out = append(out, s)
		}
	}
	return out
}

func (r *fakeRuntime) ListContainers(_ context.Context, in *runtimeapi.ListContainersRequest, _ ...grpc.CallOption) (*runtimeapi.ListContainersResponse, error) {
	out := &runtimeapi.ListContainersResponse{}
	for _, c := range r.containers {
		if st := in.GetFilter().GetState(); st != nil && c.State != st.State {
			continue // containerd filters by state too
		}
		if c.PodSandboxId == in.GetFilter().GetPodSandboxId() {
			out.Containers = append(out.Containers, c)
		}
	}
	return out, nil
}

func (r *fakeRuntime) addPod(p *corev1.Pod) {
	sb := "sb-" + string(p.UID)
	r.sandboxes = append(r.sandboxes, &runtimeapi.PodSandbox{Id: sb,
		Metadata: &runtimeapi.PodSandboxMetadata{Name: p.Name, Namespace: p.Namespace, Uid: string(p.UID)},
		State:    runtimeapi.PodSandboxState_SANDBOX_READY,
		Labels:   map[string]string{"io.kubernetes.pod.namespace": p.Namespace, "io.kubernetes.pod.name": p.Name}})
	for _, c := range p.Spec.Containers {
		r.containers = append(r.containers, &runtimeapi.Container{Id: sb + "-" + c.Name, PodSandboxId: sb,
			Metadata: &runtimeapi.ContainerMetadata{Name: c.Name}, Image: &runtimeapi.ImageSpec{Image: c.Image},
			State: runtimeapi.ContainerState_CONTAINER_RUNNING})
	}
}

// fakeCheckpointer writes a manifest for the containers it is asked for,
// after release is closed (nil: at once); fail makes it fail instead,
// leaving a partial file behind as a failed capture may before cleanup;
// blockTemplate leaves a directory where the template file goes.
type fakeCheckpointer struct {
	mu            sync.Mutex
	calls         int
	release       chan struct{}
	fail          error
	blockTemplate bool
	rt            *fakeRuntime
}

func (c *fakeCheckpointer) CheckpointPod(ctx context.Context, req *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error) {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
	if _, ok := ctx.Deadline(); !ok {
		return nil, status.Error(codes.InvalidArgument, "no deadline")
	}
	if c.release != nil {
		select {
		case <-c.release:
		case <-ctx.Done():
			return nil, status.Error(codes.DeadlineExceeded, "deadline")
		}
	}
	if err := os.WriteFile(filepath.Join(req.OutputPath, "partial"), []byte("x"), 0o600); err != nil {
		return nil, err
	}
	if c.fail != nil {
		return nil, c.fail
	}
	if c.blockTemplate {
		if err := os.MkdirAll(filepath.Join(req.OutputPath, TemplateFile, "x"), 0o700); err != nil {
			return nil, err
		}
	}
	m := layout.Manifest{FormatVersion: layout.Version, SizeBytes: 4096}
	for _, id := range req.ContainerIds {
		for _, ct := range c.rt.containers {
			if ct.Id == id {
				n := ct.Metadata.Name
				m.Containers = append(m.Containers, layout.ContainerEntry{Name: n, ID: id, Archive: "containers/" + n + ".tar", Image: ct.Image.Image})
			}
		}
	}
	b, _ := json.Marshal(m)
	return &runtimeapi.CheckpointPodResponse{}, os.WriteFile(filepath.Join(req.OutputPath, "manifest.json"), b, 0o600)
}

func (c *fakeCheckpointer) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

func errNotFound(name string) error { return apierrors.NewNotFound(gr, name) }

// fakeEvents records the reasons of the events reported, per object name.
type fakeEvents struct {
	mu  sync.Mutex
	got []string // "<kind>/<name> <type> <reason>"
}

func (f *fakeEvents) sink(ref corev1.ObjectReference, eventType, reason, _ string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, ref.Kind+"/"+ref.Name+" "+eventType+" "+reason)
}

func (f *fakeEvents) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}
