package podcheckpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

type env struct {
	events *fakeEvents
	api    *fakeAPI
	rt     *fakeRuntime
	pods   fakePods
	ck     *fakeCheckpointer
	r      *Reconciler
	root   string
}

func newEnv(t *testing.T) *env {
	e := &env{api: newFakeAPI(), rt: &fakeRuntime{}, pods: fakePods{}, root: t.TempDir(), events: &fakeEvents{}}
	e.ck = &fakeCheckpointer{rt: e.rt}
	e.r = NewReconciler(Config{Node: "node-a", Root: e.root, DefaultTimeout: 10 * time.Second},
		e.ck, e.rt, e.api, e.pods, e.events.sink, slog.New(slog.NewTextHandler(io.Discard, nil)))
	e.r.retryEvery = 10 * time.Millisecond
	return e
}

func (e *env) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func (e *env) pod(ns, name, uid string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{
			{Name: "main", Image: "busybox"}, {Name: "side", Image: "nginx"}}},
	}
	e.pods[key(ns, name)] = p
	e.rt.addPod(p)
	return p
}

// create stores pc as the API server would and hands it to the reconciler
// as a watch would; it returns the stored copy.
func (e *env) create(pc *cpv1.PodCheckpoint) *cpv1.PodCheckpoint {
	if pc.UID == "" {
		pc.UID = types.UID("obj-" + pc.Name)
	}
	out := e.api.put(pc)
	e.r.Observe(out.DeepCopy())
	return out
}

func object(ns, name, pod string) *cpv1.PodCheckpoint {
	return &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 1},
		Spec: cpv1.PodCheckpointSpec{SourcePodName: pod}}
}

