package e2e

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// memCfg is a container holding memMiB of random memory (memScript), which
// prints its md5 sum when /tmp/sum appears.
func memCfg(name string) *runtimeapi.ContainerConfig {
	c := counterCfg(name)
	c.Command = []string{"sh", "-c", memScript()}
	return c
}

// tamperArchive rewrites the dump files of a container archive as a hostile
// checkpoint would: config.dump names another image, spec.dump adds a bind
// mount of the host's root, a device and annotations, status.dump another
// image, annotations and labels. The CRIU images and the rest are kept.
func tamperArchive(t testing.TB, archive string) {
	t.Helper()
	edit := map[string]func(map[string]any){
		"config.dump": func(m map[string]any) {
			m["rootfsImageName"] = "docker.io/library/evil:latest"
			m["rootfsImageRef"] = "docker.io/library/evil@sha256:" + strings.Repeat("e", 64)
			m["rootfsImage"] = "docker.io/library/evil:latest"
		},
		"spec.dump": func(m map[string]any) {
			mounts, _ := m["mounts"].([]any)
			m["mounts"] = append(mounts, map[string]any{"destination": "/host", "source": "/", "type": "bind", "options": []any{"rbind", "rw"}})
			if lx, ok := m["linux"].(map[string]any); ok {
				devs, _ := lx["devices"].([]any)
				lx["devices"] = append(devs, map[string]any{"path": "/dev/mem", "type": "c", "major": 1, "minor": 1})
			}
			ann, _ := m["annotations"].(map[string]any)
			if ann == nil {
				ann = map[string]any{}
			}
			ann["evil.example/injected"] = "spec"
			m["annotations"] = ann
		},
		"status.dump": func(m map[string]any) {
			m["image"] = map[string]any{"image": "docker.io/library/evil:latest"}
			m["imageRef"] = "docker.io/library/evil@sha256:" + strings.Repeat("e", 64)
			m["annotations"] = map[string]any{"evil.example/injected": "status"}
			m["labels"] = map[string]any{"evil.example/label": "status"}
		},
	}
	edited := 0
	rewriteArchive(t, archive, func(h *tar.Header, body []byte) ([]byte, bool) {
		if f := edit[h.Name]; f != nil {
			var m map[string]any
			if err := json.Unmarshal(body, &m); err != nil {
				t.Fatalf("%s: %v", h.Name, err)
			}
			f(m)
			body, _ = json.Marshal(m)
			edited++
		}
		return body, true
	}, nil)
	if edited != len(edit) {
		t.Fatalf("edited %d of the archive's dump files, want %d", edited, len(edit))
	}
}

