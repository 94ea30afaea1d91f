package podcheckpoint

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// Exporter pushes an object's data to a registry (internal/ociartifact's
// Exporter): the source pod ns/pod with UID uid, the secret named in
// spec.export (may be empty), the image to push to and the data directory.
// It returns the pushed reference by digest and the digest.
type Exporter interface {
	Export(ctx context.Context, ns, pod, uid, secret, image, dir string) (ref, digest string, err error)
}

// A failed push is tried again exportRetry after it, then after twice
// that, doubling up to exportRetryMax (each wait jittered down by up to a
// quarter, so that objects failed together do not retry in step): a
// refused export costs one status write per attempt, a few a day per
// object once the waits reach their cap, not one a minute for good.
var (
	exportRetry    = time.Minute
	exportRetryMax = time.Hour
)

// exportFailure is an object's record of failed pushes.
type exportFailure struct {
	at    time.Time     // the last failure
	tries int           // failed pushes in a row
	wait  time.Duration // from at to the next push
}

// exportDelay is the wait after the tries-th failed push in a row.
func exportDelay(tries int) time.Duration {
	d := exportRetry
	for i := 1; i < tries && d < exportRetryMax; i++ {
		d *= 2
	}
	d = min(d, exportRetryMax)
	return d - rand.N(d/4+1)
}

// Event reasons of an export.
const (
	EventExportSucceeded = "ExportSucceeded"
	EventExportFailed    = "ExportFailed"
)

// needsExport reports whether the node holding pc should push it now: Ready,
// spec.export set, not exported yet, not pushing, and not failed within
// its backoff (it returns how long to wait then). It decides on the newest
// copy of pc held: the caller's may have been read before a push ended and
// its outcome was written, and would start the push again.
func (r *Reconciler) needsExport(pc *cpv1.PodCheckpoint) (bool, time.Duration) {
	r.mu.Lock()
	if cur := r.objects[key(pc.Namespace, pc.Name)]; cur != nil && cur.UID == pc.UID {
		pc = cur.DeepCopy()
	}
	r.mu.Unlock()
	if pc.Spec.Export == nil || pc.Status.NodeName != r.cfg.Node || pc.DeletionTimestamp != nil {
		return false, 0
	}
	if c := ready(pc); c == nil || c.Status != metav1.ConditionTrue {
		return false, 0
	}
	r.mu.Lock()
	busy, failed := r.exporting[pc.UID], r.exportFailed[pc.UID]
	r.mu.Unlock()
	if c := meta.FindStatusCondition(pc.Status.Conditions, cpv1.ConditionExported); busy || c != nil && c.Status == metav1.ConditionTrue {
		return false, 0
	}
	// The failure time is kept here: the condition's transition time does
	// not move while it stays False.
	if wait := failed.wait - r.now().Sub(failed.at); failed.tries > 0 && wait > 0 {
		return false, wait
	}
	return true, 0
}

// startExport pushes pc's data in the background and records the outcome.
// The first push is announced (Exported False ExportInProgress) and its
// outcome written; a retry writes its outcome only, the ExportFailed of the
// last try standing meanwhile (its message says when the next one comes):
// one status write per attempt.
func (r *Reconciler) startExport(ctx context.Context, pc *cpv1.PodCheckpoint) error {
	if r.exporter == nil {
		return r.exported(ctx, pc, "", "", fmt.Errorf("this node's cri-shim exports to no registry (no [checkpoint] registries)"))
	}
	if !r.exportSlots.take(pc.Namespace) {
		// Pushes of other objects take the slots: looked at again later.
		r.queue.AddAfter(key(pc.Namespace, pc.Name), slotWait)
		return nil
	}
	r.mu.Lock()
	r.exporting[pc.UID] = true
	r.mu.Unlock()
	if c := meta.FindStatusCondition(pc.Status.Conditions, cpv1.ConditionExported); c == nil || c.Reason != cpv1.ReasonExportFailed {
		err := r.setStatus(ctx, pc, func(s *cpv1.PodCheckpointStatus) {
			setCondition(s, cpv1.ConditionExported, metav1.ConditionFalse, cpv1.ReasonExportInProgress, "pushing to "+pc.Spec.Export.Image, pc.Generation, r.now())
		})
		if err != nil {
			r.endExport(pc)
			return err
		}
	}
	uid := ""
	if pc.Status.SourcePodUID != nil {
		uid = string(*pc.Status.SourcePodUID)
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer r.endExport(pc)
		start := time.Now()
		ref, digest, err := r.exporter.Export(ctx, pc.Namespace, pc.Spec.SourcePodName, uid, pc.Spec.Export.SecretName,
			pc.Spec.Export.Image, filepath.Join(r.cfg.Root, DataDir(pc)))
		if err == nil {
			r.log.Info("podcheckpoint: exported", "object", key(pc.Namespace, pc.Name), "ref", ref,
				"bytes", pc.Status.SizeBytes, "seconds", time.Since(start).Seconds())
		}
		retry := r.retries()
		for ctx.Err() == nil {
			werr := r.exported(ctx, pc, ref, digest, err)
			if werr == nil || final(werr) {
				return
			}
			r.log.Warn("podcheckpoint: writing the export's status, retrying", "object", key(pc.Namespace, pc.Name), "err", werr)
			backoff.Sleep(ctx, retry.Step())
		}
	}()
	return nil
}

func (r *Reconciler) endExport(pc *cpv1.PodCheckpoint) {
	r.exportSlots.give(pc.Namespace)
	r.mu.Lock()
	delete(r.exporting, pc.UID)
	r.mu.Unlock()
	r.queue.Add(key(pc.Namespace, pc.Name))
}

// exported writes the outcome of a push: status.export and Exported True,
// or Exported False ExportFailed (tried again after exportDelay). The
// events of repeated failures are one series (the recorder aggregates an
// object's events of one reason), their note the first failure's.
func (r *Reconciler) exported(ctx context.Context, pc *cpv1.PodCheckpoint, ref, digest string, perr error) error {
	now := metav1.NewTime(r.now())
	r.mu.Lock()
	f := r.exportFailed[pc.UID]
	if perr != nil {
		f = exportFailure{at: now.Time, tries: f.tries + 1}
		f.wait = exportDelay(f.tries)
		r.exportFailed[pc.UID] = f
	} else {
		delete(r.exportFailed, pc.UID)
	}
	r.mu.Unlock()
	if perr != nil {
		msg := fmt.Sprintf("push %d failed: %s; next push in %s", f.tries, perr, f.wait.Round(time.Second))
		err := r.setStatus(ctx, pc, func(s *cpv1.PodCheckpointStatus) {
			setCondition(s, cpv1.ConditionExported, metav1.ConditionFalse, cpv1.ReasonExportFailed, msg, pc.Generation, now.Time)
		})
		if err == nil {
			r.ev.emit(objectRef(pc), corev1.EventTypeWarning, EventExportFailed, msg)
			r.queue.AddAfter(key(pc.Namespace, pc.Name), f.wait)
		}
		return err
	}
	msg := "pushed " + ref
	err := r.setStatus(ctx, pc, func(s *cpv1.PodCheckpointStatus) {
		s.Export = &cpv1.PodCheckpointExportStatus{Image: ref, Digest: digest, CompletionTime: &now}
		setCondition(s, cpv1.ConditionExported, metav1.ConditionTrue, cpv1.ReasonExported, msg, pc.Generation, now.Time)
	})
	if err == nil {
		r.ev.emit(objectRef(pc), corev1.EventTypeNormal, EventExportSucceeded, msg)
	}
	return err
}
