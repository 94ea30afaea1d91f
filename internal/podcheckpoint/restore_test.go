package podcheckpoint

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
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
	pc.Status.PodSpecDigest, _ = SpecDigest(Template(src))
	setReady(&pc.Status, metav1.ConditionTrue, cpv1.ReasonCompleted, "", 1, time.Now())
	return pc
}

// holderTemplates is a restoreView's template reader over root, where
// recorded writes the template of src for each object given, as the
// reconciler does when it takes the checkpoint.
func holderTemplates(t *testing.T) (read func(*cpv1.PodCheckpoint) (*corev1.PodTemplateSpec, error), recorded func(*cpv1.PodCheckpoint, *corev1.Pod)) {
	root := t.TempDir()
	read = func(pc *cpv1.PodCheckpoint) (*corev1.PodTemplateSpec, error) {
		return readTemplate(filepath.Join(root, DataDir(pc)))
	}
	recorded = func(pc *cpv1.PodCheckpoint, src *corev1.Pod) {
		dir := filepath.Join(root, DataDir(pc))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := writeTemplate(dir, Template(src)); err != nil {
			t.Fatal(err)
		}
	}
	return read, recorded
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
	r := NewRestores("node-a", 0, ev.sink)
	_, err := r.Resolve(t.Context(), "ns", "restored", "u2", "cp")
	wantReason(t, "before the API connection", err, "CheckpointNotReady")
	templates, recorded := holderTemplates(t)
	r.connect(&restoreView{
		object: func(ns, name string) *cpv1.PodCheckpoint { return objs[key(ns, name)] },
		pod:    func(ns, name string) *corev1.Pod { return pods[key(ns, name)] },
		get: func(_ context.Context, ns, name string) (*cpv1.PodCheckpoint, error) {
			if pc := remote[key(ns, name)]; pc != nil {
				return pc, nil
			}
			return nil, errNotFound(name)
		},
		template: templates,
	})
	restoring := sourcePod()
	restoring.Name, restoring.UID, restoring.Spec.NodeName = "restored", "u2", "node-a"
	pods["ns/restored"] = restoring

	objs["ns/cp"] = readyObject("ns", "cp", "node-a", src)
	_, err = r.Resolve(t.Context(), "ns", "restored", "u2", "cp")
	wantReason(t, "no template file in the data directory", err, "CheckpointNotReady")
	recorded(objs["ns/cp"], src)
	if dir, err := r.Resolve(t.Context(), "ns", "restored", "u2", "cp"); err != nil || dir != DataDir(objs["ns/cp"]) {
		t.Errorf("ready, here, matching: %q, %v", dir, err)
	}
	// A status digest that is not the recorded template's is refused, even
	// when it is the restoring pod's own (a status written to let it in).
	tampered := readyObject("ns", "cp", "node-a", src)
	other := sourcePod()
	other.Spec.Containers[0].Image = "busybox:2"
	tampered.Status.PodSpecDigest, _ = SpecDigest(Template(other))
	objs["ns/cp"] = tampered
	restoringOther := other.DeepCopy()
	restoringOther.Name, restoringOther.UID, restoringOther.Spec.NodeName = "restored-other", "u3", "node-a"
	pods["ns/restored-other"] = restoringOther
	for _, p := range []struct{ name, uid string }{{"restored", "u2"}, {"restored-other", "u3"}} {
		_, err = r.Resolve(t.Context(), "ns", p.name, p.uid, "cp")
		wantReason(t, "tampered status digest, pod "+p.name, err, "CheckpointNotReady")
		if err != nil && !strings.Contains(err.Error(), "not the digest of the template this node recorded") {
			t.Errorf("tampered digest: %v", err)
		}
	}
	noDigest := readyObject("ns", "cp", "node-a", src)
	noDigest.Status.PodSpecDigest = ""
	objs["ns/cp"] = noDigest
	_, err = r.Resolve(t.Context(), "ns", "restored", "u2", "cp")
	wantReason(t, "no status digest", err, "CheckpointNotReady")
	// A status naming another object's data is refused.
	elsewhere := readyObject("ns", "cp", "node-a", src)
	elsewhere.Status.CheckpointLocation.NodeLocal.Path = "pcp-another-uid"
	objs["ns/cp"] = elsewhere
	_, err = r.Resolve(t.Context(), "ns", "restored", "u2", "cp")
	wantReason(t, "location not the object's own", err, "CheckpointNotReady")
	objs["ns/cp"] = readyObject("ns", "cp", "node-a", src)
	_, err = r.Resolve(t.Context(), "ns", "restored", "u-other", "cp")
	wantReason(t, "pod of another UID in the cache", err, "CheckpointNotReady")

	inProgress := readyObject("ns", "cp", "node-a", src)
	setReady(&inProgress.Status, metav1.ConditionFalse, cpv1.ReasonInProgress, "", 1, time.Now())
	objs["ns/cp"] = inProgress
	_, err = r.Resolve(t.Context(), "ns", "restored", "u2", "cp")
	wantReason(t, "in progress", err, "CheckpointNotReady")

	objs["ns/cp"] = readyObject("ns", "cp", "node-a", src)
	restoring.Spec.Containers[0].Image = "busybox:2"
	_, err = r.Resolve(t.Context(), "ns", "restored", "u2", "cp")
	wantReason(t, "image changed", err, "PodSpecMismatch")
	if err != nil && !strings.Contains(err.Error(), "spec.containers[0].image") {
		t.Errorf("mismatch does not name the field: %v", err)
	}
	if got := ev.list(); len(got) == 0 || got[len(got)-1] != "Pod/restored Warning PodSpecMismatch" {
		t.Errorf("events %v, want the last a PodSpecMismatch of the pod", got)
	}

	// Not watched here: read in the background, then answered (this
	// resolver does not wait for the read; TestResolveWaitsForTheObjectsRead).
	remote["ns/far"] = readyObject("ns", "far", "node-b", src)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err = r.Resolve(t.Context(), "ns", "restored", "u2", "far")
		if err != nil && strings.HasPrefix(err.Error(), "CheckpointWrongNode: ") || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	wantReason(t, "object on another node", err, "CheckpointWrongNode")
	// Another namespace's object is not found from this one.
	_, err = r.Resolve(t.Context(), "other", "restored", "u2", "cp")
	wantReason(t, "other namespace", err, "CheckpointNotReady")

	// An object naming an image resolves to the reference, whatever its
	// status, on any node: the pull applies the registry and namespace rules.
	img := "127.0.0.1:5000/cp/web@sha256:" + strings.Repeat("a", 64)
	fromImage := &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "img"}, Spec: cpv1.PodCheckpointSpec{SourceImage: img}}
	fromImage.Status.NodeName = "node-b"
	objs["ns/img"] = fromImage
	if got, err := r.Resolve(t.Context(), "ns", "restored", "u2", "img"); err != nil || got != img {
		t.Errorf("object with sourceImage: %q, %v, want %s", got, err, img)
	}
}

