package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/layout"
)

const busybox = "docker.io/library/busybox:cri-shim"

// counterCmd prints an increasing counter, one line every 100 ms.
var counterCmd = []string{"sh", "-c", "i=0; while true; do echo $i; i=$((i+1)); sleep 0.1; done"}

func sandboxCfg(name, uid, logDir string) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "e2e", Uid: uid},
		LogDirectory: logDir,
		Labels:       map[string]string{"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "e2e", "io.kubernetes.pod.uid": uid},
		// One PID namespace per container, as the kubelet asks (the CRI's
		// zero value would be one per pod).
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER}}},
	}
}

func counterCfg(name string) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata:    &runtimeapi.ContainerMetadata{Name: name},
		Image:       &runtimeapi.ImageSpec{Image: busybox},
		Command:     counterCmd,
		LogPath:     name + ".log",
		Labels:      map[string]string{"io.kubernetes.container.name": name},
		Annotations: map[string]string{"io.kubernetes.container.restartCount": "0", "e2e": "checkpoint"},
		Linux: &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER}}},
	}
}

// counterPod runs a sandbox with a counter container per name, through rt.
func counterPod(t testing.TB, rt runtimeapi.RuntimeServiceClient, name string, ctrs ...string) (string, map[string]string, string) {
	t.Helper()
	var cfgs []*runtimeapi.ContainerConfig
	for _, c := range ctrs {
		cfgs = append(cfgs, counterCfg(c))
	}
	return startPod(t, rt, name, cfgs...)
}

// startPod runs a sandbox with the given containers through rt; it returns
// the sandbox ID, the container IDs by name and the log directory.
func startPod(t testing.TB, rt runtimeapi.RuntimeServiceClient, name string, cfgs ...*runtimeapi.ContainerConfig) (string, map[string]string, string) {
	t.Helper()
	logDir := filepath.Join(t.TempDir(), "logs")
	os.MkdirAll(logDir, 0o755)
	cfg := sandboxCfg(name, name+"-uid", logDir)
	sb, err := rt.RunPodSandbox(ctxT(t, time.Minute), &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removePod(rt, sb.PodSandboxId) })
	ids := map[string]string{}
	for _, c := range cfgs {
		cr, err := rt.CreateContainer(ctxT(t, time.Minute), &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, Config: c, SandboxConfig: cfg})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rt.StartContainer(ctxT(t, time.Minute), &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId}); err != nil {
			t.Fatal(err)
		}
		ids[c.Metadata.Name] = cr.ContainerId
	}
	return sb.PodSandboxId, ids, logDir
}

func removePod(rt runtimeapi.RuntimeServiceClient, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
	_, _ = rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
}

// counters reads the numbers a counter container logged (CRI log format).
func counters(t testing.TB, path string) []int {
	out, _ := countersSince(t, path, time.Time{})
	return out
}

// countersSince returns every logged number, and the first one logged after since.
func countersSince(t testing.TB, path string, since time.Time) (all []int, firstAfter int) {
	t.Helper()
	firstAfter = -1
	f, err := os.Open(path)
	if err != nil {
		return nil, -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 {
			continue
		}
		n, err := strconv.Atoi(fs[len(fs)-1])
		if err != nil {
			continue
		}
		all = append(all, n)
		if ts, err := time.Parse(time.RFC3339Nano, fs[0]); err == nil && firstAfter < 0 && ts.After(since) {
			firstAfter = n
		}
	}
	return all, firstAfter
}

// countersLoggedSince waits for the counter logged at path to show a number
// written after since, then returns what countersSince does. path is asked
// anew at each try (a pod's log file appears with its container).
func countersLoggedSince(t testing.TB, path func() string, since time.Time) (all []int, firstAfter int) {
	t.Helper()
	eventually(t, 30*time.Second, "a counter logged after "+since.Format(time.RFC3339Nano), func() error {
		if all, firstAfter = countersSince(t, path(), since); firstAfter < 0 {
			return fmt.Errorf("%d numbers logged at %q, none after it", len(all), path())
		}
		return nil
	})
	return all, firstAfter
}

