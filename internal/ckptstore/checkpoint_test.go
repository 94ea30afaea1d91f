package ckptstore

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/proxy"
)

// assertClean: nothing paused, nothing in the output, no record left.
func assertClean(t *testing.T, fx *fixture, when string) {
	t.Helper()
	if p := fx.rt.Tasks.AnyPaused(); len(p) > 0 {
		t.Fatalf("%s: %v left paused", when, p)
	}
	if got := ckpttest.Entries(t, fx.dir); len(got) != 0 {
		t.Fatalf("%s: %v left in the output", when, got)
	}
	if got := ckpttest.Entries(t, filepath.Join(fx.stateDir, "checkpoint")); len(got) != 0 {
		t.Fatalf("%s: state left behind: %v", when, got)
	}
}

func TestCheckpointPodIsOneConsistentCut(t *testing.T) {
	for _, sequential := range []bool{false, true} {
		fx := newFixture(t)
		req := ckpttest.CpReq(fx.dir, "c1", "c2")
		if sequential {
			req.Options = map[string]string{capture.OptionSequential: "true"}
		}
		if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), req); err != nil {
			t.Fatalf("sequential=%v: %v", sequential, err)
		}
		for _, id := range []string{"c1", "c2"} {
			seen := fx.rt.DumpSeen[id]
			if seen == nil {
				t.Fatalf("%s was not captured", id)
			}
			if !seen["c1"] || !seen["c2"] {
				t.Errorf("sequential=%v: when %s was captured, paused were %v: not one cut", sequential, id, seen)
			}
			if seen["c3"] {
				t.Errorf("a container of another pod was paused")
			}
		}
		if p := fx.rt.Tasks.AnyPaused(); len(p) > 0 {
			t.Fatalf("left paused: %v", p)
		}
		// The resume while the pod is frozen is one round trip: no
		// question whether the containers are paused first.
		if n := fx.rt.Tasks.PausedAsked(); n != 0 {
			t.Errorf("asked %d times whether a container is paused", n)
		}
		m, err := layout.ReadManifest(fx.dir)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range m.Containers {
			got = append(got, c.Name)
		}
		if !slices.Equal(got, []string{"sidecar", "app"}) {
			t.Errorf("containers %v, want creation order [sidecar app]", got)
		}
		if m.Containers[0].RestartCount != 2 || m.Containers[0].ImageRef != fx.rt.ContainerOf(t, "c2").Status.ImageRef || m.Containers[0].SizeBytes == 0 {
			t.Errorf("container entry %+v", m.Containers[0])
		}
		// The freeze's spans add up to it; each container's capture
		// carries CRIU's own account (the fake's: 4 pages, 2 ms written).
		if f := m.Freeze; f == nil || math.Abs(f.PauseSeconds+f.CaptureSeconds+f.ResumeSeconds-m.FrozenSeconds) > 1e-6 {
			t.Errorf("freeze %v s divided as %+v", m.FrozenSeconds, m.Freeze)
		}
		for _, c := range m.Containers {
			if c.Capture == nil || c.Capture.CRIUPagesWritten != 4 || c.Capture.CRIUMemwriteSeconds != 0.002 || c.Capture.CheckpointSeconds > c.DumpSeconds {
				t.Errorf("%s: capture times %+v (dump %v s)", c.Name, c.Capture, c.DumpSeconds)
			}
		}
		if len(m.Exited) != 1 || m.Exited[0].Name != "init" {
			t.Errorf("exited %+v, want the completed init container", m.Exited)
		}
		if m.Pod.Name != "pod1" || m.Pod.SandboxID != "sb1" || m.Kernel == "" || m.SizeBytes == 0 {
			t.Errorf("manifest %+v", m)
		}
		if got := ckpttest.Entries(t, fx.dir); !slices.Equal(got, []string{"containers", "manifest.json", "sandbox.json"}) {
			t.Errorf("checkpoint holds %v", got)
		}
		if got := ckpttest.Entries(t, filepath.Join(fx.dir, layout.ContainersDir)); !slices.Equal(got, []string{"app.tar", "sidecar.tar"}) {
			t.Errorf("containers/ holds %v (staging left?)", got)
		}
		checkArchive(t, filepath.Join(fx.dir, layout.ArchiveName("app")), "c1")
		if got := ckpttest.Entries(t, filepath.Join(fx.stateDir, "checkpoint")); len(got) != 0 {
			t.Errorf("state left behind: %v", got)
		}
	}
}

