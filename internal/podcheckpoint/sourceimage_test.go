package podcheckpoint

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/ociartifact"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

var srcRef = "127.0.0.1:5000/cp/web@sha256:" + strings.Repeat("a", 64)

// fakeSources answers checks with err (nil: info), after release is
// closed when it is set.
type fakeSources struct {
	mu      sync.Mutex
	calls   []string
	at      []time.Time
	err     error
	release chan struct{}
}

func (f *fakeSources) CheckSource(ctx context.Context, ns, pod, uid, ref string) (ociartifact.SourceInfo, error) {
	f.mu.Lock()
	f.calls = append(f.calls, ns+" "+pod+" "+uid+" "+ref)
	f.at = append(f.at, time.Now())
	err, release := f.err, f.release
	f.mu.Unlock()
	if release != nil {
		<-release
	}
	if err != nil {
		return ociartifact.SourceInfo{}, err
	}
	return ociartifact.SourceInfo{Digest: "sha256:" + strings.Repeat("a", 64), PodNamespace: "ns", PodName: "web", PodUID: "uid-1",
		CheckpointedAt: time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC), Containers: []string{"main", "side"}}, nil
}

func (f *fakeSources) set(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

func (f *fakeSources) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// sourceEnv is a reconciler with a source checker and the restore resolver
// wired to it as Run wires them; pods restoring are in the pod cache.
func sourceEnv(t *testing.T, src SourceChecker) (*env, *Restores, *fakeEvents) {
	old, oldRetry := sourceMinGap, sourceRetry
	sourceMinGap, sourceRetry = 50*time.Millisecond, 200*time.Millisecond
	t.Cleanup(func() { sourceMinGap, sourceRetry = old, oldRetry })
	e := newEnv(t)
	e.r.cfg.Sources = src
	podEvents := &fakeEvents{}
	rs := NewRestores("node-a", 0, podEvents.sink)
	rs.connect(&restoreView{object: e.r.Lookup, pod: func(string, string) *corev1.Pod { return nil }, get: e.api.Get, source: e.r.SourceRestore})
	e.run(t)
	return e, rs, podEvents
}

// imageObject is an object with spec.sourceImage the router routed to
// node-a (sourceEnv's node).
func imageObject(ns, name string) *cpv1.PodCheckpoint {
	return &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Generation: 1, UID: types.UID("obj-" + name),
		Labels: map[string]string{cpv1.NodeLabel: "node-a"}},
		Spec: cpv1.PodCheckpointSpec{SourceImage: srcRef}}
}

// sourceIdle waits until the reconciler has taken every source request of
// ns/name and no check runs: a check those requests would make has been
// made.
func (e *env) sourceIdle(t *testing.T, ns, name string) {
	t.Helper()
	waitFor(t, "the source requests of "+ns+"/"+name+" taken, no check running", func() bool {
		e.r.mu.Lock()
		defer e.r.mu.Unlock()
		if _, ok := e.r.srcReq[key(ns, name)]; ok {
			return false
		}
		for _, st := range e.r.srcState {
			if st.checking {
				return false
			}
		}
		return true
	})
}

