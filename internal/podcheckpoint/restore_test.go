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

// exportedObject is readyObject held by node with spec.export image and,
// when digest is not empty, the export of it done.
func exportedObject(ns, name, node string, src *corev1.Pod, image, digest string) *cpv1.PodCheckpoint {
	pc := readyObject(ns, name, node, src)
	pc.Spec.Export = &cpv1.PodCheckpointExport{Image: image}
	if digest != "" {
		repo, _, _ := strings.Cut(strings.TrimSuffix(image, ":v1"), "@")
		pc.Status.Export = &cpv1.PodCheckpointExportStatus{Image: repo + "@" + digest, Digest: digest}
		setCondition(&pc.Status, cpv1.ConditionExported, metav1.ConditionTrue, cpv1.ReasonExported, "", 1, time.Now())
	}
	return pc
}

// A PodCheckpoint another node holds resolves, on this node, to the image
// its holder pushed for spec.export, after the same Ready and
// PodSpecMismatch checks as one held here; not exported (yet), or with a
// status.export outside spec.export.image's repository, it is refused.
func TestResolveRestoreExportedElsewhere(t *testing.T) {
	src := sourcePod()
	objs := map[string]*cpv1.PodCheckpoint{}
	pods := map[string]*corev1.Pod{}
	r := NewRestores("node-b", (&fakeEvents{}).sink)
	r.connect(&restoreView{
		object: func(ns, name string) *cpv1.PodCheckpoint { return objs[key(ns, name)] },
		pod:    func(ns, name string) *corev1.Pod { return pods[key(ns, name)] },
		get: func(_ context.Context, _, name string) (*cpv1.PodCheckpoint, error) {
			return nil, errNotFound(name)
		},
	})
	restoring := sourcePod()
	restoring.Name, restoring.UID, restoring.Spec.NodeName = "restored", "u2", "node-b"
	pods["ns/restored"] = restoring
	digest := "sha256:" + strings.Repeat("b", 64)
	const image = "127.0.0.1:5443/e2e/cp:v1"
	want := "127.0.0.1:5443/e2e/cp@" + digest

	objs["ns/cp"] = exportedObject("ns", "cp", "node-a", src, image, digest)
	if got, err := r.Resolve("ns", "restored", "u2", "cp"); err != nil || got != want {
		t.Errorf("exported, held by node-a: %q, %v, want %s", got, err, want)
	}
	// spec.export.image without a tag is pushed as :latest, same repository.
	objs["ns/cp"] = exportedObject("ns", "cp", "node-a", src, "127.0.0.1:5443/e2e/cp", digest)
	if got, err := r.Resolve("ns", "restored", "u2", "cp"); err != nil || got != want {
		t.Errorf("exported without a tag: %q, %v, want %s", got, err, want)
	}
	// The same object held here restores from the node's own data.
	objs["ns/cp"] = exportedObject("ns", "cp", "node-b", src, image, digest)
	if got, err := r.Resolve("ns", "restored", "u2", "cp"); err != nil || got != DataDir(objs["ns/cp"]) {
		t.Errorf("exported, held here: %q, %v, want the data directory", got, err)
	}

	for _, tc := range []struct {
		what   string
		edit   func(*cpv1.PodCheckpoint)
		reason string
	}{
		{"no spec.export", func(pc *cpv1.PodCheckpoint) { pc.Spec.Export, pc.Status.Export = nil, nil }, "CheckpointWrongNode"},
		{"export not done", func(pc *cpv1.PodCheckpoint) {
			pc.Status.Export = nil
			setCondition(&pc.Status, cpv1.ConditionExported, metav1.ConditionFalse, cpv1.ReasonExportInProgress, "", 1, time.Now())
		}, "CheckpointWrongNode"},
		{"export failed, stale status", func(pc *cpv1.PodCheckpoint) {
			setCondition(&pc.Status, cpv1.ConditionExported, metav1.ConditionFalse, cpv1.ReasonExportFailed, "", 1, time.Now())
		}, "CheckpointWrongNode"},
		{"not Ready", func(pc *cpv1.PodCheckpoint) {
			setReady(&pc.Status, metav1.ConditionFalse, cpv1.ReasonSourcePodReplaced, "", 1, time.Now())
		}, "CheckpointNotReady"},
		{"no template", func(pc *cpv1.PodCheckpoint) { pc.Status.CheckpointedPodTemplate = nil }, "CheckpointNotReady"},
		{"another repository", func(pc *cpv1.PodCheckpoint) {
			pc.Status.Export.Image = "127.0.0.1:5443/other/cp@" + digest
		}, "CheckpointNotReady"},
		{"another registry", func(pc *cpv1.PodCheckpoint) {
			pc.Status.Export.Image = "127.0.0.2:5999/e2e/cp@" + digest
		}, "CheckpointNotReady"},
		{"another digest", func(pc *cpv1.PodCheckpoint) {
			pc.Status.Export.Digest = "sha256:" + strings.Repeat("c", 64)
		}, "CheckpointNotReady"},
		{"a tag in status", func(pc *cpv1.PodCheckpoint) { pc.Status.Export.Image = image }, "CheckpointNotReady"},
		{"spec differs", func(pc *cpv1.PodCheckpoint) {
			pc.Status.CheckpointedPodTemplate.Spec.Containers[0].Image = "busybox:2"
		}, "PodSpecMismatch"},
	} {
		pc := exportedObject("ns", "cp", "node-a", src, image, digest)
		tc.edit(pc)
		objs["ns/cp"] = pc
		_, err := r.Resolve("ns", "restored", "u2", "cp")
		wantReason(t, tc.what, err, tc.reason)
	}

	objs["ns/cp"] = exportedObject("ns", "cp", "node-a", src, image, digest)
	_, err := r.Resolve("ns", "restored", "u-other", "cp")
	wantReason(t, "pod of another UID in the cache", err, "CheckpointNotReady")
}