// exportedObject is readyObject held by node with spec.export image and,
// when digest is not empty, the export of it done.
func exportedObject(ns, name, node string, src *corev1.Pod, image, digest string) *cpv1.PodCheckpoint {
	pc := readyObject(ns, name, node, src)
	pc.Labels = map[string]string{cpv1.NodeLabel: cpv1.NodeLabelValue(node)} // routed to its holder
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
// PodSpecMismatch checks as one held here; not exported (yet), with a
// status.export outside spec.export.image's repository, or held by another
// node than the one it is routed to, it is refused.
func TestResolveRestoreExportedElsewhere(t *testing.T) {
	src := sourcePod()
	objs := map[string]*cpv1.PodCheckpoint{}
	pods := map[string]*corev1.Pod{}
	r := NewRestores("node-b", 0, (&fakeEvents{}).sink)
	templates, recorded := holderTemplates(t)
	r.connect(&restoreView{
		object: func(ns, name string) *cpv1.PodCheckpoint { return objs[key(ns, name)] },
		pod:    func(ns, name string) *corev1.Pod { return pods[key(ns, name)] },
		get: func(_ context.Context, _, name string) (*cpv1.PodCheckpoint, error) {
			return nil, errNotFound(name)
		},
		template: templates,
	})
	restoring := sourcePod()
	restoring.Name, restoring.UID, restoring.Spec.NodeName = "restored", "u2", "node-b"
	pods["ns/restored"] = restoring
	digest := "sha256:" + strings.Repeat("b", 64)
	const image = "127.0.0.1:5443/e2e/cp:v1"
	want := "127.0.0.1:5443/e2e/cp@" + digest

	objs["ns/cp"] = exportedObject("ns", "cp", "node-a", src, image, digest)
	if got, err := r.Resolve(t.Context(), "ns", "restored", "u2", "cp"); err != nil || got != want {
		t.Errorf("exported, held by node-a: %q, %v, want %s", got, err, want)
	}
	// spec.export.image without a tag is pushed as :latest, same repository.
	objs["ns/cp"] = exportedObject("ns", "cp", "node-a", src, "127.0.0.1:5443/e2e/cp", digest)
	if got, err := r.Resolve(t.Context(), "ns", "restored", "u2", "cp"); err != nil || got != want {
		t.Errorf("exported without a tag: %q, %v, want %s", got, err, want)
	}
	// The same object held here restores from the node's own data.
	objs["ns/cp"] = exportedObject("ns", "cp", "node-b", src, image, digest)
	recorded(objs["ns/cp"], src)
	if got, err := r.Resolve(t.Context(), "ns", "restored", "u2", "cp"); err != nil || got != DataDir(objs["ns/cp"]) {
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
		{"no spec digest", func(pc *cpv1.PodCheckpoint) { pc.Status.PodSpecDigest = "" }, "CheckpointNotReady"},
		{"malformed spec digest", func(pc *cpv1.PodCheckpoint) { pc.Status.PodSpecDigest = "sha256:" + strings.Repeat("G", 64) }, "CheckpointNotReady"},
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
		// A status another node wrote (forged past the admission policy):
		// the holder is not the node the object is routed to.
		{"held by another node than routed", func(pc *cpv1.PodCheckpoint) { pc.Labels[cpv1.NodeLabel] = "node-c" }, "CheckpointNotReady"},
		{"held, never routed", func(pc *cpv1.PodCheckpoint) { pc.Labels = nil }, "CheckpointNotReady"},
		{"Exported True without spec.export's repository", func(pc *cpv1.PodCheckpoint) {
			pc.Spec.Export.Image = "127.0.0.1:5443/e2e/other:v1"
		}, "CheckpointNotReady"},
		{"spec differs", func(pc *cpv1.PodCheckpoint) {
			other := sourcePod()
			other.Spec.Containers[0].Image = "busybox:2"
			pc.Status.PodSpecDigest, _ = SpecDigest(Template(other))
		}, "PodSpecMismatch"},
	} {
		pc := exportedObject("ns", "cp", "node-a", src, image, digest)
		tc.edit(pc)
		objs["ns/cp"] = pc
		_, err := r.Resolve(t.Context(), "ns", "restored", "u2", "cp")
		wantReason(t, tc.what, err, tc.reason)
		if tc.reason == "PodSpecMismatch" && err != nil && !strings.Contains(err.Error(), pc.Status.PodSpecDigest) {
			t.Errorf("%s: the refusal does not name the status digest: %v", tc.what, err)
		}
	}

	objs["ns/cp"] = exportedObject("ns", "cp", "node-a", src, image, digest)
	_, err := r.Resolve(t.Context(), "ns", "restored", "u-other", "cp")
	wantReason(t, "pod of another UID in the cache", err, "CheckpointNotReady")
}

// farResolver is node-b's resolver, waiting at most wait for reads of api;
// its watches hold no object, its pod cache the restoring pod ns/restored
// (UID u2). It returns the reference the object "far", which node-a holds
// and exported, resolves to once read.
func farResolver(t *testing.T, api *fakeAPI, wait time.Duration) (*Restores, string) {
	t.Helper()
	src := sourcePod()
	restoring := sourcePod()
	restoring.Name, restoring.UID, restoring.Spec.NodeName = "restored", "u2", "node-b"
	digest := "sha256:" + strings.Repeat("d", 64)
	api.put(exportedObject("ns", "far", "node-a", src, "127.0.0.1:5443/e2e/far:v1", digest))
	r := NewRestores("node-b", wait, (&fakeEvents{}).sink)
	r.connect(&restoreView{
		object: func(string, string) *cpv1.PodCheckpoint { return nil },
		pod: func(ns, name string) *corev1.Pod {
			if key(ns, name) == "ns/restored" {
				return restoring
			}
			return nil
		},
		get: api.Get,
	})
	// Every read ends with the test, so none outlives it.
	t.Cleanup(func() {
		api.mu.Lock()
		if api.hold != nil {
			select {
			case <-api.hold:
			default:
				close(api.hold)
			}
		}
		api.mu.Unlock()
		readsEnd(t, r, api)
	})
	return r, "127.0.0.1:5443/e2e/far@" + digest
}

// readsEnd waits until r has no read running and api no Get.
func readsEnd(t *testing.T, r *Restores, api *fakeAPI) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		r.mu.Lock()
		pending := len(r.pending)
		r.mu.Unlock()
		if _, running := api.getCalls(); pending == 0 && running == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d reads still pending after 5s", pending)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func wantUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	wantReason(t, what, err, "CheckpointNotReady")
	if !errdefs.IsUnavailable(err) {
		t.Errorf("%s: %v is not of the Unavailable class", what, err)
	}
}