// Each container's writable-layer diff is taken while CRIU captures it, not
// after (both while the pod is paused); a diff that fails fails the call with
// every container resumed and nothing left.
func TestCheckpointPodDiffsBesideTheCapture(t *testing.T) {
	fx := newFixture(t)
	fx.rt.DumpAwaitsDiff = true
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 20*time.Second), ckpttest.CpReq(fx.dir, "c1", "c2")); err != nil {
		t.Fatal(err)
	}
	if _, err := layout.ReadManifest(fx.dir); err != nil {
		t.Fatal(err)
	}

	fx = newFixture(t)
	fx.rt.FailDiff = errors.New("fake: diff service down")
	_, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1", "c2"))
	if err == nil || !strings.Contains(err.Error(), "diff service down") {
		t.Fatalf("a failed diff: %v", err)
	}
	assertClean(t, fx, "after a failed diff")
}

// Every refusal happens before anything is paused or written, with a precise code.
func TestCheckpointPodRefusals(t *testing.T) {
	fx := newFixture(t)
	outside := t.TempDir()
	link := filepath.Join(fx.root, "link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	full := filepath.Join(fx.root, "full")
	os.Mkdir(full, 0o700)
	os.WriteFile(filepath.Join(full, "x"), nil, 0o600)
	fx.rt.AddSandboxWith(t, "shared", "shared", nil) // no Linux options: one PID namespace for the pod
	fx.rt.AddContainer(t, "shared", "s1", "one", runtimeapi.ContainerState_CONTAINER_RUNNING, 1, 0)
	fx.rt.AddContainer(t, "shared", "s2", "two", runtimeapi.ContainerState_CONTAINER_RUNNING, 2, 0)
	noDeadline := context.Background()
	cases := []struct {
		name string
		ctx  context.Context
		req  *runtimeapi.CheckpointPodRequest
		code codes.Code
	}{
		{"no deadline", noDeadline, ckpttest.CpReq(fx.dir, "c1"), codes.InvalidArgument},
		{"no containers", nil, ckpttest.CpReq(fx.dir), codes.InvalidArgument},
		{"duplicate", nil, ckpttest.CpReq(fx.dir, "c1", "c1"), codes.InvalidArgument},
		{"empty id", nil, ckpttest.CpReq(fx.dir, ""), codes.InvalidArgument},
		{"unknown option", nil, &runtimeapi.CheckpointPodRequest{PodSandboxId: "sb1", OutputPath: fx.dir, ContainerIds: []string{"c1"}, Options: map[string]string{"tcp-established": "true"}}, codes.InvalidArgument},
		{"bad option value", nil, &runtimeapi.CheckpointPodRequest{PodSandboxId: "sb1", OutputPath: fx.dir, ContainerIds: []string{"c1"}, Options: map[string]string{capture.OptionSequential: "yes please"}}, codes.InvalidArgument},
		{"not running", nil, ckpttest.CpReq(fx.dir, "c1", "i1"), codes.FailedPrecondition},
		{"created only", nil, ckpttest.CpReq(fx.dir, "x1"), codes.FailedPrecondition},
		{"other sandbox", nil, ckpttest.CpReq(fx.dir, "c1", "c3"), codes.InvalidArgument},
		{"unknown sandbox", nil, &runtimeapi.CheckpointPodRequest{PodSandboxId: "nope", OutputPath: fx.dir, ContainerIds: []string{"c1"}}, codes.NotFound},
		{"no sandbox id", nil, &runtimeapi.CheckpointPodRequest{OutputPath: fx.dir, ContainerIds: []string{"c1"}}, codes.InvalidArgument},
		{"not empty", nil, ckpttest.CpReq(full, "c1"), codes.FailedPrecondition},
		{"dot-dot", nil, ckpttest.CpReq(fx.root+"/cp1/../cp1", "c1"), codes.InvalidArgument},
		{"outside", nil, ckpttest.CpReq(outside, "c1"), codes.InvalidArgument},
		{"symlink escape", nil, ckpttest.CpReq(link, "c1"), codes.InvalidArgument},
		{"relative", nil, ckpttest.CpReq("cp1", "c1"), codes.InvalidArgument},
		{"root itself", nil, ckpttest.CpReq(fx.root, "c1"), codes.InvalidArgument},
		{"missing", nil, ckpttest.CpReq(filepath.Join(fx.root, "nope"), "c1"), codes.InvalidArgument},
		{"shared PID namespace", nil, &runtimeapi.CheckpointPodRequest{PodSandboxId: "shared", OutputPath: fx.dir, ContainerIds: []string{"s1", "s2"}}, codes.FailedPrecondition},
	}
	for _, c := range cases {
		ctx := c.ctx
		if ctx == nil {
			ctx = ckpttest.CtxT(t, 5*time.Second)
		}
		_, err := fx.cap.CheckpointPod(ctx, c.req)
		if status.Code(proxy.Status(err)) != c.code {
			t.Errorf("%s: got %v, want %s", c.name, err, c.code)
		}
		if fx.rt.Tasks.Pauses() != 0 || len(fx.rt.DumpSeen) != 0 {
			t.Fatalf("%s: paused or captured before refusing", c.name)
		}
		if got := ckpttest.Entries(t, fx.dir); len(got) != 0 {
			t.Fatalf("%s: wrote %v", c.name, got)
		}
		if got := ckpttest.Entries(t, outside); len(got) != 0 {
			t.Fatalf("%s: wrote outside the root: %v", c.name, got)
		}
	}
}

// A capture that fails: every container resumed, nothing left in the output.
func TestCheckpointPodSecondCaptureFails(t *testing.T) {
	for _, sequential := range []bool{false, true} {
		fx := newFixture(t)
		fx.rt.FailDump["c1"] = status.Error(codes.Unknown, "criu failed: (00.012) Error (criu/mem.c:123)")
		req := ckpttest.CpReq(fx.dir, "c2", "c1")
		if sequential {
			req.Options = map[string]string{capture.OptionSequential: "true"}
		}
		_, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), req)
		if status.Code(proxy.Status(err)) != codes.Internal {
			t.Fatalf("got %v, want Internal", err)
		}
		assertClean(t, fx, "after a failed capture")
	}
}