func lastCounter(t testing.TB, path string) int {
	c := counters(t, path)
	if len(c) == 0 {
		return -1
	}
	return c[len(c)-1]
}

// newCheckpointDir makes an empty directory under the shim's checkpoint root.
func newCheckpointDir(t testing.TB, name string) string {
	t.Helper()
	dir := filepath.Join(node.env["CHECKPOINTS"], name)
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// taskStates returns containerd's task status per container ID (RUNNING, PAUSED...).
func taskStates(t testing.TB) map[string]string {
	t.Helper()
	out, err := exec.Command(bin("ctr"), "--address", node.env["CONTAINERD_SOCK"], "-n", "k8s.io", "tasks", "ls").CombinedOutput()
	if err != nil {
		t.Fatalf("ctr tasks ls: %v: %s", err, out)
	}
	st := map[string]string{}
	for _, l := range strings.Split(string(out), "\n")[1:] {
		if fs := strings.Fields(l); len(fs) >= 3 {
			st[fs[0]] = fs[2]
		}
	}
	return st
}

func assertRunning(t testing.TB, ids map[string]string) {
	t.Helper()
	st := taskStates(t)
	for n, id := range ids {
		if st[id] != "RUNNING" {
			t.Fatalf("container %s is %q in containerd, want RUNNING", n, st[id])
		}
	}
}

// Acceptance 1: two counters checkpointed through the CRI call on the shim
// socket, restored into a new sandbox, resume from the checkpointed values
// while the source pod keeps running.
func TestCheckpointPodAndRestorePodThroughCRI(t *testing.T) {
	needNode(t)
	pauseKubelet(t)
	rt := runtimeClient(t, node.env["SHIM_SOCK"])
	src, ids, srcLogs := counterPod(t, rt, "cp-src", "a", "b")
	// Let them count to 30 first: a restored process then logs values a
	// fresh start could not reach in the time the test watches it.
	eventually(t, 30*time.Second, "counters running", func() error {
		for _, c := range []string{"a", "b"} {
			if lastCounter(t, filepath.Join(srcLogs, c+".log")) < 30 {
				return fmt.Errorf("%s not at 30 yet", c)
			}
		}
		return nil
	})
	before := map[string]int{}
	for _, c := range []string{"a", "b"} {
		before[c] = lastCounter(t, filepath.Join(srcLogs, c+".log"))
	}
	dir := newCheckpointDir(t, "e2e-acc1")
	start := time.Now()
	_, err := rt.CheckpointPod(ctxT(t, time.Minute), &runtimeapi.CheckpointPodRequest{
		PodSandboxId: src, OutputPath: dir, ContainerIds: []string{ids["a"], ids["b"]}})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	assertRunning(t, ids)
	m, err := layout.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CheckpointPod: %d containers, %d bytes, %.3fs (paused %.3fs), CRIU %s, kernel %s",
		len(m.Containers), m.SizeBytes, took.Seconds(), m.FrozenSeconds, m.CRIUVersion, m.Kernel)

	dstLogs := filepath.Join(t.TempDir(), "logs")
	os.MkdirAll(dstLogs, 0o755)
	images := imagesSnapshot(t)
	rr, err := rt.RestorePod(ctxT(t, time.Minute), &runtimeapi.RestorePodRequest{
		CheckpointPath:   dir,
		Config:           sandboxCfg("cp-dst", "cp-dst-uid", dstLogs),
		ContainerConfigs: []*runtimeapi.ContainerConfig{counterCfg("a"), counterCfg("b")},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removePod(rt, rr.PodSandboxId) })
	if rr.PodSandboxId == src || len(rr.RestoredContainers) != 2 {
		t.Fatalf("restore answered %v", rr)
	}
	for _, rc := range rr.RestoredContainers {
		st, err := rt.ContainerStatus(ctxT(t, 10*time.Second), &runtimeapi.ContainerStatusRequest{ContainerId: rc.ContainerId})
		if err != nil {
			t.Fatal(err)
		}
		if st.Status.State != runtimeapi.ContainerState_CONTAINER_CREATED {
			t.Fatalf("restored %s is %s before StartContainer", rc.Name, st.Status.State)
		}
	}
	t0 := time.Now()
	for _, rc := range rr.RestoredContainers {
		if _, err := rt.StartContainer(ctxT(t, time.Minute), &runtimeapi.StartContainerRequest{ContainerId: rc.ContainerId}); err != nil {
			t.Fatalf("start restored %s: %v", rc.Name, err)
		}
	}
	t.Logf("StartContainer of both restored containers: %.3fs", time.Since(t0).Seconds())
	for _, c := range []string{"a", "b"} {
		got, first := countersLoggedSince(t, func() string { return filepath.Join(dstLogs, c+".log") }, t0)
		if first < before[c] {
			t.Fatalf("%s: the restored process logged %d first; the counter was at %d before the checkpoint (started from scratch?)", c, first, before[c])
		}
		// The restored log is the source's up to the cut, then the restored
		// process's own lines: one unbroken sequence, no restart from 0.
		for i := 1; i < len(got); i++ {
			if got[i] != got[i-1]+1 {
				t.Fatalf("%s: restored counter jumps from %d to %d at line %d (a restart from 0 would show here)", c, got[i-1], got[i], i)
			}
		}
		t.Logf("%s: at %d before the checkpoint; the restored process went on from %d to %d", c, before[c], first, got[len(got)-1])
	}
	assertNoImageChange(t, images, "RestorePod and the start of the restored containers")
	// The source kept running.
	now := lastCounter(t, filepath.Join(srcLogs, "a.log"))
	eventually(t, 10*time.Second, "the source pod counting on", func() error {
		if after := lastCounter(t, filepath.Join(srcLogs, "a.log")); after <= now {
			return fmt.Errorf("source pod stopped counting (%d then %d)", now, after)
		}
		return nil
	})
	assertRunning(t, ids)
}

