package podcheckpoint

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// errHeldElsewhere: the object's status names another node, which alone
// may write it (deploy/admission).
var errHeldElsewhere = errors.New("held by another node")

// errReplaced: the object was deleted and created again under its name.
var errReplaced = errors.New("object replaced")

// setStatus applies edit to the newest status of pc and writes it. A
// conflict re-reads the object and applies edit again, unless another node
// holds it by then (errHeldElsewhere).
func (r *Reconciler) setStatus(ctx context.Context, pc *cpv1.PodCheckpoint, edit func(*cpv1.PodCheckpointStatus)) error {
	cur := pc.DeepCopy()
	for attempt := 0; ; attempt++ {
		if h := cur.Status.NodeName; h != "" && h != r.cfg.Node {
			return fmt.Errorf("PodCheckpoint %s/%s: %w (%s)", pc.Namespace, pc.Name, errHeldElsewhere, h)
		}
		edit(&cur.Status)
		out, err := r.objs.UpdateStatus(ctx, cur)
		if err == nil {
			r.Observe(out)
			return nil
		}
		if !apierrors.IsConflict(err) || attempt >= 3 {
			return err
		}
		if cur, err = r.objs.Get(ctx, pc.Namespace, pc.Name); err != nil {
			return err
		}
		if cur.UID != pc.UID {
			return errReplaced
		}
	}
}

// setReady sets the Ready condition.
func setReady(s *cpv1.PodCheckpointStatus, st metav1.ConditionStatus, reason, msg string, gen int64, now time.Time) {
	setCondition(s, cpv1.ConditionReady, st, reason, msg, gen, now)
}

// setCondition sets a condition (its transition time moves only when its
// status does).
func setCondition(s *cpv1.PodCheckpointStatus, typ string, st metav1.ConditionStatus, reason, msg string, gen int64, now time.Time) {
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{
		Type: typ, Status: st, Reason: reason, Message: msg,
		ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(now),
	})
}