// The first RunPodSandbox naming an object the node does not watch waits
// for its read, and is answered as soon as the read is in, not at the end
// of the wait.
func TestResolveWaitsForTheObjectsRead(t *testing.T) {
	api := newFakeAPI()
	api.hold = make(chan struct{})
	r, want := farResolver(t, api, 10*time.Second)
	const answersAfter = 150 * time.Millisecond
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	time.AfterFunc(answersAfter, func() { close(api.hold) })
	got, err := r.Resolve(ctx, "ns", "restored", "u2", "far")
	took := time.Since(start)
	if err != nil || got != want {
		t.Fatalf("first call: %q, %v, want %s", got, err, want)
	}
	if took < answersAfter || took > answersAfter+time.Second {
		t.Errorf("answered %v after the call, the read %v after it: want as soon as the read is in", took, answersAfter)
	}
	// The answer is used for the next call without a read.
	if got, err := r.Resolve(ctx, "ns", "restored", "u2", "far"); err != nil || got != want {
		t.Errorf("second call: %q, %v", got, err)
	}
	if made, _ := api.getCalls(); made != 1 {
		t.Errorf("%d reads of the object, want 1", made)
	}
}

// An API server that does not answer holds the call only the configured
// wait; the call is answered Unavailable, the read goes on (a call meanwhile
// joins it), and the kubelet's retry finds it done.
func TestResolveWaitIsBounded(t *testing.T) {
	api := newFakeAPI()
	api.hold = make(chan struct{})
	const wait = 300 * time.Millisecond
	r, want := farResolver(t, api, wait)
	for i := range 2 {
		start := time.Now()
		_, err := r.Resolve(t.Context(), "ns", "restored", "u2", "far")
		took := time.Since(start)
		wantUnavailable(t, "API server not answering", err)
		if err != nil && !strings.Contains(err.Error(), "is being looked up") {
			t.Errorf("call %d: %v, want the read named", i, err)
		}
		if took < wait || took > wait+time.Second {
			t.Errorf("call %d answered after %v, want after the wait of %v", i, took, wait)
		}
	}
	if made, running := api.getCalls(); made != 1 || running != 1 {
		t.Errorf("reads made %d, running %d: want the one read, still running", made, running)
	}
	close(api.hold)
	readsEnd(t, r, api)
	start := time.Now()
	if got, err := r.Resolve(t.Context(), "ns", "restored", "u2", "far"); err != nil || got != want {
		t.Fatalf("retry after the read ended: %q, %v, want %s", got, err, want)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("retry waited %v for an answer it had", took)
	}
}

