package ckptstore

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	crmetadata "github.com/checkpoint-restore/checkpointctl/lib"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/ckptarchive/ckptarchivetest"
	"github.com/cri-shim/cri-shim/internal/ckpttest"
	"github.com/cri-shim/cri-shim/internal/layout"
)

// The same checkpoint, streamed or written after the resume, gives the same
// members with the same contents.
func TestStreamedArchiveHoldsWhatTheUnstreamedOneHolds(t *testing.T) {
	archives := map[bool]map[string][]byte{}
	for _, after := range []bool{false, true} {
		fx := newFixtureWith(t, func(rt *ckpttest.Runtime, _ *Config, ccfg *capture.Config) capture.Tasks {
			ccfg.StreamDuringCapture = !after
			return rt
		})
		if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), ckpttest.CpReq(fx.dir, "c1", "c2")); err != nil {
			t.Fatalf("after resume %v: %v", after, err)
		}
		names, content := ckptarchivetest.Read(t, filepath.Join(fx.dir, layout.ArchiveName("app")))
		if _, ok := content["checkpoint/pages-1.img"]; !ok {
			t.Fatalf("after resume %v: no pages image in the archive", after)
		}
		// The pages are copied in the kernel either way, and lead the archive.
		if names[1] != "checkpoint/pages-1.img" {
			t.Fatalf("after resume %v: archive begins %v", after, names[:2])
		}
		delete(content, crmetadata.ConfigDumpFile) // holds the time of the cut
		delete(content, crmetadata.StatusDumpFile)
		archives[after] = content
	}
	for name, b := range archives[true] {
		if !bytes.Equal(archives[false][name], b) {
			t.Errorf("%s differs between the streamed and the unstreamed archive", name)
		}
	}
	if len(archives[true]) != len(archives[false]) {
		t.Errorf("streamed archive has %d members, unstreamed %d", len(archives[false]), len(archives[true]))
	}
}

// logRT is the fake runtime with a container that logs: on its first resume
// after the cut the container writes more and the kubelet rotates its log.
type logRT struct {
	*ckpttest.Runtime
	logPath string
	resumed bool
}

func (r *logRT) Resume(ctx context.Context, id string) error {
	if err := r.Runtime.Resume(ctx, id); err != nil {
		return err
	}
	if !r.resumed {
		r.resumed = true
		f, err := os.OpenFile(r.logPath, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return err
		}
		_, err = f.WriteString("after the cut\n")
		f.Close()
		if err != nil {
			return err
		}
		if err := os.Rename(r.logPath, r.logPath+".20261125-010000"); err != nil {
			return err
		}
		return os.WriteFile(r.logPath, []byte("a new file after rotation\n"), 0o600)
	}
	return nil
}

// The archive's log is the log as it was at the cut, though the container
// wrote more and the kubelet rotated its log before the archive was written.
func TestArchiveHoldsTheLogAtTheCut(t *testing.T) {
	for _, after := range []bool{false, true} {
		var lr *logRT
		fx := newFixtureWith(t, func(rt *ckpttest.Runtime, cfg *Config, ccfg *capture.Config) capture.Tasks {
			lr = &logRT{Runtime: rt}
			ccfg.StreamDuringCapture = !after
			return lr
		})
		logDir := t.TempDir()
		lr.logPath = filepath.Join(logDir, "app.log")
		atCut := "line 1\nline 2\n"
		if err := os.WriteFile(lr.logPath, []byte(atCut), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		fx.rt.RT.NextIDs("sbl")
		if _, err := fx.rt.RT.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Name: "logger", Namespace: "ns", Uid: "uid-sbl"}, LogDirectory: logDir}}); err != nil {
			t.Fatal(err)
		}
		fx.rt.RT.NextIDs("cl")
		if _, err := fx.rt.RT.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: "sbl",
			SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "logger", Namespace: "ns", Uid: "uid-sbl"}, LogDirectory: logDir},
			Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "app"}, Image: &runtimeapi.ImageSpec{Image: ckpttest.Busybox},
				LogPath: "app.log", Annotations: map[string]string{capture.RestartCountAnnotation: "0"}}}); err != nil {
			t.Fatal(err)
		}
		if _, err := fx.rt.RT.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: "cl"}); err != nil {
			t.Fatal(err)
		}
		req := &runtimeapi.CheckpointPodRequest{PodSandboxId: "sbl", OutputPath: fx.dir, ContainerIds: []string{"cl"}}
		if _, err := fx.cap.CheckpointPod(ckpttest.CtxT(t, 5*time.Second), req); err != nil {
			t.Fatalf("after resume %v: %v", after, err)
		}
		if !lr.resumed {
			t.Fatal("the container was never resumed")
		}
		_, content := ckptarchivetest.Read(t, filepath.Join(fx.dir, layout.ArchiveName("app")))
		if got := string(content["container.log"]); got != atCut {
			t.Errorf("after resume %v: the archive's log is %q, want the log at the cut %q", after, got, atCut)
		}
	}
}
