package podcheckpoint

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"

	"github.com/cri-shim/cri-shim/internal/layout"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// An object's data (pcp-<uid> under the checkpoint root) outlives its object
// when the object is deleted without the node's finalizer (a user removed
// it) or while the shim was down. The sweep removes, once the informer of
// the objects this node holds has synced and then every sweepEvery, each
// data directory whose object that informer does not hold, once the
// directory is older than sweepGrace (an object whose checkpoint is being
// written may not be in the store yet).
const (
	sweepEvery = time.Minute
	sweepGrace = 2 * time.Minute
)

// removeData removes the data of pc, an object the node held that is gone,
// unless the reconciler knows another copy with its UID (an object
// re-created under that name has another UID, and another directory).
func (w *Watches) removeData(pc *cpv1.PodCheckpoint) {
	w.r.forgetUID(pc) // the informers' handlers run in any order
	dir := DataDir(pc)
	if w.r.dataDirs()[dir] {
		return
	}
	p := filepath.Join(w.r.cfg.Root, dir)
	if _, err := os.Stat(p); err != nil {
		return
	}
	if err := os.RemoveAll(p); err != nil {
		w.log.Warn("podcheckpoint: removing the data of an object that is gone", "dir", dir, "err", err)
		return
	}
	w.log.Info("podcheckpoint: removed the data of an object that is gone", "object", pc.Namespace+"/"+pc.Name, "dir", dir)
}

// sweepOrphans runs the sweep against held's store until ctx ends.
func (w *Watches) sweepOrphans(ctx context.Context, held cache.SharedIndexInformer) {
	if !cache.WaitForCacheSync(ctx.Done(), held.HasSynced) {
		return
	}
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		w.sweepOnce(held.GetStore(), time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweepOnce removes the orphaned data directories, as of now.
func (w *Watches) sweepOnce(store cache.Store, now time.Time) int {
	root := w.r.cfg.Root
	ents, err := os.ReadDir(root)
	if err != nil {
		return 0
	}
	// The objects the node holds, and those the reconciler knows of
	// otherwise (one whose status, naming this node, is not written yet).
	held := w.r.dataDirs()
	for _, o := range store.List() {
		if pc, ok := o.(*cpv1.PodCheckpoint); ok {
			held[DataDir(pc)] = true
		}
	}
	n := 0
	for _, e := range ents {
		name := e.Name()
		if !e.IsDir() || !strings.HasPrefix(name, layout.ObjectDirPrefix) || held[name] {
			continue
		}
		fi, err := e.Info()
		if err != nil || now.Sub(fi.ModTime()) < sweepGrace {
			continue
		}
		if err := os.RemoveAll(filepath.Join(root, name)); err != nil {
			w.log.Warn("podcheckpoint: removing the data of an object that is gone", "dir", name, "err", err)
			continue
		}
		n++
		w.log.Info("podcheckpoint: removed the data of an object that is gone", "dir", name)
	}
	return n
}

// finalize removes the node's data of a deleted object, then its finalizer.
func (r *Reconciler) finalize(ctx context.Context, pc *cpv1.PodCheckpoint) error {
	if !slices.Contains(pc.Finalizers, cpv1.NodeDataFinalizer) {
		return nil
	}
	if err := r.removeData(pc); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.exportFailed, pc.UID)
	r.mu.Unlock()
	pc.Finalizers = slices.DeleteFunc(pc.Finalizers, func(f string) bool { return f == cpv1.NodeDataFinalizer })
	out, err := r.objs.Update(ctx, pc)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	r.Observe(out)
	return nil
}

func (r *Reconciler) removeData(pc *cpv1.PodCheckpoint) error {
	dir := filepath.Join(r.cfg.Root, DataDir(pc))
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}
