package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/ociartifact"
)

// diskCfg is a counter that first writes 160 MiB of random data into its
// writable layer, so its checkpoint archive is large and incompressible.
func diskCfg(name string) *runtimeapi.ContainerConfig {
	c := counterCfg(name)
	c.Command = []string{"sh", "-c", "dd if=/dev/urandom of=/tmp/blob bs=1048576 count=160 2>/dev/null; " + counterCmd[2]}
	return c
}

// shimRun runs the built binary with the node's config; it returns stdout,
// stderr, and the peak resident memory of the process in bytes.
func shimRun(t *testing.T, args ...string) (string, string, int64) {
	t.Helper()
	var stdout, stderr strings.Builder
	cmd := exec.Command(node.env["SHIM_BIN"], append(args, "--config", node.env["SHIM_CONFIG"])...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("cri-shim %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10
}

func fileSHA(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func blobSum(t *testing.T, rt runtimeapi.RuntimeServiceClient, id string) string {
	t.Helper()
	r, err := rt.ExecSync(ctxT(t, time.Minute), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: []string{"md5sum", "/tmp/blob"}, Timeout: 30})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("md5sum in %s: %v %s", id, err, r.GetStderr())
	}
	return strings.Fields(string(r.Stdout))[0]
}

// A pod checkpointed on the node, pushed to the loopback registry, pulled
// back under a new name and restored: its counters go on from where they
// were and its writable layer is the checkpointed one; the registry holds
// the documented index; checkpointctl reads a pulled container archive; the
// CLI's memory stays far below the checkpoint's size (streamed).
func TestCheckpointPushPullRestore(t *testing.T) {
	needNode(t)
	pauseKubelet(t)
	addr := startRegistry(t)
	rt := runtimeClient(t, node.env["SHIM_SOCK"])
	src, ids, srcLogs := startPod(t, rt, "oci-src", counterCfg("a"), diskCfg("disk"))
	eventually(t, 60*time.Second, "counters running", func() error {
		for _, c := range []string{"a", "disk"} {
			if lastCounter(t, filepath.Join(srcLogs, c+".log")) < 20 {
				return fmt.Errorf("%s not at 20 yet", c)
			}
		}
		return nil
	})
	sum := blobSum(t, rt, ids["disk"])
	dir := newCheckpointDir(t, "e2e-oci-src")
	before := map[string]int{}
	for _, c := range []string{"a", "disk"} {
		before[c] = lastCounter(t, filepath.Join(srcLogs, c+".log"))
	}
	if _, err := rt.CheckpointPod(ctxT(t, 2*time.Minute), &runtimeapi.CheckpointPodRequest{
		PodSandboxId: src, OutputPath: dir, ContainerIds: []string{ids["a"], ids["disk"]}}); err != nil {
		t.Fatal(err)
	}
	m, err := layout.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	removePod(rt, src)

	ref := addr + "/e2e/oci-pod:v1"
	type result struct{ Ref, Digest, Name, Dir string }
	var pushed, again, pulled result
	t0 := time.Now()
	out, _, pushRSS := shimRun(t, "checkpoint", "push", "e2e-oci-src", ref, "--plain-http", "-o", "json")
	pushTook := time.Since(t0)
	if err := json.Unmarshal([]byte(out), &pushed); err != nil || !strings.HasPrefix(pushed.Digest, "sha256:") {
		t.Fatalf("push -o json: %v: %q", err, out)
	}
	t0 = time.Now()
	out, _, _ = shimRun(t, "checkpoint", "push", "e2e-oci-src", ref, "--plain-http", "-o", "json")
	againTook := time.Since(t0)
	if err := json.Unmarshal([]byte(out), &again); err != nil || again.Digest != pushed.Digest {
		t.Fatalf("second push: %v: %q, first %s", err, out, pushed.Digest)
	}
	t.Logf("push of %d MiB: %.2fs, peak RSS %d MiB; second push (nothing to upload): %.2fs; %s",
		m.SizeBytes>>20, pushTook.Seconds(), pushRSS>>20, againTook.Seconds(), pushed.Ref)

	// The registry holds the index with the documented annotations and
	// container images in checkpointctl's format.
	r, err := name.ParseReference(pushed.Ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(r)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{ociartifact.AnnotationFormat: "pod-checkpoint", ociartifact.AnnotationPodName: "oci-src",
		ociartifact.AnnotationPodNamespace: "e2e", ociartifact.AnnotationContainers: "a,disk"} {
		if im.Annotations[k] != want {
			t.Errorf("index annotation %s = %q, want %q", k, im.Annotations[k], want)
		}
	}
	images := map[string]string{} // container: its checkpoint image by digest
	for _, d := range im.Manifests {
		if d.Annotations[ociartifact.AnnotationRole] != ociartifact.RoleContainer {
			continue
		}
		images[d.Annotations[ociartifact.AnnotationContainer]] = r.Context().Digest(d.Digest.String()).String()
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		mf, err := img.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		if c := d.Annotations[ociartifact.AnnotationContainer]; mf.Annotations["org.criu.checkpoint.container.name"] != c ||
			mf.Annotations["io.kubernetes.cri-o.annotations.checkpoint.name"] != c {
			t.Errorf("container image %s: annotations %v", c, mf.Annotations)
		}
	}

	t0 = time.Now()
	out, _, pullRSS := shimRun(t, "checkpoint", "pull", pushed.Ref, "e2e-oci-copy", "--plain-http", "-o", "json")
	pullTook := time.Since(t0)
	copyDir := filepath.Join(node.env["CHECKPOINTS"], "e2e-oci-copy")
	t.Cleanup(func() { os.RemoveAll(copyDir) })
	if err := json.Unmarshal([]byte(out), &pulled); err != nil || pulled.Dir != copyDir || pulled.Digest != pushed.Digest {
		t.Fatalf("pull -o json: %v: %q", err, out)
	}
	t.Logf("pull of %d MiB: %.2fs, peak RSS %d MiB", m.SizeBytes>>20, pullTook.Seconds(), pullRSS>>20)
	for _, rel := range []string{layout.ManifestFile, layout.SandboxFile, layout.ArchiveName("a"), layout.ArchiveName("disk")} {
		if a, b := fileSHA(t, filepath.Join(dir, rel)), fileSHA(t, filepath.Join(copyDir, rel)); a != b {
			t.Errorf("%s differs after push and pull", rel)
		}
	}
	if limit := m.SizeBytes / 2; pushRSS > limit || pullRSS > limit {
		t.Errorf("peak RSS push %d MiB, pull %d MiB for a %d MiB checkpoint: not streamed", pushRSS>>20, pullRSS>>20, m.SizeBytes>>20)
	}

	// checkpointctl reads a pulled container archive.
	for _, args := range [][]string{{"show", filepath.Join(copyDir, layout.ArchiveName("a"))}, {"inspect", filepath.Join(copyDir, layout.ArchiveName("disk"))}} {
		b, err := exec.Command(bin("checkpointctl"), args...).CombinedOutput()
		if err != nil {
			t.Fatalf("checkpointctl %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		t.Logf("checkpointctl %s:\n%s", args[0], b)
	}

	// Restore the pulled copy and watch it go on.
	dstLogs := filepath.Join(t.TempDir(), "logs")
	os.MkdirAll(dstLogs, 0o755)
	imageNames := imagesSnapshot(t) // after the push and the pull
	rr, err := rt.RestorePod(ctxT(t, 2*time.Minute), &runtimeapi.RestorePodRequest{
		CheckpointPath:   copyDir,
		Config:           sandboxCfg("oci-dst", "oci-dst-uid", dstLogs),
		ContainerConfigs: []*runtimeapi.ContainerConfig{counterCfg("a"), diskCfg("disk")},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removePod(rt, rr.PodSandboxId) })
	t0 = time.Now()
	restored := map[string]string{}
	for _, rc := range rr.RestoredContainers {
		if _, err := rt.StartContainer(ctxT(t, 2*time.Minute), &runtimeapi.StartContainerRequest{ContainerId: rc.ContainerId}); err != nil {
			t.Fatalf("start restored %s: %v", rc.Name, err)
		}
		restored[rc.Name] = rc.ContainerId
	}
	time.Sleep(time.Second)
	for _, c := range []string{"a", "disk"} {
		got, first := countersSince(t, filepath.Join(dstLogs, c+".log"), t0)
		if first < before[c] {
			t.Fatalf("%s: the restored process logged %d first; it was at %d before the checkpoint", c, first, before[c])
		}
		for i := 1; i < len(got); i++ {
			if got[i] != got[i-1]+1 {
				t.Fatalf("%s: restored counter jumps from %d to %d", c, got[i-1], got[i])
			}
		}
		t.Logf("%s: at %d before the checkpoint; restored from the pulled copy, went on from %d to %d", c, before[c], first, got[len(got)-1])
	}
	if got := blobSum(t, rt, restored["disk"]); got != sum {
		t.Fatalf("restored writable layer: /tmp/blob md5 %s, checkpointed %s", got, sum)
	}
	assertNoImageChange(t, imageNames, "RestorePod of the pulled copy and the start of its containers")

	// containerd's CRI takes one container's checkpoint image alone, pulled
	// from the registry by digest (containerd v2.2
	// container_checkpoint_linux.go: checkIfCheckpointOCIImage,
	// CRImportCheckpoint): the images interoperate with containerd's own
	// restore where it exists. Its start asks the pod's runtime for a
	// restore of the imported images, and that runtime is cri-shim's
	// runtime shim, which restores only checkpoints cri-shim staged and
	// checked: the start is refused and the image's processes never run.
	// cri-shim does not use that path (docs/restore-route.md); 2.3 has it
	// off by default and 2.4 removed it.
	if !strings.HasPrefix(node.env["CONTAINERD_VERSION"], "2.2.") {
		t.Logf("containerd %s has no restore through CreateContainer: containerd's own restore of a checkpoint image is checked on 2.2 only", node.env["CONTAINERD_VERSION"])
		return
	}
	imgs := runtimeapi.NewImageServiceClient(dial(t, node.env["SHIM_SOCK"]))
	if _, err := imgs.PullImage(ctxT(t, 2*time.Minute), &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: images["a"]}}); err != nil {
		t.Fatalf("pull the checkpoint image of a: %v", err)
	}
	t.Cleanup(func() {
		imgs.RemoveImage(ctxT(t, time.Minute), &runtimeapi.RemoveImageRequest{Image: &runtimeapi.ImageSpec{Image: images["a"]}})
	})
	soloLogs := filepath.Join(t.TempDir(), "logs")
	os.MkdirAll(soloLogs, 0o755)
	soloCfg := sandboxCfg("oci-solo", "oci-solo-uid", soloLogs)
	sb, err := rt.RunPodSandbox(ctxT(t, time.Minute), &runtimeapi.RunPodSandboxRequest{Config: soloCfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removePod(rt, sb.PodSandboxId) })
	c := counterCfg("a")
	c.Image = &runtimeapi.ImageSpec{Image: images["a"]}
	cr, err := rt.CreateContainer(ctxT(t, 2*time.Minute), &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, Config: c, SandboxConfig: soloCfg})
	if err != nil && strings.Contains(err.Error(), "checkpoint restore via CreateContainer is disabled by configuration") {
		// containerd 2.2's default (enable_experimental_restore_via_create
		// off, internal/cri/server/container_checkpoint_linux.go,
		// CRImportCheckpoint): containerd refuses it itself, before the
		// runtime shim is asked; its refusal of an unmarked restore is
		// internal/runtimeshim's TestUnmarkedCheckpointIsRefused.
		t.Logf("containerd %s refuses its own restore of %s by default: %v", node.env["CONTAINERD_VERSION"], images["a"], err)
		sbs, lerr := rt.ListContainers(ctxT(t, 30*time.Second), &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sb.PodSandboxId}})
		if lerr != nil || len(sbs.Containers) != 0 {
			t.Fatalf("containers of the refused restore: %v %v", sbs, lerr)
		}
		return
	}
	if err != nil {
		t.Fatalf("containerd's CRI did not take the checkpoint image: %v", err)
	}
	_, err = rt.StartContainer(ctxT(t, 2*time.Minute), &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId})
	if err == nil || !strings.Contains(err.Error(), "restores only checkpoints cri-shim staged and checked") {
		t.Fatalf("containerd's own restore of %s through cri-shim's runtime shim: %v, want it refused", images["a"], err)
	}
	t.Logf("containerd's own restore of %s refused by the runtime shim: %v", images["a"], err)
	st, err := rt.ContainerStatus(ctxT(t, 30*time.Second), &runtimeapi.ContainerStatusRequest{ContainerId: cr.ContainerId})
	if err == nil && st.GetStatus().GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("the container of the refused restore is running")
	}
}