// resolveUntil calls Resolve as the kubelet's retries do until it answers.
func resolveUntil(t *testing.T, rs *Restores, ns, pod, uid, name string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := rs.Resolve(t.Context(), ns, pod, uid, name)
		if err == nil {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("Resolve(%s): %v", name, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The first restore from an object with spec.sourceImage makes its node
// check the reference for the restoring pod and then, in one status write,
// hold it and record the index's annotations and the restore; the kubelet's retries of the
// same pod check nothing again, a new pod does (lastRestore follows it),
// and a registry that lost the image turns Ready False with its reason.
func TestSourceImageStatusOnRestore(t *testing.T) {
	src := &fakeSources{}
	e, rs, _ := sourceEnv(t, src)
	e.api.put(imageObject("ns", "img")) // in no watch of the node

	if got := resolveUntil(t, rs, "ns", "restored", "u2", "img"); got != srcRef {
		t.Fatalf("Resolve answered %q", got)
	}
	pc := e.waitReason(t, "ns", "img", cpv1.ReasonSourceImageResolved)
	if got, want := e.api.reasons(), []string{cpv1.ReasonSourceImageResolved}; !slices.Equal(got, want) {
		t.Errorf("reasons written %v, want %v", got, want)
	}
	s := pc.Status
	c := ready(pc)
	if s.NodeName != "node-a" || c.Status != metav1.ConditionTrue || c.ObservedGeneration != 1 ||
		c.Message != srcRef+" is a checkpoint of pod ns/web (containers main, side); resolved for pod ns/restored on node node-a" {
		t.Errorf("node %q, Ready %+v", s.NodeName, c)
	}
	si := s.SourceImage
	if si == nil || si.Digest != "sha256:"+strings.Repeat("a", 64) || si.PodNamespace != "ns" || si.PodName != "web" || si.PodUID != "uid-1" ||
		si.CheckpointedAt == nil || !si.CheckpointedAt.Equal(&metav1.Time{Time: time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)}) ||
		!slices.Equal(si.Containers, []string{"main", "side"}) || si.ResolvedTime.IsZero() {
		t.Errorf("status.sourceImage %+v", si)
	}
	if lr := s.LastRestore; lr == nil || lr.PodName != "restored" || lr.PodUID != "u2" || lr.NodeName != "node-a" || lr.Time.IsZero() {
		t.Errorf("status.lastRestore %+v", lr)
	}
	if want := "ns restored u2 " + srcRef; src.count() != 1 || src.calls[0] != want {
		t.Errorf("checks %v, want [%s]", src.calls, want)
	}
	if s.CheckpointLocation != nil || s.SourcePodUID != nil || slices.Contains(pc.Finalizers, cpv1.NodeDataFinalizer) {
		t.Errorf("a registry's object got node data: %+v, finalizers %v", s, pc.Finalizers)
	}

	// The kubelet's retries of the same pod: answered, not checked again.
	for range 5 {
		resolveUntil(t, rs, "ns", "restored", "u2", "img")
	}
	e.sourceIdle(t, "ns", "img")
	if n := src.count(); n != 1 {
		t.Errorf("%d checks after the same pod's retries, want 1", n)
	}

	// Another pod: checked again, lastRestore is that pod.
	resolveUntil(t, rs, "ns", "second", "u3", "img")
	waitFor(t, "lastRestore of the second pod", func() bool {
		pc, _ := e.api.Get(context.Background(), "ns", "img")
		return pc.Status.LastRestore != nil && pc.Status.LastRestore.PodName == "second"
	})
	if n := src.count(); n != 2 {
		t.Errorf("%d checks, want 2", n)
	}

	// The registry lost it: Ready False with the reason; what was resolved
	// before stays, dated.
	src.set(fmt.Errorf("%w: %s: the registry has no such manifest", errdefs.ErrNotFound, srcRef))
	resolveUntil(t, rs, "ns", "third", "u4", "img")
	pc = e.waitReason(t, "ns", "img", cpv1.ReasonSourceImageNotFound)
	if c := ready(pc); c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "no such manifest") ||
		pc.Status.SourceImage == nil || pc.Status.LastRestore.PodName != "third" {
		t.Errorf("after the loss: Ready %+v, status %+v", c, pc.Status)
	}
	e.waitEvents(t, "PodCheckpoint/img Warning SourceImageNotFound")
}

// A failed check is tried again for the same pod only after sourceRetry.
func TestSourceImageFailedCheckRetried(t *testing.T) {
	src := &fakeSources{err: fmt.Errorf("%w: registry says 503", errdefs.ErrUnavailable)}
	e, rs, _ := sourceEnv(t, src)
	e.api.put(imageObject("ns", "img"))
	resolveUntil(t, rs, "ns", "restored", "u2", "img")
	e.waitReason(t, "ns", "img", cpv1.ReasonSourceImageUnreachable)
	resolveUntil(t, rs, "ns", "restored", "u2", "img") // a retry at once
	e.sourceIdle(t, "ns", "img")
	if n := src.count(); n != 1 {
		t.Errorf("%d checks right after a failure, want 1", n)
	}
	src.set(nil)
	// The kubelet goes on retrying: the check is made again, once
	// sourceRetry has passed since the failed one.
	waitFor(t, "a retry resolving img", func() bool {
		resolveUntil(t, rs, "ns", "restored", "u2", "img")
		pc, err := e.api.Get(context.Background(), "ns", "img")
		return err == nil && ready(pc) != nil && ready(pc).Reason == cpv1.ReasonSourceImageResolved
	})
	src.mu.Lock()
	at := slices.Clone(src.at)
	src.mu.Unlock()
	if len(at) != 2 || at[1].Sub(at[0]) < sourceRetry {
		t.Errorf("checks at %v, want two, sourceRetry (%s) apart at least", at, sourceRetry)
	}
}

// An object another node holds is that node's to write: a restore here
// resolves it and neither checks nor writes; nor does a node that loses
// the race to hold it write (it checked with a copy read before the other
// node held it; its write conflicts, and the object it reads again names
// the other node).
func TestSourceImageHeldElsewhere(t *testing.T) {
	src := &fakeSources{}
	e, rs, _ := sourceEnv(t, src)
	theirs := imageObject("ns", "theirs")
	theirs.Status.NodeName = "node-b"
	e.api.put(theirs)
	if got := resolveUntil(t, rs, "ns", "restored", "u2", "theirs"); got != srcRef {
		t.Fatalf("Resolve answered %q", got)
	}

	// The race: this node read the object unheld, node-b held it since.
	e.api.put(imageObject("ns", "raced"))
	readInBackground(t, rs, "ns", "raced")
	held, _ := e.api.Get(context.Background(), "ns", "raced")
	held.Labels[cpv1.NodeLabel] = "node-b" // the router moved it, and node-b held it
	held.Status.NodeName = "node-b"
	e.api.put(held)
	resolveUntil(t, rs, "ns", "restored", "u3", "raced")
	e.sourceIdle(t, "ns", "raced")
	pc, _ := e.api.Get(context.Background(), "ns", "raced")
	if pc.Status.NodeName != "node-b" || len(e.api.reasons()) != 0 {
		t.Errorf("node-b's objects written: %+v, reasons %v", pc.Status, e.api.reasons())
	}
	if n := src.count(); n != 1 || !strings.Contains(src.calls[0], "u3") {
		t.Errorf("checks %v, want only the raced one's (read unheld)", src.calls)
	}
}

// An object deleted and created again under its name after this node read
// it: the outcome of the old one (checked from the copy read) is dropped,
// not retried, and nothing written; the next read finds the new one.
func TestSourceImageReplacedObject(t *testing.T) {
	src := &fakeSources{}
	e, rs, _ := sourceEnv(t, src)
	e.api.put(imageObject("ns", "img"))
	readInBackground(t, rs, "ns", "img")
	again := imageObject("ns", "img")
	again.UID = "obj-img-2"
	e.api.put(again)
	resolveUntil(t, rs, "ns", "restored", "u2", "img")
	e.sourceIdle(t, "ns", "img")
	if r, n := e.api.reasons(), src.count(); len(r) != 0 || n > 1 {
		t.Errorf("the replaced object's outcome: reasons written %v, %d checks", r, n)
	}
	e.r.mu.Lock()
	left := len(e.r.srcReq)
	e.r.mu.Unlock()
	if left != 0 {
		t.Errorf("%d requests left queued", left)
	}
}

// The outcome (with the claim) written while the API server is down is
// written once it answers again.
func TestSourceImageStatusAfterAPIOutage(t *testing.T) {
	src := &fakeSources{release: make(chan struct{})}
	e, rs, _ := sourceEnv(t, src)
	e.api.put(imageObject("ns", "img"))
	resolveUntil(t, rs, "ns", "restored", "u2", "img")
	waitFor(t, "the check", func() bool { return src.count() == 1 })
	e.api.outage(100*time.Millisecond, func() { close(src.release) })
	pc := e.waitReason(t, "ns", "img", cpv1.ReasonSourceImageResolved)
	if pc.Status.NodeName != "node-a" {
		t.Errorf("held by %q", pc.Status.NodeName)
	}
}

// Nothing is written before the registry answers: a shim killed during a
// check (here: a check that never answers) leaves no claim that no outcome
// follows. Another node may then check and hold the object; this node's
// late outcome conflicts, finds it held, and is dropped.
func TestSourceImageNoClaimBeforeOutcome(t *testing.T) {
	src := &fakeSources{release: make(chan struct{})}
	e, rs, _ := sourceEnv(t, src)
	release := sync.OnceFunc(func() { close(src.release) })
	t.Cleanup(release) // before the reconciler's stop, which waits for the check
	e.api.put(imageObject("ns", "img"))
	resolveUntil(t, rs, "ns", "restored", "u2", "img")
	// The check has been called: a claim written before it would be there.
	waitFor(t, "the check", func() bool { return src.count() == 1 })
	pc, err := e.api.Get(context.Background(), "ns", "img")
	if err != nil {
		t.Fatal(err)
	}
	if pc.Status.NodeName != "" || ready(pc) != nil || len(e.api.reasons()) != 0 {
		t.Fatalf("written while the check runs (a kill now would leave it): %+v, reasons %v", pc.Status, e.api.reasons())
	}

	pc.Status.NodeName = "node-b"
	setReady(&pc.Status, metav1.ConditionTrue, cpv1.ReasonSourceImageResolved, "node-b's outcome", 1, time.Now())
	e.api.put(pc)
	release()
	e.sourceIdle(t, "ns", "img")
	got, _ := e.api.Get(context.Background(), "ns", "img")
	if c := ready(got); got.Status.NodeName != "node-b" || c == nil || c.Message != "node-b's outcome" || len(e.api.reasons()) != 0 {
		t.Errorf("node-b's outcome overwritten: %+v, reasons %v", got.Status, e.api.reasons())
	}
	e.r.mu.Lock()
	checking := e.r.srcState[pc.UID] != nil && e.r.srcState[pc.UID].checking
	e.r.mu.Unlock()
	if checking {
		t.Error("the check never ended")
	}
}

// Only the node an object is routed to checks it (the ticket the admission
// policy asks for): a restore of an object not routed yet checks nothing
// until the routed watch brings the object here; one routed to another
// node is never checked here.
func TestSourceImageCheckedOnlyWhereRouted(t *testing.T) {
	src := &fakeSources{}
	e, rs, _ := sourceEnv(t, src)
	unrouted := imageObject("ns", "new")
	delete(unrouted.Labels, cpv1.NodeLabel)
	e.api.put(unrouted)
	elsewhere := imageObject("ns", "theirs")
	elsewhere.Labels[cpv1.NodeLabel] = "node-b"
	e.api.put(elsewhere)
	for _, name := range []string{"new", "theirs"} {
		if got := resolveUntil(t, rs, "ns", "restored", "u2", name); got != srcRef {
			t.Fatalf("Resolve(%s) answered %q", name, got)
		}
	}
	time.Sleep(3 * sourceMinGap)
	if n, r := src.count(), e.api.reasons(); n != 0 || len(r) != 0 {
		t.Fatalf("objects not routed here: %d checks, reasons written %v", n, r)
	}
	// The router routes "new" here; the routed watch delivers it.
	routed, _ := e.api.Get(context.Background(), "ns", "new")
	routed.Labels = map[string]string{cpv1.NodeLabel: "node-a"}
	e.api.put(routed)
	got, _ := e.api.Get(context.Background(), "ns", "new")
	e.r.Observe(got)
	pc := e.waitReason(t, "ns", "new", cpv1.ReasonSourceImageResolved)
	if pc.Status.NodeName != "node-a" || src.count() != 1 || !strings.Contains(src.calls[0], "restored u2") {
		t.Errorf("after routing: held by %q, checks %v", pc.Status.NodeName, src.calls)
	}
	if th, _ := e.api.Get(context.Background(), "ns", "theirs"); th.Status.NodeName != "" || ready(th) != nil {
		t.Errorf("node-b's object written: %+v", th.Status)
	}
}

// A node without registries holds the object with the allow-list's refusal.
func TestSourceImageWithoutRegistries(t *testing.T) {
	e, rs, _ := sourceEnv(t, nil)
	e.r.cfg.Sources = nil
	e.api.put(imageObject("ns", "img"))
	resolveUntil(t, rs, "ns", "restored", "u2", "img")
	pc := e.waitReason(t, "ns", "img", cpv1.ReasonRegistryNotAllowed)
	if c := ready(pc); !strings.Contains(c.Message, "this node restores from and exports to no registry") {
		t.Errorf("Ready %+v", c)
	}
}

// Each class of CheckSource's errors has its reason.
func TestSourceReasons(t *testing.T) {
	for _, tc := range []struct {
		err    error
		reason string
	}{
		{nil, cpv1.ReasonSourceImageResolved},
		{fmt.Errorf("%w: x", layout.ErrForeignCheckpoint), cpv1.ReasonNamespaceNotAllowed},
		{fmt.Errorf("%w: x", errdefs.ErrInvalidArgument), cpv1.ReasonSourceImageInvalid},
		{fmt.Errorf("%w: x", errdefs.ErrPermissionDenied), cpv1.ReasonRegistryNotAllowed},
		{fmt.Errorf("%w: x", errdefs.ErrNotFound), cpv1.ReasonSourceImageNotFound},
		{fmt.Errorf("%w: x", errdefs.ErrUnauthenticated), cpv1.ReasonSourceImageNotFound},
		{fmt.Errorf("%w: x", errdefs.ErrFailedPrecondition), cpv1.ReasonNotAPodCheckpoint},
		{fmt.Errorf("%w: x", errdefs.ErrUnavailable), cpv1.ReasonSourceImageUnreachable},
		{errors.New("anything else"), cpv1.ReasonSourceImageUnreachable},
	} {
		if got := sourceReason(tc.err); got != tc.reason {
			t.Errorf("%v: %s, want %s", tc.err, got, tc.reason)
		}
	}
}

// readInBackground has rs read ns/name as a first restore from it does,
// and waits for the answer.
func readInBackground(t *testing.T, rs *Restores, ns, name string) {
	t.Helper()
	// The read alone (fetch, not Resolve): a Resolve that the read beats
	// would also hand the object to the reconciler as restored by u0.
	_, _ = rs.fetch(t.Context(), rs.view.Load(), ns, name)
	waitFor(t, "the background read", func() bool {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		return rs.fetched[key(ns, name)].pc != nil
	})
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
	}
}
