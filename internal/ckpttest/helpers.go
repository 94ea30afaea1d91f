package ckpttest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/ckptarchive/ckptarchivetest"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/restoremark"
)

// CaptureTiming is the capture timing of the tests: resumes retried at
// once, small margins.
var CaptureTiming = capture.Timing{Dump: 10 * time.Minute, Resume: 10 * time.Second, RetryEvery: 10 * time.Millisecond,
	MarginBase: 10 * time.Millisecond, MarginPer: 5 * time.Millisecond}

// CtrCfg is the kubelet's config of container name.
func CtrCfg(name string) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:       &runtimeapi.ImageSpec{Image: "docker.io/library/busybox:latest"},
		Annotations: map[string]string{capture.RestartCountAnnotation: "0", "io.kubernetes.container.hash": "h"}}
}

// CpReq checkpoints containers ids of sandbox sb1 into dir.
func CpReq(dir string, ids ...string) *runtimeapi.CheckpointPodRequest {
	return &runtimeapi.CheckpointPodRequest{PodSandboxId: "sb1", OutputPath: dir, ContainerIds: ids}
}

// RestoreReq restores the checkpoint dir into a new pod of namespace ns
// with containers names.
func RestoreReq(dir string, names ...string) *runtimeapi.RestorePodRequest {
	r := &runtimeapi.RestorePodRequest{CheckpointPath: dir,
		Config: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "copy", Namespace: "ns", Uid: "new-uid"}}}
	for _, n := range names {
		r.ContainerConfigs = append(r.ContainerConfigs, CtrCfg(n))
	}
	return r
}

// StagedPages is the pages image staged for container id's restore under
// marks, "" when none is staged.
func StagedPages(t *testing.T, marks restoremark.Dir, id string) string {
	t.Helper()
	ents, err := marks.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.ID == id && e.Mark != nil && !e.Claimed {
			b, err := os.ReadFile(filepath.Join(e.Mark.Images, "pages-1.img"))
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
	}
	return ""
}

// ArchivePages is the pages image in a container archive.
func ArchivePages(t *testing.T, archive string) string {
	t.Helper()
	return ArchiveEntry(t, archive, "checkpoint/pages-1.img")
}

// ArchiveEntry is the content of the archive's member name.
func ArchiveEntry(t *testing.T, archive, name string) string {
	t.Helper()
	_, content := ckptarchivetest.Read(t, archive)
	b, ok := content[name]
	if !ok {
		t.Fatalf("%s has no %s", archive, name)
	}
	return string(b)
}

// AddPod adds sandbox id (pod UID uid-<id>, namespace "ns") with the given
// annotations and a container app (c-<id>) in state, and syncs table.
func AddPod(t *testing.T, rt *Runtime, table *podtable.Table, id string, ann map[string]string, state runtimeapi.ContainerState) {
	t.Helper()
	rt.RT.NextIDs(id)
	if _, err := rt.RT.RunPodSandbox(context.Background(), &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "p-" + id, Namespace: "ns", Uid: "uid-" + id}, Annotations: ann,
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER}}}}}); err != nil {
		t.Fatal(err)
	}
	rt.AddContainer(t, id, "c-"+id, "app", state, 60, 0)
	if err := table.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
}