// The wait ends deadlineMargin before the call's own deadline, and at once
// when the call has less than that left or is cancelled.
func TestResolveWaitHonoursTheCallsDeadline(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ctx    func() (context.Context, context.CancelFunc)
		within time.Duration
	}{
		{"deadline in 2.4s", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(t.Context(), deadlineMargin+400*time.Millisecond)
		}, 400 * time.Millisecond},
		{"deadline in 1s", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(t.Context(), time.Second)
		}, 0},
		{"cancelled", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			return ctx, cancel
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newFakeAPI()
			api.hold = make(chan struct{})
			r, _ := farResolver(t, api, 10*time.Second)
			ctx, cancel := tc.ctx()
			defer cancel()
			start := time.Now()
			_, err := r.Resolve(ctx, "ns", "restored", "u2", "far")
			took := time.Since(start)
			wantUnavailable(t, tc.name, err)
			if took < tc.within-50*time.Millisecond || took > tc.within+time.Second {
				t.Errorf("answered after %v, want after about %v", took, tc.within)
			}
			// The read was started, goes on past the call, and is not
			// started twice.
			deadline := time.Now().Add(5 * time.Second)
			made, running := api.getCalls()
			for made == 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
				made, running = api.getCalls()
			}
			if made != 1 || running != 1 {
				t.Errorf("reads made %d, running %d: want the one read, going on past the call", made, running)
			}
		})
	}
}

