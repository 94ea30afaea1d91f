package podstate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartapi"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// warmSource answers every replayed container with a restore from
// checkpoint "cp" (the pod's own request with the annotation
// test.restored-from, as the checkpoint service creates a restored
// container from the pod's image), or with err; it counts releases.
type warmSource struct {
	err      error
	asked    []string
	released int
	// stageErr fails the restore's staging; notRestored makes the start
	// report that the container started without its checkpoint.
	stageErr    error
	notRestored bool
	staged      []string
}

func (s *warmSource) source(_ context.Context, req *runtimeapi.CreateContainerRequest) (*restartapi.WarmStart, error) {
	s.asked = append(s.asked, req.GetConfig().GetMetadata().GetName())
	if s.err != nil {
		return nil, s.err
	}
	r := proto.Clone(req).(*runtimeapi.CreateContainerRequest)
	r.Config.Annotations["test.restored-from"] = "cp" // kept in the runtime's status
	return &restartapi.WarmStart{Request: r, Checkpoint: "cp", CheckpointedAt: time.Now().Add(-time.Minute), Release: func() { s.released++ },
		Created: func(id string) error {
			if s.stageErr != nil {
				return s.stageErr
			}
			s.staged = append(s.staged, id)
			return nil
		},
		Started: func(id string, err error) error {
			if err == nil && s.notRestored {
				return status.Error(codes.FailedPrecondition, "started without its checkpoint")
			}
			return err
		}}, nil
}

func (o *recordingObserver) WarmRestart(p restartapi.PodRef, r restartapi.WarmResult) {
	if r.Cold != "" {
		o.heard = append(o.heard, fmt.Sprintf("cold %s %s: %s", p.Name, r.Container, r.Cold))
		return
	}
	o.heard = append(o.heard, fmt.Sprintf("warm %s %s from %s", p.Name, r.Container, r.Checkpoint))
}

// warmPod: a pod whose main container has a Restart rule, with src as the
// manager's warm source; main has exited with 1 and been classified.
func warmPod(t *testing.T, src *warmSource) (kubelet, string, *recordingObserver) {
	k := newKubelet(t, t.TempDir())
	o := &recordingObserver{}
	k.m.opts.Observer = o
	k.m.opts.Warm = src.source
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	id := k.start(sb, "main")
	k.exit(id, 1)
	k.status(id)
	return k, sb, o
}

// The replayed container is created from the warm request, the record keeps
// the cold one (the next restart asks again), and the observer hears it.
func TestWarmRestartCreatesFromTheCheckpoint(t *testing.T) {
	src := &warmSource{}
	k, sb, o := warmPod(t, src)
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	p := k.m.pods.Get(sb)
	id := p.Latest["main"]
	if from := k.container(id).GetAnnotations()["test.restored-from"]; from != "cp" {
		t.Fatalf("the replayed instance was not created from the warm request (restored-from %q)", from)
	}
	var rec runtimeapi.CreateContainerRequest
	if err := proto.Unmarshal(p.Creates["main"], &rec); err != nil || rec.GetConfig().GetAnnotations()["test.restored-from"] != "" {
		t.Fatalf("recorded request %v (%v): the warm request replaced the kubelet's", rec.GetConfig().GetAnnotations(), err)
	}
	if src.released != 1 || len(src.asked) != 1 {
		t.Fatalf("asked %v, released %d", src.asked, src.released)
	}
	if got := strings.Join(o.heard, "; "); !strings.Contains(got, "warm p main from cp") {
		t.Fatalf("observer heard %q", got)
	}
	if p.Phase != restartrecord.PhaseRunning {
		t.Fatalf("phase %s", p.Phase)
	}
}

// No usable checkpoint: the container starts cold and the observer hears why.
func TestWarmRestartWithoutACheckpointStartsCold(t *testing.T) {
	src := &warmSource{err: errors.New("the pod has no checkpoint")}
	k, sb, o := warmPod(t, src)
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(o.heard, "; "); !strings.Contains(got, "cold p main: the pod has no checkpoint") {
		t.Fatalf("observer heard %q", got)
	}
	if p := k.m.pods.Get(sb); p.Phase != restartrecord.PhaseRunning || len(k.created()) != 2 {
		t.Fatalf("phase %s, created %v", p.Phase, k.created())
	}
}

// The runtime refuses the warm create: the container is created cold in the
// same restart, and the next restart tries warm again.
func TestWarmCreateRefusedStartsColdThenWarmAgain(t *testing.T) {
	src := &warmSource{}
	k, sb, o := warmPod(t, src)
	k.rt.FailNext("CreateContainer", 1, status.Error(codes.Unavailable, "create failed"))
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	p := k.m.pods.Get(sb)
	if got := strings.Join(o.heard, "; "); !strings.Contains(got, "cold p main: creating the container from checkpoint cp failed") {
		t.Fatalf("observer heard %q", got)
	}
	if p.Phase != restartrecord.PhaseRunning || src.released != 1 {
		t.Fatalf("phase %s, released %d", p.Phase, src.released)
	}
	if from := k.container(p.Latest["main"]).GetAnnotations()["test.restored-from"]; from != "" {
		t.Fatal("the cold instance carries the warm request")
	}
	if a := k.container(p.Latest["main"]).Metadata.Attempt; a != 1 {
		t.Fatalf("cold instance has attempt %d, want 1 (the failed create takes none)", a)
	}
	cur := p.Latest["main"]
	k.exit(cur, 1)
	k.status(cur)
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if len(src.asked) != 2 || !strings.Contains(o.heard[len(o.heard)-2]+o.heard[len(o.heard)-1], "warm p main from cp") {
		t.Fatalf("second restart: asked %v, heard %v", src.asked, o.heard)
	}
}

// The restore of the created container cannot be staged: that container is
// removed, and the restart goes on cold.
func TestWarmStagingFailedStartsCold(t *testing.T) {
	src := &warmSource{stageErr: errors.New("archive: no CRIU images")}
	k, sb, o := warmPod(t, src)
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	p := k.m.pods.Get(sb)
	if got := strings.Join(o.heard, "; "); !strings.Contains(got, "cold p main: staging the restore from checkpoint cp failed: archive: no CRIU images") {
		t.Fatalf("observer heard %q", got)
	}
	if p.Phase != restartrecord.PhaseRunning || k.container(p.Latest["main"]).GetAnnotations()["test.restored-from"] != "" {
		t.Fatalf("phase %s; the running instance is the warm one", p.Phase)
	}
	if n := len(k.rt.Requests("RemoveContainer")); n != 1 {
		t.Fatalf("%d removes, want the unstaged instance's", n)
	}
}

// The start reports the container ran without its checkpoint: the restart
// goes on cold, as for a failed restore.
func TestWarmStartWithoutRestoreStartsCold(t *testing.T) {
	src := &warmSource{notRestored: true}
	k, sb, o := warmPod(t, src)
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	p := k.m.pods.Get(sb)
	if len(src.staged) != 1 {
		t.Fatalf("staged %v", src.staged)
	}
	if got := strings.Join(o.heard, "; "); !strings.Contains(got, "cold p main: restoring from checkpoint cp failed: rpc error: code = FailedPrecondition desc = started without its checkpoint") {
		t.Fatalf("observer heard %q", got)
	}
	if p.Phase != restartrecord.PhaseRunning || k.container(p.Latest["main"]).GetAnnotations()["test.restored-from"] != "" {
		t.Fatalf("phase %s; the running instance is the warm one", p.Phase)
	}
}