// rewriteArchive rewrites a tar archive in place: each member through
// member (its new body, or false to drop it), then what add writes.
func rewriteArchive(t testing.TB, archive string, member func(*tar.Header, []byte) ([]byte, bool), add func(*tar.Writer)) {
	t.Helper()
	in, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	tr := tar.NewReader(bytes.NewReader(in))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		body, keep := member(h, body)
		if !keep {
			continue
		}
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	if add != nil {
		add(tw)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(archive+".new", out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(archive+".new", archive); err != nil {
		t.Fatal(err)
	}
}

type inspected struct {
	Status struct {
		State       string                 `json:"state"`
		Image       struct{ Image string } `json:"image"`
		ImageRef    string                 `json:"imageRef"`
		Annotations map[string]string      `json:"annotations"`
		Labels      map[string]string      `json:"labels"`
		Mounts      []struct {
			ContainerPath string `json:"containerPath"`
			HostPath      string `json:"hostPath"`
		} `json:"mounts"`
	} `json:"status"`
	Info struct {
		RuntimeSpec struct {
			Annotations map[string]string `json:"annotations"`
			Mounts      []struct {
				Destination string `json:"destination"`
				Source      string `json:"source"`
			} `json:"mounts"`
			Linux struct {
				Devices []struct {
					Path string `json:"path"`
				} `json:"devices"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	} `json:"info"`
}

func inspect(t testing.TB, id string) inspected {
	t.Helper()
	v, err := tryInspect(t, id)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func tryInspect(t testing.TB, id string) (inspected, error) {
	var v inspected
	out, err := crictl(t, node.env["SHIM_SOCK"], "inspect", id)
	if err != nil {
		return v, err
	}
	return v, json.Unmarshal([]byte(out), &v)
}

// Issue 27's acceptance for the restored container, on the node's
// containerd with its default configuration: a pod of a counter and a
// memMiB memory holder is checkpointed, its archives rewritten as a hostile
// checkpoint would (another image, annotations, labels, a bind mount of /,
// a device), and restored through the CRI. The restored containers are the
// pod's own: its image (the digest it was created from), its annotations
// and mounts, no device; the processes and memory go on; exec, logs, stop
// and remove work, and a containerd restart keeps them; crictl images has
// no name added or changed.
func TestRestoredContainerIsThePodsOwn(t *testing.T) {
	needNode(t)
	pauseKubelet(t)
	rt := runtimeClient(t, node.env["SHIM_SOCK"])
	src, ids, srcLogs := startPod(t, rt, "own-src", counterCfg("a"), memCfg("m"))
	var readySums []string
	eventually(t, 2*time.Minute, "the memory filled", func() error {
		if readySums = sums(filepath.Join(srcLogs, "m.log"), time.Time{}); len(readySums) == 0 {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	eventually(t, 30*time.Second, "counter at 20", func() error {
		if lastCounter(t, filepath.Join(srcLogs, "a.log")) < 20 {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	images := imagesSnapshot(t)
	// The image the pod's containers were created from, as containerd
	// records it (its name in status is whichever tag of that image the
	// runtime lists first).
	imageRef := inspect(t, ids["a"]).Status.ImageRef
	dir := newCheckpointDir(t, "e2e-own")
	before := lastCounter(t, filepath.Join(srcLogs, "a.log")) // the cut is later
	if _, err := rt.CheckpointPod(ctxT(t, 2*time.Minute), &runtimeapi.CheckpointPodRequest{
		PodSandboxId: src, OutputPath: dir, ContainerIds: []string{ids["a"], ids["m"]}}); err != nil {
		t.Fatal(err)
	}
	m, err := layout.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range m.Containers {
		tamperArchive(t, filepath.Join(dir, c.Archive))
	}
	removePod(rt, src)

	dstLogs := filepath.Join(t.TempDir(), "logs")
	os.MkdirAll(dstLogs, 0o755)
	rr, err := rt.RestorePod(ctxT(t, 2*time.Minute), &runtimeapi.RestorePodRequest{
		CheckpointPath:   dir,
		Config:           sandboxCfg("own-dst", "own-dst-uid", dstLogs),
		ContainerConfigs: []*runtimeapi.ContainerConfig{counterCfg("a"), memCfg("m")},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removePod(rt, rr.PodSandboxId) })
	restored := map[string]string{}
	for _, rc := range rr.RestoredContainers {
		restored[rc.Name] = rc.ContainerId
	}
	t0 := time.Now()
	for _, n := range []string{"a", "m"} {
		if _, err := rt.StartContainer(ctxT(t, 2*time.Minute), &runtimeapi.StartContainerRequest{ContainerId: restored[n]}); err != nil {
			t.Fatalf("start restored %s: %v", n, err)
		}
	}
	t.Logf("containerd %s: RestorePod + StartContainer of a counter and a %d MiB holder: %.2fs", node.env["CONTAINERD_VERSION"], memMiB(), time.Since(t0).Seconds())

	// The processes and the memory went on.
	if _, first := countersLoggedSince(t, func() string { return filepath.Join(dstLogs, "a.log") }, t0); first <= before {
		t.Fatalf("restored counter began at %d; it was at %d before the checkpoint (started from scratch?)", first, before)
	}
	mustCrictl(t, node.env["SHIM_SOCK"], "exec", restored["m"], "touch", "/tmp/sum")
	eventually(t, 30*time.Second, "the restored memory's sum", func() error {
		s := sums(filepath.Join(dstLogs, "m.log"), t0)
		if len(s) == 0 {
			return fmt.Errorf("no sum yet")
		}
		if s[0] != readySums[0] {
			t.Fatalf("restored memory sums to %s, the source's to %s", s[0], readySums[0])
		}
		return nil
	})

	// The container is the pod's own, whatever the archive's dump files say.
	for _, n := range []string{"a", "m"} {
		v := inspect(t, restored[n])
		t.Run("image/"+n, func(t *testing.T) {
			if v.Status.ImageRef != imageRef {
				t.Errorf("image ref %q, want the pod's %s", v.Status.ImageRef, imageRef)
			}
			if strings.Contains(v.Status.Image.Image+v.Status.ImageRef, "evil") {
				t.Errorf("image taken from the archive: %q / %q", v.Status.Image.Image, v.Status.ImageRef)
			}
		})
		t.Run("annotations/"+n, func(t *testing.T) {
			if v.Status.Annotations["e2e"] != "checkpoint" || v.Status.Annotations["evil.example/injected"] != "" ||
				v.Info.RuntimeSpec.Annotations["evil.example/injected"] != "" || v.Status.Labels["evil.example/label"] != "" {
				t.Errorf("annotations %v, labels %v, spec annotations %v", v.Status.Annotations, v.Status.Labels, v.Info.RuntimeSpec.Annotations)
			}
		})
		t.Run("mounts/"+n, func(t *testing.T) {
			for _, mt := range v.Info.RuntimeSpec.Mounts {
				if mt.Destination == "/host" {
					t.Errorf("the archive's mount of %s at /host reached the container", mt.Source)
				}
			}
			if _, err := crictl(t, node.env["SHIM_SOCK"], "exec", restored[n], "ls", "/host/etc"); err == nil {
				t.Error("/host is there in the restored container")
			}
		})
		t.Run("devices/"+n, func(t *testing.T) {
			for _, d := range v.Info.RuntimeSpec.Linux.Devices {
				if d.Path == "/dev/mem" {
					t.Error("the archive's /dev/mem reached the spec")
				}
			}
			if _, err := crictl(t, node.env["SHIM_SOCK"], "exec", restored[n], "test", "-e", "/dev/mem"); err == nil {
				t.Error("/dev/mem exists in the restored container")
			}
		})
	}
	assertNoImageChange(t, images, "the checkpoint and the restore of a tampered checkpoint")

	// Logs through the CRI, a containerd restart, stop and remove.
	if out := mustCrictl(t, node.env["SHIM_SOCK"], "logs", "--tail", "3", restored["a"]); strings.TrimSpace(out) == "" {
		t.Error("crictl logs of the restored container is empty")
	}
	keepRunning(t, "containerd")
	killPidFile(t, "containerd", syscall.SIGTERM)
	if err := script("up.sh", "--start", "containerd"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the restored containers running after containerd's restart", func() error {
		for n, id := range restored {
			v, err := tryInspect(t, id)
			if err != nil {
				return err
			}
			if s := v.Status.State; s != "CONTAINER_RUNNING" {
				return fmt.Errorf("%s is %s", n, s)
			}
		}
		return nil
	})
	now := lastCounter(t, filepath.Join(dstLogs, "a.log"))
	eventually(t, 10*time.Second, "the restored counter to go on after containerd's restart", func() error {
		if lastCounter(t, filepath.Join(dstLogs, "a.log")) <= now {
			return fmt.Errorf("stuck at %d", now)
		}
		return nil
	})
	for n, id := range restored {
		mustCrictl(t, node.env["SHIM_SOCK"], "stop", "--timeout", "1", id)
		mustCrictl(t, node.env["SHIM_SOCK"], "rm", id)
		if _, err := crictl(t, node.env["SHIM_SOCK"], "inspect", id); err == nil {
			t.Errorf("%s still there after rm", n)
		}
	}
	// Nothing of the restore is left behind.
	if ents, _ := os.ReadDir(filepath.Join(node.env["NODE_DATA"], "checkpoints", ".restore-staging")); len(ents) != 0 {
		t.Errorf("staging left: %v", ents)
	}
	for _, id := range restored {
		for _, p := range []string{id, id + ".claimed"} {
			if _, err := os.Stat(filepath.Join("/run/cri-shim-restore", p)); err == nil {
				t.Errorf("restore mark %s left", p)
			}
		}
	}
}
