package kubeapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/kubeapi/kubeapitest"
)

var podA = PodRef{Namespace: "ns", Name: "a", UID: "uid-a"}

func kubeletPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: podA.Namespace, Name: podA.Name, UID: "uid-a"},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue},
		}},
	}
}

func startWriter(t *testing.T, w *Writer) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func fastOptions() WriterOptions {
	return WriterOptions{MinDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}
}

func eventually(t *testing.T, what string, ok func() error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := ok()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func conditions(t *testing.T, cs *fake.Clientset) map[corev1.PodConditionType]corev1.PodCondition {
	p, err := cs.CoreV1().Pods(podA.Namespace).Get(context.Background(), podA.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := map[corev1.PodConditionType]corev1.PodCondition{}
	for _, c := range p.Status.Conditions {
		m[c.Type] = c
	}
	return m
}

func counter(t *testing.T, v *prometheus.CounterVec, labels ...string) float64 {
	var m dto.Metric
	if err := v.WithLabelValues(labels...).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// The shim's conditions are merged by type into the pod's status; the
// kubelet's conditions stay as they are.
func TestSetPodConditionMergesIntoStatus(t *testing.T) {
	cs := fake.NewClientset(kubeletPod())
	w := NewWriter(NewFor(kubeapitest.Clientset{Interface: cs}, "node-1"), fastOptions())
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	w.SetPodCondition(podA, Condition{Type: "example.com/held", Status: corev1.ConditionFalse, Reason: "Hold", Message: "main exited 1", At: at})
	w.SetPodCondition(podA, Condition{Type: corev1.AllContainersRestarting, Status: corev1.ConditionTrue, Reason: "R", At: at})
	startWriter(t, w)
	eventually(t, "both conditions written", func() error {
		c := conditions(t, cs)
		if len(c) != 4 {
			return fmt.Errorf("conditions %v", c)
		}
		return nil
	})
	c := conditions(t, cs)
	if c[corev1.PodReady].Status != corev1.ConditionTrue || c[corev1.ContainersReady].Status != corev1.ConditionTrue {
		t.Fatalf("kubelet's conditions changed: %v", c)
	}
	h := c["example.com/held"]
	if h.Status != corev1.ConditionFalse || h.Reason != "Hold" || h.Message != "main exited 1" || !h.LastTransitionTime.Time.Equal(at) {
		t.Fatalf("held condition %+v", h)
	}
	eventually(t, "one write counted", func() error {
		if got := counter(t, w.writes, "status", "ok"); got != 1 {
			return fmt.Errorf("%v status writes, want 1 (the two conditions coalesce)", got)
		}
		return nil
	})
}

// Enqueueing never waits: with the API server down and the queue full, a
// thousand writes return at once and the oldest are dropped and counted.
func TestEnqueueNeverBlocks(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	o := fastOptions()
	o.MaxQueue = 10
	c := NewFor(kubeapitest.Clientset{Interface: fake.NewClientset()}, "node-1")
	c.probe = func(ctx context.Context) error {
		select { // a server that does not answer
		case <-block:
		case <-ctx.Done():
		}
		return errors.New("no answer")
	}
	w := NewWriter(c, o)
	startWriter(t, w)
	start := time.Now()
	for i := range 1000 {
		w.SetPodCondition(PodRef{Namespace: "ns", Name: "p", UID: fmt.Sprint(i)}, Condition{Type: "X", Status: corev1.ConditionTrue})
		w.Event(Event{Regarding: PodObject(podA), Type: corev1.EventTypeNormal, Reason: "R", Action: "A", Note: "n"})
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("2000 enqueues took %s", d)
	}
	if n := w.q.len(); n != 10 {
		t.Fatalf("%d pending, want the bound 10", n)
	}
	if d := counter(t, w.dropped, "status", "queue_full") + counter(t, w.dropped, "event", "queue_full"); d != 1990 {
		t.Fatalf("%v dropped, want 1990", d)
	}
}

// Writes wait while the API server is down and go out once it answers;
// a write that fails on the way is retried.
func TestWritesWaitForTheAPIServer(t *testing.T) {
	cs := fake.NewClientset(kubeletPod())
	var down atomic.Bool
	down.Store(true)
	var probes atomic.Int32
	o := fastOptions()
	c := NewFor(kubeapitest.Clientset{Interface: cs}, "node-1")
	c.probe = func(context.Context) error {
		probes.Add(1)
		if down.Load() {
			return errors.New("connection refused")
		}
		return nil
	}
	var patchFailures atomic.Int32
	cs.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if patchFailures.Add(1) <= 2 {
			return true, nil, errors.New("connection reset by peer")
		}
		return false, nil, nil
	})
	w := NewWriter(c, o)
	startWriter(t, w)
	w.SetPodCondition(podA, Condition{Type: "X", Status: corev1.ConditionTrue})
	eventually(t, "probing", func() error {
		if probes.Load() < 3 {
			return errors.New("not probed yet")
		}
		return nil
	})
	if _, ok := conditions(t, cs)["X"]; ok || patchFailures.Load() != 0 {
		t.Fatal("written while the API server was down")
	}
	down.Store(false)
	eventually(t, "condition written", func() error {
		if _, ok := conditions(t, cs)["X"]; !ok {
			return errors.New("not yet")
		}
		return nil
	})
	eventually(t, "two retries counted and the writer up", func() error {
		if r := counter(t, w.writes, "status", "retry"); r != 2 || !w.up.Load() {
			return fmt.Errorf("%v retries (want 2), up %v", r, w.up.Load())
		}
		return nil
	})
}

// A refusal (the pod is gone) is not retried.
func TestRefusedWriteIsDropped(t *testing.T) {
	cs := fake.NewClientset()
	w := NewWriter(NewFor(kubeapitest.Clientset{Interface: cs}, "node-1"), fastOptions())
	startWriter(t, w)
	w.SetPodCondition(podA, Condition{Type: "X", Status: corev1.ConditionTrue})
	eventually(t, "dropped", func() error {
		if counter(t, w.dropped, "status", "failed") != 1 {
			return errors.New("not yet")
		}
		return nil
	})
	if r := counter(t, w.writes, "status", "retry"); r != 0 {
		t.Fatalf("%v retries of a NotFound", r)
	}
}

func TestRetryable(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{errors.New("dial tcp: connection refused"), true},
		{context.DeadlineExceeded, true},
		{apierrors.NewTooManyRequests("slow down", 1), true},
		{apierrors.NewServiceUnavailable("starting"), true},
		{apierrors.NewInternalError(errors.New("etcd")), true},
		{fmt.Errorf("wrapped: %w", apierrors.NewNotFound(gr, "a")), false},
		{apierrors.NewForbidden(gr, "a", errors.New("node")), false},
		{apierrors.NewConflict(gr, "a", errors.New("uid")), false},
		{apierrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "a", nil), false},
	} {
		if got := Retryable(tc.err); got != tc.want {
			t.Errorf("Retryable(%v) = %v", tc.err, got)
		}
	}
}