func TestCheckpointPodPauseFails(t *testing.T) {
	fx := newFixture(t)
	fx.rt.Tasks.FailPause("c1")
	_, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c2", "c1"))
	if status.Code(proxy.Status(err)) != codes.Internal {
		t.Fatalf("got %v", err)
	}
	assertClean(t, fx, "after a failed pause")
}

// runc's freezer may give up while a task is busy in the kernel; the pause is
// tried again, and the capture goes on once it holds.
func TestCheckpointPodRetriesAFreezeThatDidNotHold(t *testing.T) {
	fx := newFixture(t)
	fx.rt.Tasks.FailFreeze("c1", 2)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c2", "c1")); err != nil {
		t.Fatalf("a pause that held on its third try: %v", err)
	}
	if p := fx.rt.Tasks.AnyPaused(); len(p) != 0 {
		t.Fatalf("paused after the checkpoint: %v", p)
	}
}

// A freeze that never holds fails the checkpoint after the retries, with
// every container running again.
func TestCheckpointPodFreezeNeverHolds(t *testing.T) {
	fx := newFixture(t)
	fx.rt.Tasks.FailFreeze("c1", 100)
	_, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c2", "c1"))
	if status.Code(proxy.Status(err)) != codes.Internal || !strings.Contains(err.Error(), "unable to freeze") {
		t.Fatalf("got %v, want Internal naming the freeze", err)
	}
	assertClean(t, fx, "after a freeze that never held")
}

