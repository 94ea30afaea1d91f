package podcheckpoint

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/layout"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// checkpoint takes the checkpoint into the object's data directory, records
// the pod's template there (TemplateFile) and writes the outcome; a status
// write the API server does not take is retried until it is (the data stays, held by the finalizer), the object is
// gone (the data is removed), or the shim stops (ctx: the next process finds
// the object in progress and fails it, as after a kill). The capture itself
// is not cut short by the stop: it leaves no pod paused either way, and a
// finished capture is what the status then records.
func (r *Reconciler) checkpoint(ctx context.Context, pc *cpv1.PodCheckpoint, pod *corev1.Pod, sandbox string, ids []string, timeout time.Duration) {
	dir := filepath.Join(r.cfg.Root, DataDir(pc))
	m, err := r.capture(context.WithoutCancel(ctx), dir, sandbox, ids, timeout)
	var digest string
	if err == nil {
		// The template stays here; the status names its digest only.
		// Written before the Ready status: a Ready object always has it.
		digest, err = writeTemplate(dir, Template(pod))
	}
	var edit func(*cpv1.PodCheckpointStatus)
	var event func()
	if err != nil {
		if rerr := r.removeData(pc); rerr != nil {
			r.log.Warn("podcheckpoint: removing partial data", "object", key(pc.Namespace, pc.Name), "err", rerr)
		}
		r.log.Info("podcheckpoint: checkpoint failed", "object", key(pc.Namespace, pc.Name), "err", err)
		edit = func(s *cpv1.PodCheckpointStatus) {
			setReady(s, metav1.ConditionFalse, cpv1.ReasonFailed, err.Error(), pc.Generation, r.now())
		}
		event = func() { r.ev.emit(objectRef(pc), corev1.EventTypeWarning, EventCheckpointFailed, err.Error()) }
	} else {
		now := metav1.NewTime(r.now())
		init, regular := containerLists(m, pod)
		note := fmt.Sprintf("%d containers, %d bytes; pod paused %.3f s", len(m.Containers), m.SizeBytes, m.FrozenSeconds)
		event = func() { r.ev.emit(objectRef(pc), corev1.EventTypeNormal, EventCheckpointSucceeded, note) }
		edit = func(s *cpv1.PodCheckpointStatus) {
			s.CheckpointLocation = &cpv1.CheckpointSource{Type: cpv1.CheckpointSourceTypeNodeLocal,
				NodeLocal: &cpv1.NodeLocalCheckpointSource{Path: DataDir(pc)}}
			s.CompletionTime = &now
			s.PodSpecDigest = digest
			s.CheckpointedContainers = regular
			s.CheckpointedInitContainers = init
			s.SizeBytes = m.SizeBytes
			setReady(s, metav1.ConditionTrue, cpv1.ReasonCompleted, note, pc.Generation, r.now())
		}
	}
	retry := r.retries()
	for {
		if cur := r.get(key(pc.Namespace, pc.Name)); cur != nil && cur.UID == pc.UID {
			pc = cur // the newest copy: one from before the checkpoint began is a Conflict and a GET
		}
		err := r.setStatus(ctx, pc, edit)
		if err == nil {
			event()
			return
		}
		if final(err) {
			// Gone, replaced, another node's, or refused for good: the
			// outcome cannot be recorded, and data no object records is
			// not kept.
			if !apierrors.IsNotFound(err) {
				r.log.Warn("podcheckpoint: the outcome cannot be written; its data removed", "object", key(pc.Namespace, pc.Name), "err", err)
			}
			r.removeData(pc)
			return
		}
		r.log.Warn("podcheckpoint: writing status, retrying", "object", key(pc.Namespace, pc.Name), "err", err)
		if !backoff.Sleep(ctx, retry.Step()) {
			return
		}
	}
}

// capture runs internal/capture's CheckpointPod into dir, made afresh.
func (r *Reconciler) capture(ctx context.Context, dir, sandbox string, ids []string, timeout time.Duration) (*layout.Manifest, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(r.cfg.Root, 0o700); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := r.ckpt.CheckpointPod(cctx, &runtimeapi.CheckpointPodRequest{
		PodSandboxId: sandbox, OutputPath: dir, ContainerIds: ids}); err != nil {
		return nil, fmt.Errorf("checkpoint (%s): %s", status.Code(err), status.Convert(err).Message())
	}
	return layout.ReadManifest(dir)
}

// containerLists splits the manifest's containers (and completed init
// containers) into init and regular by the pod's spec.
func containerLists(m *layout.Manifest, pod *corev1.Pod) (init, regular []cpv1.PodCheckpointContainerStatus) {
	isInit := map[string]bool{}
	for _, c := range pod.Spec.InitContainers {
		isInit[c.Name] = true
	}
	for _, e := range m.Exited { // never also in Containers (Manifest.Validate)
		if isInit[e.Name] {
			init = append(init, cpv1.PodCheckpointContainerStatus{Name: e.Name, Image: e.Image})
		}
	}
	for _, c := range m.Containers {
		st := cpv1.PodCheckpointContainerStatus{Name: c.Name, Image: c.Image}
		if isInit[c.Name] {
			init = append(init, st)
		} else {
			regular = append(regular, st)
		}
	}
	return init, regular
}