// Events go through client-go's recorder: repeats of one event become one
// events.k8s.io Event with a series.
func TestEventsAreRecordedAndAggregated(t *testing.T) {
	cs := fake.NewClientset()
	w := NewWriter(NewFor(kubeapitest.Clientset{Interface: cs}, "node-1"), fastOptions())
	startWriter(t, w)
	e := Event{Regarding: PodObject(podA), Type: corev1.EventTypeWarning, Reason: "BackOff", Action: "Hold", Note: "held 2s"}
	w.Event(e)
	eventually(t, "first event", func() error {
		l, err := cs.EventsV1().Events(podA.Namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil || len(l.Items) != 1 {
			return fmt.Errorf("%v events, %v", len(l.Items), err)
		}
		ev := l.Items[0]
		if ev.Reason != "BackOff" || ev.Action != "Hold" || ev.Note != "held 2s" || ev.Regarding.UID != "uid-a" ||
			ev.ReportingController != ReportingController || ev.Type != corev1.EventTypeWarning {
			return fmt.Errorf("event %+v", ev)
		}
		return nil
	})
	w.Event(e)
	eventually(t, "a series of 2", func() error {
		l, err := cs.EventsV1().Events(podA.Namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil || len(l.Items) != 1 {
			return fmt.Errorf("%v events, %v", len(l.Items), err)
		}
		if s := l.Items[0].Series; s == nil || s.Count != 2 {
			return fmt.Errorf("series %+v", s)
		}
		return nil
	})
}

func TestNilWriterDropsEverything(t *testing.T) {
	var w *Writer
	w.SetPodCondition(podA, Condition{Type: "X"})
	w.Event(Event{})
	if w != nil && w.up.Load() {
		t.Fatal("a nil writer is not up")
	}
}

func TestConditionsPatchCarriesUIDAndBoundsMessage(t *testing.T) {
	long := make([]byte, 3000)
	for i := range long {
		long[i] = 'x'
	}
	b, err := conditionsPatch(podA, map[string]Condition{"X": {Type: "X", Status: corev1.ConditionTrue, Message: string(long)}})
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if want := `"metadata":{"uid":"uid-a"}`; !strings.Contains(s, want) {
		t.Fatalf("patch %s lacks %s", s, want)
	}
	if len(s) > 1400 {
		t.Fatalf("message not bounded: %d bytes", len(s))
	}
	if got := truncate("aé", 2); got != "a" {
		t.Fatalf("truncate cut a rune: %q", got)
	}
}

// A kubeconfig that is missing at start (the kubelet writes it after TLS
// bootstrapping) is waited for: writes queue, the shim does not fail.
func TestConnectWaitsForTheKubeconfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubelet.conf")
	c, err := New(config.KubernetesConfig{Kubeconfig: path, NodeName: "node-1", QPS: 5, Burst: 10}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	w := NewWriter(c, fastOptions())
	w.SetPodCondition(podA, Condition{Type: "X", Status: corev1.ConditionTrue})
	if c.Resources() != nil || c.REST() != nil || c.Probe(context.Background()) == nil {
		t.Fatal("client ready without a kubeconfig")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Connect(ctx); close(done) }()
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:1\"}\n" +
		"users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n"
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Ready():
	case <-time.After(2 * loadRetry):
		t.Fatal("kubeconfig written but client not ready")
	}
	cancel()
	<-done
	if rc := c.REST(); rc == nil || rc.QPS != 5 || rc.Burst != 10 || rc.Host != "https://127.0.0.1:1" || rc.Timeout != requestTimeout {
		t.Fatalf("rest config %+v", rc)
	}
	if w.q.len() != 1 {
		t.Fatalf("the queued write is gone before the API was reachable")
	}
}

// A condition written again without a reason or message loses the old ones.
func TestEmptyReasonClearsTheOldOne(t *testing.T) {
	cs := fake.NewClientset(kubeletPod())
	w := NewWriter(NewFor(kubeapitest.Clientset{Interface: cs}, "node-1"), fastOptions())
	startWriter(t, w)
	w.SetPodCondition(podA, Condition{Type: "X", Status: corev1.ConditionFalse, Reason: "Hold", Message: "held"})
	eventually(t, "first write", func() error {
		if c := conditions(t, cs)["X"]; c.Reason != "Hold" {
			return fmt.Errorf("X %+v", c)
		}
		return nil
	})
	w.SetPodCondition(podA, Condition{Type: "X", Status: corev1.ConditionTrue})
	eventually(t, "second write", func() error {
		if c := conditions(t, cs)["X"]; c.Status != corev1.ConditionTrue || c.Reason != "" || c.Message != "" {
			return fmt.Errorf("X %+v", c)
		}
		return nil
	})
}

// uidPrecondition makes the fake clientset refuse a status patch whose
// metadata.uid is not the stored pod's, as the API server does (the UID is
// immutable: 422 Invalid from rest.BeforeUpdate); the fake alone applies
// any patch. It counts the refusals.
func uidPrecondition(cs *fake.Clientset, refused *atomic.Int32) {
	cs.PrependReactor("patch", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pa := a.(k8stesting.PatchAction)
		var p struct {
			Metadata struct{ UID string } `json:"metadata"`
		}
		if err := json.Unmarshal(pa.GetPatch(), &p); err != nil {
			return true, nil, err
		}
		stored, err := cs.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), pa.GetNamespace(), pa.GetName())
		if err != nil {
			return true, nil, err
		}
		if uid := string(stored.(*corev1.Pod).UID); p.Metadata.UID != "" && p.Metadata.UID != uid {
			refused.Add(1)
			return true, nil, apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Pod").GroupKind(), pa.GetName(),
				field.ErrorList{field.Invalid(field.NewPath("metadata", "uid"), p.Metadata.UID, "field is immutable")})
		}
		return false, nil, nil
	})
}

