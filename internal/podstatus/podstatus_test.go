package podstatus

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
	"github.com/cri-shim/cri-shim/internal/kubeapi/kubeapitest"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/restartapi"
)

// fakeWriter keeps what the reporter queues: the newest condition per type
// (as the writer's coalescing does) and every event.
type fakeWriter struct {
	conds  map[corev1.PodConditionType]kubeapi.Condition
	events []kubeapi.Event
}

func (f *fakeWriter) SetPodCondition(_ kubeapi.PodRef, c kubeapi.Condition) { f.conds[c.Type] = c }
func (f *fakeWriter) Event(e kubeapi.Event)                                 { f.events = append(f.events, e) }

func (f *fakeWriter) reasons() string {
	var r []string
	for _, e := range f.events {
		r = append(r, e.Type+"/"+e.Reason)
	}
	return strings.Join(r, " ")
}

var (
	pod     = restartapi.PodRef{Namespace: "ns", Name: "web", UID: "uid-1"}
	exited  = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	trigger = restartapi.Trigger{Container: "main", ExitCode: 3, Action: string(podspec.ActionRestartAllContainers),
		Delay: 2 * time.Second, FinishedAt: exited}
)

func reporter(owner int32) (*Reporter, *fakeWriter) {
	w := &fakeWriter{conds: map[corev1.PodConditionType]kubeapi.Condition{}}
	o := &ownerCheck{log: slog.New(slog.DiscardHandler)}
	o.state.Store(owner)
	r := &Reporter{w: w, owner: o, log: slog.New(slog.DiscardHandler), now: func() time.Time { return exited.Add(3 * time.Second) }}
	o.known = r.ownerKnown
	return r, w
}

func TestRestartOfAllContainers(t *testing.T) {
	r, w := reporter(ownerShim)
	r.RestartStarted(pod, trigger)
	ready, restarting := w.conds[ReadyCondition], w.conds[corev1.AllContainersRestarting]
	if ready.Status != corev1.ConditionFalse || ready.Reason != "BackoffHold" || !strings.Contains(ready.Message, "2s backoff") {
		t.Fatalf("readiness gate during the hold: %+v", ready)
	}
	if restarting.Status != corev1.ConditionTrue || restarting.Reason != ReasonAllContainersRestarting ||
		!strings.Contains(restarting.Message, "container main exited with code 3") {
		t.Fatalf("AllContainersRestarting: %+v", restarting)
	}
	if got := w.reasons(); got != "Normal/RestartAllContainersInPlace Warning/BackOff" {
		t.Fatalf("events %s", got)
	}
	if n := w.events[1].Note; n != "Back-off 2s restarting failed container main (exit code 3)" {
		t.Fatalf("hold event note %q", n)
	}
	r.RestartEnded(pod, trigger, restartapi.Restarted)
	ready, restarting = w.conds[ReadyCondition], w.conds[corev1.AllContainersRestarting]
	if ready.Status != corev1.ConditionTrue || ready.Reason != "" || restarting.Status != corev1.ConditionFalse || restarting.Reason != "" {
		t.Fatalf("after the restart: ready %+v, restarting %+v", ready, restarting)
	}
	if e := w.events[2]; e.Reason != "RestartedInPlace" || e.Note != "containers running again after container main exited with code 3" {
		t.Fatalf("end event %+v", e)
	}
	// What tells occurrences apart is in the action, which the recorder's
	// series key holds (the note is not in it).
	for i, want := range []string{"Restart (main exited 3)", "Hold 2s (main exited 3)", "Restarted (main exited 3)"} {
		if w.events[i].Action != want {
			t.Errorf("event %d action %q, want %q", i, w.events[i].Action, want)
		}
	}
}

// A kubelet that owns AllContainersRestarting (its gate on) never gets it
// written; the readiness gate is written regardless.
func TestAllContainersRestartingNotWrittenWhenTheKubeletOwnsIt(t *testing.T) {
	r, w := reporter(ownerKubelet)
	r.RestartStarted(pod, trigger)
	r.RestartEnded(pod, trigger, restartapi.Restarted)
	if _, ok := w.conds[corev1.AllContainersRestarting]; ok {
		t.Fatal("AllContainersRestarting written")
	}
	if w.conds[ReadyCondition].Status != corev1.ConditionTrue {
		t.Fatalf("readiness gate %+v", w.conds[ReadyCondition])
	}
}