func TestRetentionKeepsNewestManagedPerPod(t *testing.T) {
	fx := newFixture(t)
	fx.store.cfg.MaxPerPod = 2
	var dirs []string
	for i := 0; i < 4; i++ {
		d := filepath.Join(fx.root, "m"+string(rune('a'+i)))
		os.Mkdir(d, 0o700)
		_, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), &runtimeapi.CheckpointPodRequest{PodSandboxId: "sb1", OutputPath: d,
			ContainerIds: []string{"c1"}, Options: map[string]string{capture.OptionManaged: "true"}})
		if err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
		time.Sleep(2 * time.Millisecond)
	}
	// One unmanaged checkpoint of the same pod (the caller's) is never removed.
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1")); err != nil {
		t.Fatal(err)
	}
	for i, d := range dirs {
		_, err := os.Stat(d)
		if kept := err == nil; kept != (i >= 2) {
			t.Errorf("%s kept=%v", filepath.Base(d), kept)
		}
	}
	if _, err := layout.ReadManifest(fx.dir); err != nil {
		t.Errorf("unmanaged checkpoint removed: %v", err)
	}
	// A total the unmanaged one alone nearly fills: admitted (estimated
	// at 0 bytes), then retention removes every older managed one.
	um, _ := layout.ReadManifest(fx.dir)
	fx.store.overhead = 0
	fx.store.cfg.MaxPerPod, fx.store.cfg.MaxTotalBytes = 0, um.SizeBytes+1
	d := filepath.Join(fx.root, "last")
	os.Mkdir(d, 0o700)
	if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), &runtimeapi.CheckpointPodRequest{PodSandboxId: "sb1", OutputPath: d,
		ContainerIds: []string{"c1"}, Options: map[string]string{capture.OptionManaged: "true"}}); err != nil {
		t.Fatal(err)
	}
	list, _ := List(fx.root)
	var left []string
	for _, c := range list {
		left = append(left, c.Name)
	}
	if !slices.Equal(left, []string{"cp1", "last"}) {
		t.Errorf("after max_total_bytes: %v, want the unmanaged and the newest", left)
	}
}

func TestConfine(t *testing.T) {
	root := t.TempDir()
	in := filepath.Join(root, "a")
	os.Mkdir(in, 0o700)
	os.Symlink(in, filepath.Join(root, "inlink"))
	os.Symlink("/", filepath.Join(root, "up"))
	if got, err := layout.Confine(root, filepath.Join(root, "inlink")); err != nil || got != in {
		t.Errorf("in-root symlink: %q %v", got, err)
	}
	for _, p := range []string{"", "a", root, root + "/../x", root + "/up", root + "/up/etc", "/etc", root + "/a/../../x", root + "/missing", root + "\x00"} {
		if _, err := layout.Confine(root, p); err == nil {
			t.Errorf("%q accepted", p)
		}
	}
	if _, err := layout.Confine(root, "/nonexistent/x"); !errors.Is(err, layout.ErrOutsideRoot) {
		t.Errorf("a missing path outside the root must be refused as outside, got %v", err)
	}
}

// checkArchive reads an archive as containerd's restore does: the files it
// needs, status.dump decoded with encoding/json into the CRI type.
func checkArchive(t *testing.T, path, id string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := map[string]string{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[h.Name] = string(b)
	}
	for _, n := range []string{"config.dump", "spec.dump", "status.dump", "rootfs-diff.tar", "checkpoint/", "checkpoint/pages-1.img", "dump.log"} {
		if _, ok := got[n]; !ok {
			t.Errorf("archive lacks %s (has %v)", n, slices.Sorted(maps.Keys(got)))
		}
	}
	var cfg struct {
		RootfsImageRef string `json:"rootfsImageRef"`
	}
	if err := json.Unmarshal([]byte(got["config.dump"]), &cfg); err != nil || !layout.IsImageID(cfg.RootfsImageRef) {
		t.Errorf("config.dump names the base image %q (%v), want an image ID", cfg.RootfsImageRef, err)
	}
	var st runtimeapi.ContainerStatus
	if err := json.Unmarshal([]byte(got["status.dump"]), &st); err != nil || st.Id != id || len(st.Annotations) == 0 {
		t.Errorf("status.dump: %v %+v", err, &st)
	}
	if !strings.HasPrefix(got["checkpoint/pages-1.img"], "criu images of "+id+",") || got["rootfs-diff.tar"] != string(ckpttest.FakeLayer(id)) {
		t.Errorf("images or diff not carried into the archive")
	}
}

// An archive names its base image by image ID, the same on every node that
// has the image; the runtime's reference (a repository digest once the image
// came from a registry) only when the ID is not known.
func TestRootfsImageRef(t *testing.T) {
	id := "sha256:" + strings.Repeat("a", 64)
	repo := "127.0.0.1:5000/x/busybox@sha256:" + strings.Repeat("b", 64)
	for _, tc := range []struct{ id, ref, want string }{
		{id, repo, id},
		{"", repo, repo},
		{"sha256:ABC", repo, repo},
		{strings.Repeat("a", 64), id, id},
	} {
		if got := layout.RootfsImageRef(tc.id, tc.ref); got != tc.want {
			t.Errorf("layout.RootfsImageRef(%q, %q) = %q, want %q", tc.id, tc.ref, got, tc.want)
		}
	}
}