// A static pod's sandbox carries its config hash as UID; its conditions
// land on its mirror pod, found once by the mirror annotation, and the
// next write goes to the mirror's UID at once. A pod of the same name that
// is not the static pod's mirror (another pod, or a mirror of another
// hash) is not written.
func TestStaticPodConditionsGoToItsMirrorPod(t *testing.T) {
	mirror := kubeletPod()
	mirror.UID = "mirror-uid"
	mirror.Annotations = map[string]string{mirrorAnnotation: "config-hash"}
	cs := fake.NewClientset(mirror)
	var refused atomic.Int32
	uidPrecondition(cs, &refused)
	w := NewWriter(NewFor(kubeapitest.Clientset{Interface: cs}, "node-1"), fastOptions())
	startWriter(t, w)
	static := PodRef{Namespace: podA.Namespace, Name: podA.Name, UID: "config-hash"}
	w.SetPodCondition(static, Condition{Type: "X", Status: corev1.ConditionTrue})
	eventually(t, "X on the mirror pod", func() error {
		if _, ok := conditions(t, cs)["X"]; !ok {
			return errors.New("not yet")
		}
		return nil
	})
	w.SetPodCondition(static, Condition{Type: "Y", Status: corev1.ConditionTrue})
	eventually(t, "Y on the mirror pod", func() error {
		if _, ok := conditions(t, cs)["Y"]; !ok {
			return errors.New("not yet")
		}
		return nil
	})
	if n := refused.Load(); n != 1 {
		t.Fatalf("%d patches refused, want 1 (the first, before the mirror was known)", n)
	}

	w.SetPodCondition(PodRef{Namespace: podA.Namespace, Name: podA.Name, UID: "other-hash"}, Condition{Type: "Z", Status: corev1.ConditionTrue})
	eventually(t, "the write for another hash dropped", func() error {
		if counter(t, w.dropped, "status", "failed") != 1 {
			return errors.New("not yet")
		}
		return nil
	})
	if _, ok := conditions(t, cs)["Z"]; ok {
		t.Fatal("a static pod's write landed on the mirror of another")
	}
}