// While the owner is unknown (no answer from the API server yet) the newest
// AllContainersRestarting of each pod waits, and is written once the node
// shows the kubelet does not own it, or dropped if it does.
func TestAllContainersRestartingWaitsForTheOwner(t *testing.T) {
	for _, owner := range []int32{ownerShim, ownerKubelet} {
		r, w := reporter(ownerUnknown)
		r.RestartStarted(pod, trigger)
		if _, ok := w.conds[corev1.AllContainersRestarting]; ok {
			t.Fatal("written before the owner is known")
		}
		r.RestartEnded(pod, trigger, restartapi.Restarted)
		r.owner.state.Store(owner)
		r.ownerKnown(owner)
		c, ok := w.conds[corev1.AllContainersRestarting]
		if owner == ownerShim && (!ok || c.Status != corev1.ConditionFalse) {
			t.Fatalf("owner shim: the newest value (False) not written: %+v %v", c, ok)
		}
		if owner == ownerKubelet && ok {
			t.Fatal("owner kubelet: written")
		}
	}
}

// A Restart rule (one container) with no backoff: not Ready, no
// AllContainersRestarting, no hold event.
func TestRestartOfOneContainer(t *testing.T) {
	r, w := reporter(ownerShim)
	one := trigger
	one.Action, one.Delay = string(corev1.ContainerRestartRuleActionRestart), 0
	r.RestartStarted(pod, one)
	if c := w.conds[ReadyCondition]; c.Status != corev1.ConditionFalse || c.Reason != "RestartInProgress" {
		t.Fatalf("readiness gate %+v", c)
	}
	if _, ok := w.conds[corev1.AllContainersRestarting]; ok {
		t.Fatal("AllContainersRestarting written for a one-container restart")
	}
	if got := w.reasons(); got != "Normal/RestartContainerInPlace" {
		t.Fatalf("events %s", got)
	}
}

// A restart whose new container exits at once, or one given up because the
// pod stops, leaves the pod not Ready.
func TestRestartEndedWithoutReadiness(t *testing.T) {
	for _, out := range []restartapi.Outcome{restartapi.RestartedAgain, restartapi.Abandoned} {
		r, w := reporter(ownerShim)
		r.RestartStarted(pod, trigger)
		r.RestartEnded(pod, trigger, out)
		if c := w.conds[ReadyCondition]; c.Status != corev1.ConditionFalse {
			t.Fatalf("outcome %d: readiness gate %+v", out, c)
		}
	}
}

func TestSandboxOfAnnotatedPod(t *testing.T) {
	r, w := reporter(ownerShim)
	next := func(context.Context, *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
		return &runtimeapi.RunPodSandboxResponse{PodSandboxId: "sb"}, nil
	}
	run := func(ann map[string]string) {
		t.Helper()
		as := podtable.Admissions{Features: []podtable.Admitter{r}}
		if _, err := as.Run(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "ns", Uid: "uid-1"}, Annotations: ann}}, next); err != nil {
			t.Fatal(err)
		}
	}
	run(map[string]string{"other": "x"})
	if len(w.conds)+len(w.events) != 0 {
		t.Fatalf("an unannotated pod got %v %v", w.conds, w.events)
	}
	run(map[string]string{
		podspec.RestartRulesPrefix + "main": `[{"action":"Explode"}]`,
		"pod-management.cri-shim.io/main":   `{"port": -1}`,
		podspec.TerminationKey:              "sudden",
	})
	if c := w.conds[ReadyCondition]; c.Status != corev1.ConditionTrue {
		t.Fatalf("readiness gate of a new sandbox: %+v", c)
	}
	if got := w.reasons(); got != "Warning/InvalidPodManagement Warning/InvalidRestartRules Warning/InvalidRestartRules" {
		t.Fatalf("events %s", got)
	}
	for i, key := range []string{"pod-management.cri-shim.io/main", podspec.RestartRulesPrefix + "main", podspec.TerminationKey} {
		if e := w.events[i]; e.Action != "Ignore "+key || !strings.Contains(e.Note, key) {
			t.Errorf("event %d %+v does not name %s", i, e, key)
		}
	}
	// Two orchestrators: a problem of the pair, not of either key.
	w.events = nil
	run(map[string]string{"pod-management.cri-shim.io/a": `{"port": 8080, "version": "1.0"}`, "pod-management.cri-shim.io/b": `{"port": 8081, "version": "1.0"}`})
	if len(w.events) != 1 || w.events[0].Action != "Ignore pod-management.cri-shim.io/*" || !strings.Contains(w.events[0].Note, "only one may") {
		t.Fatalf("two orchestrators: %+v", w.events)
	}
}