// waitEvents waits for exactly want to have been emitted: an outcome's event
// follows its status write, which the test may see first.
func (e *env) waitEvents(t *testing.T, want ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for got := e.events.list(); !slices.Equal(got, want); got = e.events.list() {
		if time.Now().After(deadline) {
			t.Fatalf("events %v, want %v", got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// eventually waits up to 5 s for cond, failing with what.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (e *env) waitReason(t *testing.T, ns, name, reason string) *cpv1.PodCheckpoint {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		pc, err := e.api.Get(context.Background(), ns, name)
		if err == nil {
			if c := ready(pc); c != nil && c.Reason == reason {
				return pc
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s never reached %s: %+v (%v); reasons written %v", ns, name, reason, pc, err, e.api.reasons())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An object for a pod of this node goes Pending -> CheckpointInProgress ->
// CheckpointCompleted, held by the node with its finalizer, and the status
// carries what KEP-5823 asks.
func TestCheckpointOfALocalPod(t *testing.T) {
	e := newEnv(t)
	e.run(t)
	e.pod("ns", "web", "uid-1")
	e.create(object("ns", "cp", "web"))
	pc := e.waitReason(t, "ns", "cp", cpv1.ReasonCompleted)
	if got, want := e.api.reasons(), []string{cpv1.ReasonPending, cpv1.ReasonInProgress, cpv1.ReasonCompleted}; !slices.Equal(got, want) {
		t.Errorf("reasons written %v, want %v", got, want)
	}
	s := pc.Status
	if s.NodeName != "node-a" || s.SourcePodUID == nil || *s.SourcePodUID != "uid-1" {
		t.Errorf("node %q, source UID %v", s.NodeName, s.SourcePodUID)
	}
	if ready(pc).Status != metav1.ConditionTrue || ready(pc).ObservedGeneration != 1 {
		t.Errorf("Ready %+v", ready(pc))
	}
	if s.CheckpointLocation == nil || s.CheckpointLocation.Type != cpv1.CheckpointSourceTypeNodeLocal ||
		s.CheckpointLocation.NodeLocal.Path != "pcp-obj-cp" {
		t.Errorf("location %+v", s.CheckpointLocation)
	}
	if _, err := os.Stat(filepath.Join(e.root, "pcp-obj-cp", "manifest.json")); err != nil {
		t.Errorf("data not at the location: %v", err)
	}
	if s.CompletionTime == nil || s.SizeBytes != 4096 || len(s.CheckpointedContainers) != 2 ||
		s.CheckpointedContainers[1] != (cpv1.PodCheckpointContainerStatus{Name: "side", Image: "nginx"}) {
		t.Errorf("completion %v, size %d, containers %+v", s.CompletionTime, s.SizeBytes, s.CheckpointedContainers)
	}
	// The template is in the data directory (0600), the status names its
	// spec's digest only.
	tf := filepath.Join(e.root, "pcp-obj-cp", TemplateFile)
	if st, err := os.Stat(tf); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("template file: %v, %v", st, err)
	}
	tp, err := readTemplate(filepath.Join(e.root, "pcp-obj-cp"))
	if err != nil || tp.Spec.NodeName != "" || tp.Labels["app"] != "web" || len(tp.Spec.Containers) != 2 {
		t.Fatalf("template %+v, %v", tp, err)
	}
	if want, _ := SpecDigest(Template(e.pods["ns/web"])); s.PodSpecDigest != want || !validDigest(want) {
		t.Errorf("status.podSpecDigest %q, want %q", s.PodSpecDigest, want)
	}
	if raw, err := json.Marshal(pc.Status); err != nil || strings.Contains(string(raw), `"spec"`) {
		t.Errorf("status carries a pod spec: %s, %v", raw, err)
	}
	if !slices.Contains(pc.Finalizers, cpv1.NodeDataFinalizer) {
		t.Errorf("finalizers %v", pc.Finalizers)
	}
	e.waitEvents(t, "PodCheckpoint/cp Normal CheckpointStarted", "PodCheckpoint/cp Normal CheckpointSucceeded")
}

// An object this node holds whose pod no longer runs here fails.
func TestSourcePodGone(t *testing.T) {
	e := newEnv(t)
	e.run(t)
	pc := object("ns", "cp", "gone")
	pc.Status.NodeName = "node-a"
	setReady(&pc.Status, metav1.ConditionFalse, cpv1.ReasonPending, "", 1, time.Now())
	e.create(pc)
	got := e.waitReason(t, "ns", "cp", cpv1.ReasonFailed)
	if !strings.Contains(ready(got).Message, "no longer runs") {
		t.Errorf("message %q", ready(got).Message)
	}
	e.waitEvents(t, "PodCheckpoint/cp Warning CheckpointFailed")
}

// An object naming a pod this node does not run is left alone, as is an
// object another node holds and one naming a registry's checkpoint.
func TestOthersObjectsLeftAlone(t *testing.T) {
	e := newEnv(t)
	e.run(t)
	e.pod("ns", "web", "uid-1")
	theirs := object("ns", "theirs", "web")
	theirs.Status.NodeName = "node-b"
	img := object("ns", "img", "")
	img.Spec.SourceImage = "127.0.0.1:5000/cp/web@sha256:" + strings.Repeat("a", 64)
	img.Status.NodeName = "node-a"
	var others []*cpv1.PodCheckpoint // as created
	for _, pc := range []*cpv1.PodCheckpoint{
		object("ns", "elsewhere", "not-here"),
		object("other-ns", "same-name", "web"), // same pod name, other namespace
		theirs, img,
	} {
		others = append(others, e.create(pc))
	}
	// One worker takes the queue in order: once an object of this node's
	// pod, queued after them, is done, each of them has been looked at.
	e.create(object("ns", "mine", "web"))
	e.waitReason(t, "ns", "mine", cpv1.ReasonCompleted)
	if r := e.api.reasons(); !slices.Equal(r, []string{cpv1.ReasonPending, cpv1.ReasonInProgress, cpv1.ReasonCompleted}) || e.ck.count() != 1 {
		t.Errorf("wrote %v, checkpointed %d times; want only the Ready reasons of ns/mine and its checkpoint", r, e.ck.count())
	}
	for _, was := range others {
		pc, err := e.api.Get(context.Background(), was.Namespace, was.Name)
		if err != nil {
			t.Fatal(err)
		}
		if pc.ResourceVersion != was.ResourceVersion {
			t.Errorf("%s/%s written: resource version %s, created as %s", was.Namespace, was.Name, pc.ResourceVersion, was.ResourceVersion)
		}
	}
}

// A live pod whose UID is not spec.sourcePodUID fails the object with
// SourcePodReplaced and is not checkpointed; so does one whose UID changed
// after the node pinned it.
func TestSourcePodReplaced(t *testing.T) {
	e := newEnv(t)
	e.run(t)
	e.pod("ns", "web", "uid-2")
	pinned := object("ns", "pinned", "web")
	old := types.UID("uid-1")
	pinned.Spec.SourcePodUID = &old
	e.create(pinned)
	pc := e.waitReason(t, "ns", "pinned", cpv1.ReasonSourcePodReplaced)
	if pc.Status.SourcePodUID == nil || *pc.Status.SourcePodUID != "uid-2" || pc.Status.NodeName != "node-a" {
		t.Errorf("status %+v", pc.Status)
	}
	held := object("ns", "held", "web")
	held.Status.NodeName = "node-a"
	held.Status.SourcePodUID = &old
	setReady(&held.Status, metav1.ConditionFalse, cpv1.ReasonPending, "", 1, time.Now())
	e.create(held)
	e.waitReason(t, "ns", "held", cpv1.ReasonSourcePodReplaced)
	if e.ck.count() != 0 {
		t.Errorf("checkpointed %d times", e.ck.count())
	}
}

// However often the object is seen while its checkpoint runs, one runs.
func TestOneCheckpointInFlight(t *testing.T) {
	e := newEnv(t)
	e.ck.release = make(chan struct{})
	e.pod("ns", "db", "uid-db")
	e.run(t)
	e.pod("ns", "web", "uid-1")
	e.create(object("ns", "cp", "web"))
	pc := e.waitReason(t, "ns", "cp", cpv1.ReasonInProgress)
	e.create(object("ns", "cp2", "web")) // a second object for the same pod waits
	for range 50 {
		e.r.Observe(pc)
		time.Sleep(2 * time.Millisecond) // spread over the worker's turns
	}
	// An object of another pod, queued after the copies, starts its own
	// checkpoint once the worker has taken them all.
	e.create(object("ns", "other", "db"))
	e.waitReason(t, "ns", "other", cpv1.ReasonInProgress)
	eventually(t, "the other pod's checkpoint never called", func() bool { return e.ck.count() >= 2 })
	if n := e.ck.count(); n != 2 {
		t.Fatalf("%d checkpoints in flight, want 2: one of web (however often its object was seen) and one of db", n)
	}
	close(e.ck.release)
	e.waitReason(t, "ns", "cp", cpv1.ReasonCompleted)
	e.waitReason(t, "ns", "cp2", cpv1.ReasonCompleted)
	e.waitReason(t, "ns", "other", cpv1.ReasonCompleted)
	if n := e.ck.count(); n != 3 {
		t.Errorf("%d checkpoints, want 3", n)
	}
}

// An object this node held in progress when its shim died is finalised as
// CheckpointFailed and its partial data removed (KEP-5823).
func TestRestartMidCheckpointFails(t *testing.T) {
	e := newEnv(t)
	e.pod("ns", "web", "uid-1")
	pc := object("ns", "cp", "web")
	pc.UID = "obj-cp"
	pc.Status.NodeName = "node-a"
	pc.Finalizers = []string{cpv1.NodeDataFinalizer}
	setReady(&pc.Status, metav1.ConditionFalse, cpv1.ReasonInProgress, "", 1, time.Now())
	dir := filepath.Join(e.root, DataDir(pc))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "half"), []byte("x"), 0o600)
	e.run(t)
	e.create(pc)
	got := e.waitReason(t, "ns", "cp", cpv1.ReasonFailed)
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("partial data left: %v", err)
	}
	if ready(got).Message == "" || e.ck.count() != 0 {
		t.Errorf("message %q, checkpoints %d", ready(got).Message, e.ck.count())
	}
}

// A failed checkpoint leaves no data and says why; so does a template that
// cannot be recorded (a Ready object always has its template on the node).
func TestFailedCheckpoint(t *testing.T) {
	for _, tc := range []struct {
		what string
		edit func(*fakeCheckpointer)
		want string
	}{
		{"capture fails", func(c *fakeCheckpointer) { c.fail = errors.New("criu: dump failed") }, "dump failed"},
		{"template not written", func(c *fakeCheckpointer) { c.blockTemplate = true }, TemplateFile},
	} {
		t.Run(tc.what, func(t *testing.T) {
			e := newEnv(t)
			tc.edit(e.ck)
			e.run(t)
			e.pod("ns", "web", "uid-1")
			e.create(object("ns", "cp", "web"))
			pc := e.waitReason(t, "ns", "cp", cpv1.ReasonFailed)
			if _, err := os.Stat(filepath.Join(e.root, DataDir(pc))); !os.IsNotExist(err) {
				t.Errorf("data left: %v", err)
			}
			if m := ready(pc).Message; !strings.Contains(m, tc.want) || pc.Status.PodSpecDigest != "" {
				t.Errorf("message %q, digest %q", m, pc.Status.PodSpecDigest)
			}
		})
	}
}

// Deleting an object removes the node's data, then the finalizer.
func TestDeleteRemovesData(t *testing.T) {
	e := newEnv(t)
	e.run(t)
	e.pod("ns", "web", "uid-1")
	e.create(object("ns", "cp", "web"))
	pc := e.waitReason(t, "ns", "cp", cpv1.ReasonCompleted)
	dir := filepath.Join(e.root, DataDir(pc))
	now := metav1.Now()
	pc.DeletionTimestamp = &now
	e.r.Observe(e.api.put(pc))
	eventually(t, "object never released", func() bool {
		_, err := e.api.Get(context.Background(), "ns", "cp")
		return err != nil
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("data left after delete: %v", err)
	}
	e.r.Forget("ns", "cp") // the watch's delete
	e.r.mu.Lock()
	defer e.r.mu.Unlock()
	if len(e.r.objects)+len(e.r.started)+len(e.r.claimed) != 0 {
		t.Errorf("kept after the delete: %d objects, %d started, %d claimed", len(e.r.objects), len(e.r.started), len(e.r.claimed))
	}
}

// The outcome of a checkpoint taken while the API server does not answer is
// written once it answers again.
func TestStatusCatchesUp(t *testing.T) {
	e := newEnv(t)
	e.ck.release = make(chan struct{})
	e.run(t)
	e.pod("ns", "web", "uid-1")
	e.create(object("ns", "cp", "web"))
	e.waitReason(t, "ns", "cp", cpv1.ReasonInProgress)
	e.api.outage(100*time.Millisecond, func() { close(e.ck.release) })
	e.waitReason(t, "ns", "cp", cpv1.ReasonCompleted)
}

// A copy of an object a watch delivers after its checkpoint ended here (still
// in progress) is neither failed as an earlier shim's leftover nor started
// again: the outcome and the data stay.
func TestLateCopyAfterCompletion(t *testing.T) {
	e := newEnv(t)
	e.ck.release = make(chan struct{})
	e.run(t)
	e.pod("ns", "web", "uid-1")
	e.create(object("ns", "cp", "web"))
	stale := e.waitReason(t, "ns", "cp", cpv1.ReasonInProgress)
	close(e.ck.release)
	done := e.waitReason(t, "ns", "cp", cpv1.ReasonCompleted)
	eventually(t, "the checkpoint never ended here", func() bool {
		e.r.mu.Lock()
		defer e.r.mu.Unlock()
		_, busy := e.r.byPod[key("ns", "web")]
		return !busy
	})
	e.r.Observe(stale)
	// One worker takes the queue in order: once an object queued after
	// the late copy is done, the copy has been looked at.
	e.create(object("ns", "after", "web"))
	e.waitReason(t, "ns", "after", cpv1.ReasonCompleted)
	pc, _ := e.api.Get(context.Background(), "ns", "cp")
	if c := ready(pc); c.Reason != cpv1.ReasonCompleted || e.ck.count() != 2 {
		t.Errorf("after a late copy: %s, %d checkpoints (want 2: cp's and the next object's)", c.Reason, e.ck.count())
	}
	if _, err := os.Stat(filepath.Join(e.root, DataDir(done), "manifest.json")); err != nil {
		t.Errorf("data: %v", err)
	}
}

// The write that marks an object CheckpointInProgress fails (the API server
// refuses it with 429, or applies it and its answer is lost): the object is
// taken up again and completed, once, not left Pending for good nor failed
// as an earlier shim's leftover.
func TestInProgressWriteFails(t *testing.T) {
	for _, applied := range []bool{false, true} {
		t.Run(fmt.Sprintf("applied=%v", applied), func(t *testing.T) {
			e := newEnv(t)
			var once sync.Once
			e.api.statusFault = func(reason string) (bool, error) {
				var err error
				if reason == cpv1.ReasonInProgress {
					once.Do(func() { err = apierrors.NewTooManyRequests("storm", 1) })
				}
				return applied, err
			}
			e.run(t)
			e.pod("ns", "web", "uid-1")
			e.create(object("ns", "cp", "web"))
			e.waitReason(t, "ns", "cp", cpv1.ReasonCompleted)
			if n := e.ck.count(); n != 1 {
				t.Errorf("%d checkpoints, want 1", n)
			}
			if h := e.api.reasons(); slices.Contains(h, cpv1.ReasonFailed) {
				t.Errorf("reasons written %v: failed as a leftover", h)
			}
		})
	}
}

// An object deleted and created again under its name while its checkpoint
// runs: the outcome cannot be written to it, so the checkpoint's data goes,
// and its write is not retried for ever.
func TestObjectReplacedMidCheckpoint(t *testing.T) {
	e := newEnv(t)
	e.ck.release = make(chan struct{})
	e.run(t)
	e.pod("ns", "web", "uid-1")
	e.create(object("ns", "cp", "web"))
	old := e.waitReason(t, "ns", "cp", cpv1.ReasonInProgress)
	e.api.put(&cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cp", UID: "obj-cp-2", Generation: 1},
		Spec: cpv1.PodCheckpointSpec{SourcePodName: "other"}})
	close(e.ck.release)
	dir := filepath.Join(e.root, DataDir(old))
	eventually(t, dir+" of the replaced object is still there", func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err)
	})
}

