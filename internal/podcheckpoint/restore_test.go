package podcheckpoint

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

func readyObject(ns, name, node string, src *corev1.Pod) *cpv1.PodCheckpoint {
	pc := object(ns, name, src.Name)
	pc.UID = types.UID("uid-" + name)
	pc.Status.NodeName = node
	pc.Status.CheckpointLocation = &cpv1.CheckpointSource{Type: cpv1.CheckpointSourceTypeNodeLocal,
		NodeLocal: &cpv1.NodeLocalCheckpointSource{Path: DataDir(pc)}}
	pc.Status.CheckpointedPodTemplate = Template(src)
	setReady(&pc.Status, metav1.ConditionTrue, cpv1.ReasonCompleted, "", 1, time.Now())
	return pc
}

func wantReason(t *testing.T, what string, err error, reason string) {
	t.Helper()
	if err == nil || !strings.HasPrefix(err.Error(), reason+": ") {
		t.Errorf("%s: %v, want %s", what, err, reason)
	}
}

// A restore-from name resolves to a Ready PodCheckpoint's directory on this
// node when the pod's spec matches its template; otherwise the refusal
// starts with KEP-5823's reason.
func TestResolveRestore(t *testing.T) {
	src := sourcePod()
	objs := map[string]*cpv1.PodCheckpoint{}
	remote := map[string]*cpv1.PodCheckpoint{}
	pods := map[string]*corev1.Pod{}
	ev := &fakeEvents{}
	r := NewRestores("node-a", ev.sink)
	_, err := r.Resolve("ns", "restored", "u2", "cp")
	wantReason(t, "before the API connection", err, "CheckpointNotReady")
	r.connect(&restoreView{
		object: func(ns, name string) *cpv1.PodCheckpoint { return objs[key(ns, name)] },
		pod:    func(ns, name string) *corev1.Pod { return pods[key(ns, name)] },
		get: func(_ context.Context, ns, name string) (*cpv1.PodCheckpoint, error) {
			if pc := remote[key(ns, name)]; pc != nil {
				return pc, nil
			}
			return nil, errNotFound(name)
		},
	})
	restoring := sourcePod()
	restoring.Name, restoring.UID, restoring.Spec.NodeName = "restored", "u2", "node-a"
	pods["ns/restored"] = restoring

	objs["ns/cp"] = readyObject("ns", "cp", "node-a", src)
	if dir, err := r.Resolve("ns", "restored", "u2", "cp"); err != nil || dir != DataDir(objs["ns/cp"]) {
		t.Errorf("ready, here, matching: %q, %v", dir, err)
	}
	// A status naming another object's data is refused.
	other := readyObject("ns", "cp", "node-a", src)
	other.Status.CheckpointLocation.NodeLocal.Path = "pcp-another-uid"
	objs["ns/cp"] = other
	_, err = r.Resolve("ns", "restored", "u2", "cp")
	wantReason(t, "location not the object's own", err, "CheckpointNotReady")
	objs["ns/cp"] = readyObject("ns", "cp", "node-a", src)
	_, err = r.Resolve("ns", "restored", "u-other", "cp")
	wantReason(t, "pod of another UID in the cache", err, "CheckpointNotReady")

	inProgress := readyObject("ns", "cp", "node-a", src)
	setReady(&inProgress.Status, metav1.ConditionFalse, cpv1.ReasonInProgress, "", 1, time.Now())
	objs["ns/cp"] = inProgress
	_, err = r.Resolve("ns", "restored", "u2", "cp")
	wantReason(t, "in progress", err, "CheckpointNotReady")

	objs["ns/cp"] = readyObject("ns", "cp", "node-a", src)
	restoring.Spec.Containers[0].Image = "busybox:2"
	_, err = r.Resolve("ns", "restored", "u2", "cp")
	wantReason(t, "image changed", err, "PodSpecMismatch")
	if err != nil && !strings.Contains(err.Error(), "spec.containers[0].image") {
		t.Errorf("mismatch does not name the field: %v", err)
	}
	if got := ev.list(); len(got) == 0 || got[len(got)-1] != "Pod/restored Warning PodSpecMismatch" {
		t.Errorf("events %v, want the last a PodSpecMismatch of the pod", got)
	}

	// Not watched here: read in the background, then answered.
	remote["ns/far"] = readyObject("ns", "far", "node-b", src)
	_, err = r.Resolve("ns", "restored", "u2", "far")
	wantReason(t, "first look at an unwatched object", err, "CheckpointNotReady")
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err = r.Resolve("ns", "restored", "u2", "far")
		if err != nil && strings.HasPrefix(err.Error(), "CheckpointWrongNode: ") || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	wantReason(t, "object on another node", err, "CheckpointWrongNode")
	// Another namespace's object is not found from this one.
	_, err = r.Resolve("other", "restored", "u2", "cp")
	wantReason(t, "other namespace", err, "CheckpointNotReady")

	// An object naming an image resolves to the reference, whatever its
	// status, on any node: the pull applies the registry and namespace rules.
	img := "127.0.0.1:5000/cp/web@sha256:" + strings.Repeat("a", 64)
	fromImage := &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "img"}, Spec: cpv1.PodCheckpointSpec{SourceImage: img}}
	fromImage.Status.NodeName = "node-b"
	objs["ns/img"] = fromImage
	if got, err := r.Resolve("ns", "restored", "u2", "img"); err != nil || got != img {
		t.Errorf("object with sourceImage: %q, %v, want %s", got, err, img)
	}
}