func TestOwnerFromDeclaredFeatures(t *testing.T) {
	for _, tc := range []struct {
		features []string
		kubelet  string
		want     int32
	}{
		{nil, "v1.37.2", ownerShim},
		{[]string{"GuaranteedQoSPodCPUResize"}, "v1.36.3", ownerShim},
		{[]string{"GuaranteedQoSPodCPUResize", KubeletFeatureRestartAll}, "v1.36.3", ownerKubelet},
		{[]string{KubeletFeatureRestartAll}, "v1.35.4", ownerKubelet},
		// Left by an earlier kubelet: v1.34 cannot own the condition.
		{[]string{KubeletFeatureRestartAll}, "v1.34.4", ownerShim},
		{[]string{KubeletFeatureRestartAll}, "v1.34.4-eks.1", ownerShim},
		// No version to go by: the declared features decide.
		{[]string{KubeletFeatureRestartAll}, "", ownerKubelet},
	} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Status: corev1.NodeStatus{
			DeclaredFeatures: tc.features, NodeInfo: corev1.NodeSystemInfo{KubeletVersion: tc.kubelet}}}
		o := newOwnerCheck(kubeapi.NewFor(kubeapitest.Clientset{Interface: fake.NewClientset(node)}, "node-1"), slog.New(slog.DiscardHandler))
		if err := o.check(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := o.state.Load(); got != tc.want {
			t.Fatalf("features %v, kubelet %q: owner %d, want %d", tc.features, tc.kubelet, got, tc.want)
		}
	}
	o := newOwnerCheck(kubeapi.NewFor(kubeapitest.Clientset{Interface: fake.NewClientset()}, "node-1"), slog.New(slog.DiscardHandler))
	if err := o.check(context.Background()); err == nil || o.state.Load() != ownerUnknown {
		t.Fatal(fmt.Sprint("node not registered yet: want an error and the owner unknown, got ", err, o.state.Load()))
	}
}

// A new shim process writes every tracked pod's conditions as they are,
// stamped with when its state last changed, and no events.
func TestCatchUpWritesConditionsOfTrackedPods(t *testing.T) {
	r, w := reporter(ownerShim)
	since := exited.Add(time.Minute)
	r.catchUp([]restartapi.PodState{{Pod: pod, Since: since, RestartedAll: true}})
	if c := w.conds[ReadyCondition]; c.Status != corev1.ConditionTrue || !c.At.Equal(since) {
		t.Fatalf("running pod's gate %+v", c)
	}
	if c := w.conds[corev1.AllContainersRestarting]; c.Status != corev1.ConditionFalse {
		t.Fatalf("running pod's AllContainersRestarting %+v", c)
	}
	r, w = reporter(ownerShim)
	r.catchUp([]restartapi.PodState{{Pod: pod, Since: since, Restarting: true, Trigger: trigger}})
	if c := w.conds[ReadyCondition]; c.Status != corev1.ConditionFalse || !strings.Contains(c.Message, "main exited with code 3") {
		t.Fatalf("restarting pod's gate %+v", c)
	}
	if c := w.conds[corev1.AllContainersRestarting]; c.Status != corev1.ConditionTrue {
		t.Fatalf("restarting pod's AllContainersRestarting %+v", c)
	}
	r, w = reporter(ownerShim)
	r.catchUp([]restartapi.PodState{{Pod: pod, Since: since}})
	if _, ok := w.conds[corev1.AllContainersRestarting]; ok || len(w.events) != 0 {
		t.Fatalf("a pod that never restarted all: %v, events %v", w.conds, w.events)
	}
}

// A warm restart is told as an event: Normal with the checkpoint and its
// age when restored, Warning with the reason when the container started cold.
func TestWarmRestartEvents(t *testing.T) {
	r, w := reporter(ownerShim)
	r.WarmRestart(pod, restartapi.WarmResult{Container: "main", Checkpoint: "cp1", Age: 90 * time.Second})
	r.WarmRestart(pod, restartapi.WarmResult{Container: "main", Cold: "the pod has no checkpoint"})
	if got := w.reasons(); got != "Normal/WarmRestarted Warning/WarmRestartFallback" {
		t.Fatalf("events %s", got)
	}
	if n := w.events[0].Note; n != "container main restored from checkpoint cp1, taken 1m30s before" {
		t.Errorf("note %q", n)
	}
	if n := w.events[1].Note; n != "container main started cold: the pod has no checkpoint" {
		t.Errorf("note %q", n)
	}
	if len(w.conds) != 0 {
		t.Errorf("conditions written: %v", w.conds)
	}
}