// An object whose pod has a container not running waits with the queue's
// backoff (its requeues counted), not a fixed poll, and stays Pending.
func TestWaitForContainersBacksOff(t *testing.T) {
	e := newEnv(t)
	p := e.pod("ns", "web", "uid-1")
	for _, c := range e.rt.containers {
		if c.Metadata.Name == p.Spec.Containers[1].Name {
			c.State = runtimeapi.ContainerState_CONTAINER_EXITED
		}
	}
	e.run(t)
	e.create(object("ns", "cp", "web"))
	k := key("ns", "cp")
	deadline := time.Now().Add(5 * time.Second)
	for e.r.queue.NumRequeues(k) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("requeues %d: the wait for the container is not backed off", e.r.queue.NumRequeues(k))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := e.api.reasons(); slices.Contains(got, cpv1.ReasonInProgress) {
		t.Fatalf("checkpoint started with a container not running: %v", got)
	}
}

// The router routes an object once its pod is bound, which is before the
// pod's sandbox is ready: such an object is looked at again with backoff
// (not only at the informer's next resync), and nothing is written for it
// meanwhile. An object of a pod the node's informer does not hold is not.
func TestBoundPodWithoutSandboxIsRequeued(t *testing.T) {
	e := newEnv(t)
	e.pods[key("ns", "starting")] = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "starting", UID: "uid-2"},
		Spec: corev1.PodSpec{NodeName: "node-a"}}
	e.run(t)
	e.create(object("ns", "early", "starting"))
	e.create(object("ns", "elsewhere", "not-here"))
	deadline := time.Now().Add(5 * time.Second)
	for e.r.queue.NumRequeues(key("ns", "early")) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("requeues %d: an object of a bound pod without a sandbox is not looked at again", e.r.queue.NumRequeues(key("ns", "early")))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := e.r.queue.NumRequeues(key("ns", "elsewhere")); n != 0 {
		t.Errorf("an object of a pod not on this node was requeued %d times", n)
	}
	if got := e.api.reasons(); len(got) != 0 {
		t.Errorf("wrote %v before the pod had a sandbox", got)
	}
}

// A copy one watch delivers late does not replace the newer one a write
// (or the other watch) gave: its write would be a Conflict and a GET.
func TestObserveKeepsTheNewerCopy(t *testing.T) {
	e := newEnv(t)
	pc := object("ns", "cp", "web")
	pc.UID, pc.ResourceVersion = "u1", "10"
	e.r.Observe(pc.DeepCopy())
	old := pc.DeepCopy()
	old.ResourceVersion = "9"
	e.r.Observe(old)
	if got := e.r.get(key("ns", "cp")); got.ResourceVersion != "10" {
		t.Errorf("kept version %s, want 10", got.ResourceVersion)
	}
	later := pc.DeepCopy()
	later.ResourceVersion = "11"
	e.r.Observe(later)
	if got := e.r.get(key("ns", "cp")); got.ResourceVersion != "11" {
		t.Errorf("kept version %s, want 11", got.ResourceVersion)
	}
	other := pc.DeepCopy()
	other.UID, other.ResourceVersion = "u2", "5" // the name's new object
	e.r.Observe(other)
	if got := e.r.get(key("ns", "cp")); got.UID != "u2" {
		t.Errorf("kept UID %s, want the new object's", got.UID)
	}
}