// An API server that refuses answers at once, of the Unavailable class and
// with its error; a server that does not answer, after the wait. Neither
// holds the call longer.
func TestResolveAPIServerDown(t *testing.T) {
	api := newFakeAPI()
	api.down = true
	r, want := farResolver(t, api, 10*time.Second)
	start := time.Now()
	_, err := r.Resolve(t.Context(), "ns", "restored", "u2", "far")
	wantUnavailable(t, "API server down", err)
	if took := time.Since(start); took > time.Second {
		t.Errorf("answered after %v; the read failed at once", took)
	}
	// Up again: the failed answer is not kept past fetchTTL.
	api.mu.Lock()
	api.down = false
	api.mu.Unlock()
	r.mu.Lock()
	res := r.fetched["ns/far"]
	res.at = res.at.Add(-fetchTTL - time.Second)
	r.fetched["ns/far"] = res
	r.mu.Unlock()
	if got, err := r.Resolve(t.Context(), "ns", "restored", "u2", "far"); err != nil || got != want {
		t.Errorf("API server back, answer older than fetchTTL: %q, %v, want %s", got, err, want)
	}
}

// An answer older than fetchTTL is read again and the call waits for that
// read; when the API server does not answer within the wait, the old
// answer is used, as before the wait existed.
func TestResolveStaleAnswer(t *testing.T) {
	api := newFakeAPI()
	r, want := farResolver(t, api, 300*time.Millisecond)
	if got, err := r.Resolve(t.Context(), "ns", "restored", "u2", "far"); err != nil || got != want {
		t.Fatalf("first call: %q, %v", got, err)
	}
	age := func() {
		r.mu.Lock()
		res := r.fetched["ns/far"]
		res.at = res.at.Add(-fetchTTL - time.Second)
		r.fetched["ns/far"] = res
		r.mu.Unlock()
	}
	// Deleted meanwhile: the new read's answer, not the old one.
	api.mu.Lock()
	delete(api.objs, "ns/far")
	api.mu.Unlock()
	age()
	_, err := r.Resolve(t.Context(), "ns", "restored", "u2", "far")
	wantReason(t, "object deleted, old answer", err, "CheckpointNotReady")
	if err == nil || !strings.Contains(err.Error(), `no PodCheckpoint "far"`) || errdefs.IsUnavailable(err) {
		t.Errorf("object deleted: %v, want no such object, not Unavailable", err)
	}
	// Back, but the server does not answer: the old answer after the wait.
	api.put(exportedObject("ns", "far", "node-a", sourcePod(), "127.0.0.1:5443/e2e/far:v1", "sha256:"+strings.Repeat("d", 64)))
	api.mu.Lock()
	api.hold = make(chan struct{})
	api.mu.Unlock()
	age()
	start := time.Now()
	_, err = r.Resolve(t.Context(), "ns", "restored", "u2", "far")
	if took := time.Since(start); err == nil || !strings.Contains(err.Error(), `no PodCheckpoint "far"`) || took < 300*time.Millisecond || took > 1300*time.Millisecond {
		t.Errorf("server not answering, old answer: %v after %v", err, took)
	}
	close(api.hold)
	readsEnd(t, r, api)
	if got, err := r.Resolve(t.Context(), "ns", "restored", "u2", "far"); err != nil || got != want {
		t.Errorf("after the read: %q, %v, want %s", got, err, want)
	}
}