// Acceptance 3: each failure a precise gRPC error, nothing frozen, nothing
// half-created left behind.
func TestCheckpointFailurePathsOnTheRealStack(t *testing.T) {
	needNode(t)
	pauseKubelet(t)
	rt := runtimeClient(t, node.env["SHIM_SOCK"])
	src, ids, _ := counterPod(t, rt, "cp-fail", "a", "b")
	_, oids, _ := counterPod(t, rt, "cp-other", "c")
	// A created, never started container in the source pod.
	cr, err := rt.CreateContainer(ctxT(t, time.Minute), &runtimeapi.CreateContainerRequest{PodSandboxId: src, Config: counterCfg("idle"),
		SandboxConfig: sandboxCfg("cp-fail", "cp-fail-uid", t.TempDir())})
	if err != nil {
		t.Fatal(err)
	}
	dir := newCheckpointDir(t, "e2e-fail")
	full := newCheckpointDir(t, "e2e-full")
	os.WriteFile(filepath.Join(full, "x"), []byte("x"), 0o600)
	outside := t.TempDir()
	link := filepath.Join(node.env["CHECKPOINTS"], "e2e-link")
	os.Remove(link)
	os.Symlink(outside, link)
	t.Cleanup(func() { os.Remove(link) })
	req := func(dir string, opts map[string]string, cids ...string) *runtimeapi.CheckpointPodRequest {
		return &runtimeapi.CheckpointPodRequest{PodSandboxId: src, OutputPath: dir, ContainerIds: cids, Options: opts}
	}
	cases := []struct {
		name string
		req  *runtimeapi.CheckpointPodRequest
		code codes.Code
	}{
		{"non-running container", req(dir, nil, ids["a"], cr.ContainerId), codes.FailedPrecondition},
		{"container of another pod", req(dir, nil, ids["a"], oids["c"]), codes.InvalidArgument},
		{"non-empty output", req(full, nil, ids["a"]), codes.FailedPrecondition},
		{"unknown option", req(dir, map[string]string{"tcp-established": "true"}, ids["a"]), codes.InvalidArgument},
		{"escape with ..", req(node.env["CHECKPOINTS"]+"/../cri-shim", nil, ids["a"]), codes.InvalidArgument},
		{"symlink escape", req(link, nil, ids["a"]), codes.InvalidArgument},
		{"absolute escape", req(outside, nil, ids["a"]), codes.InvalidArgument},
	}
	for _, c := range cases {
		_, err := rt.CheckpointPod(ctxT(t, time.Minute), c.req)
		if status.Code(err) != c.code {
			t.Errorf("%s: got %v, want %s", c.name, err, c.code)
		} else {
			t.Logf("%s: %s", c.name, status.Convert(err).Message())
		}
		assertRunning(t, ids)
		if ents, _ := os.ReadDir(dir); len(ents) > 0 {
			t.Fatalf("%s: left %d entries in the output", c.name, len(ents))
		}
		if ents, _ := os.ReadDir(outside); len(ents) > 0 {
			t.Fatalf("%s: wrote outside the root", c.name)
		}
	}

	// Mismatched container names on restore: nothing created.
	if _, err := rt.CheckpointPod(ctxT(t, time.Minute), req(dir, nil, ids["a"], ids["b"])); err != nil {
		t.Fatal(err)
	}
	pods := func() int {
		r, err := rt.ListPodSandbox(ctxT(t, 10*time.Second), &runtimeapi.ListPodSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return len(r.Items)
	}
	n := pods()
	images := imagesSnapshot(t)
	for name, cfgs := range map[string][]*runtimeapi.ContainerConfig{
		"missing b": {counterCfg("a")},
		"extra c":   {counterCfg("a"), counterCfg("b"), counterCfg("c")},
		"renamed b": {counterCfg("a"), counterCfg("bb")},
	} {
		_, err := rt.RestorePod(ctxT(t, time.Minute), &runtimeapi.RestorePodRequest{CheckpointPath: dir,
			Config: sandboxCfg("cp-bad", "cp-bad-uid", t.TempDir()), ContainerConfigs: cfgs})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("restore with %s: %v", name, err)
		}
	}
	for name, p := range map[string]string{"..": node.env["CHECKPOINTS"] + "/../cri-shim", "symlink": link, "outside": outside} {
		_, err := rt.RestorePod(ctxT(t, time.Minute), &runtimeapi.RestorePodRequest{CheckpointPath: p,
			Config: sandboxCfg("cp-bad", "cp-bad-uid", t.TempDir()), ContainerConfigs: []*runtimeapi.ContainerConfig{counterCfg("a"), counterCfg("b")}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("restore from %s: %v", name, err)
		}
	}
	if pods() != n {
		t.Fatalf("a refused restore left a sandbox")
	}
	assertNoImageChange(t, images, "the refused RestorePod calls")

	// A deadline that expires mid-capture (pausing takes ~0.1 s, CRIU ~0.4 s
	// on a busy machine): a shorter one when the capture beat it (a quiet
	// machine captures these two counters in under 450 ms).
	var dl string
	for i, d := range []time.Duration{450 * time.Millisecond, 250 * time.Millisecond, 120 * time.Millisecond} {
		dl = newCheckpointDir(t, fmt.Sprintf("e2e-deadline-%d", i))
		ctx, cancel := context.WithTimeout(context.Background(), d)
		start := time.Now()
		_, err = rt.CheckpointPod(ctx, req(dl, nil, ids["a"], ids["b"]))
		cancel()
		if err == nil && i < 2 {
			t.Logf("the capture ended within %s; again with a shorter deadline", d)
			continue
		}
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("deadline of %s mid-capture: %v", d, err)
		}
		t.Logf("deadline of %s mid-capture answered after %s", d, time.Since(start).Round(time.Millisecond))
		break
	}
	// Once containerd's captures end, the shim pauses and resumes each
	// container once more (a capture that ended after the first resume may
	// have frozen it again) and removes its record (afterAbandoned): a
	// container may show PAUSING for that moment. Wait for the record to go,
	// then nothing may be paused, and nothing may be left behind.
	records := filepath.Join(node.env["NODE_DATA"], "cri-shim", "checkpoint")
	eventually(t, 15*time.Second, "the abandoned capture's clean-up", func() error {
		if ents, _ := os.ReadDir(records); len(ents) > 0 {
			return fmt.Errorf("%d records left in the state dir", len(ents))
		}
		return nil
	})
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		assertRunning(t, ids)
	}
	if ents, _ := os.ReadDir(dl); len(ents) > 0 {
		t.Fatalf("abandoned capture left %d entries", len(ents))
	}
}