// At stop, what the features queued before they stopped is still written
// while the API server answers; with the server down the writer stops at
// once.
func TestQueuedWritesAreMadeAtStop(t *testing.T) {
	pod := func(name string) *corev1.Pod {
		p := kubeletPod()
		p.Name, p.UID = name, types.UID("uid-"+name)
		return p
	}
	cs := fake.NewClientset(pod("a"), pod("b"), pod("c"))
	inHand, release := make(chan struct{}), make(chan struct{})
	var patches atomic.Int32
	cs.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if patches.Add(1) == 1 {
			close(inHand)
			<-release
		}
		return false, nil, nil
	})
	w := NewWriter(NewFor(kubeapitest.Clientset{Interface: cs}, "node-1"), fastOptions())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	for _, name := range []string{"a", "b", "c"} {
		w.SetPodCondition(PodRef{Namespace: "ns", Name: name, UID: "uid-" + name}, Condition{Type: "X", Status: corev1.ConditionTrue})
	}
	<-inHand
	cancel()
	close(release)
	select {
	case <-done:
	case <-time.After(drainTimeout + time.Second):
		t.Fatal("the writer did not stop within its drain time")
	}
	for _, name := range []string{"a", "b", "c"} {
		p, err := cs.CoreV1().Pods("ns").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Status.Conditions) != 3 {
			t.Errorf("pod %s: conditions %v, want X written at stop", name, p.Status.Conditions)
		}
	}

	// The server down: nothing is probed or written after the stop.
	down := NewFor(kubeapitest.Clientset{Interface: cs}, "node-1")
	probed := make(chan struct{}, 1)
	down.probe = func(context.Context) error {
		select {
		case probed <- struct{}{}:
		default:
		}
		return errors.New("connection refused")
	}
	w = NewWriter(down, fastOptions())
	ctx, cancel = context.WithCancel(context.Background())
	done = make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	w.SetPodCondition(podA, Condition{Type: "Y", Status: corev1.ConditionTrue})
	select { // the write is in hand, waiting for the server
	case <-probed:
	case <-time.After(5 * time.Second):
		t.Fatal("the writer never probed the server for the queued write")
	}
	start := time.Now()
	cancel()
	<-done
	if d := time.Since(start); d > drainTimeout/2 {
		t.Errorf("stopping with the server down took %s", d)
	}
}
