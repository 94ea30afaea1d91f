package podcheckpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// errHeldElsewhere: the object's status names another node, which alone
// may write it (deploy/admission).
var errHeldElsewhere = errors.New("held by another node")

// errReplaced: the object was deleted and created again under its name.
var errReplaced = errors.New("object replaced")

// errStatusTooLarge: the status an edit made was over maxStatusBytes; a
// bounded one saying so was written instead (boundedStatus).
var errStatusTooLarge = errors.New("status too large")

// maxStatusBytes bounds the status this node writes, as JSON: the status
// of a PodCheckpoint is written with the node's identity and a tenant
// controls much of what goes into it (the pod's metadata and spec, the
// names of its containers, a registry's answers). A status over it is not
// written; the object fails with a message that says why (boundedStatus).
const maxStatusBytes = 64 << 10

// setStatus applies edit to the newest status of pc and writes it. A
// conflict re-reads the object and applies edit again, unless another node
// holds it by then (errHeldElsewhere). A status over maxStatusBytes is
// replaced by a bounded failure (errStatusTooLarge once written).
func (r *Reconciler) setStatus(ctx context.Context, pc *cpv1.PodCheckpoint, edit func(*cpv1.PodCheckpointStatus)) error {
	// The object's namespace takes its turn in the node's token bucket.
	ctx = kubeapi.ForNamespace(ctx, pc.Namespace)
	cur := pc.DeepCopy()
	for attempt := 0; ; attempt++ {
		if h := cur.Status.NodeName; h != "" && h != r.cfg.Node {
			return fmt.Errorf("PodCheckpoint %s/%s: %w (%s)", pc.Namespace, pc.Name, errHeldElsewhere, h)
		}
		before := cur.Status.DeepCopy()
		edit(&cur.Status)
		var tooLarge error
		if n := statusSize(&cur.Status); n > maxStatusBytes {
			msg := fmt.Sprintf("the status this node would write is %d bytes, over its bound of %d (%s); not written", n, maxStatusBytes, largestFields(&cur.Status))
			tooLarge = fmt.Errorf("PodCheckpoint %s/%s: %w: %s", pc.Namespace, pc.Name, errStatusTooLarge, msg)
			cur.Status = boundedStatus(before, &cur.Status, msg, pc.Generation, r.now())
		}
		out, err := r.objs.UpdateStatus(ctx, cur)
		if err == nil {
			r.Observe(out)
			return tooLarge
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

// maxConditionMessage bounds a condition's message (the API allows 32
// KiB): errors quote a registry's answer, a pod's names, a container's
// output.
const maxConditionMessage = 1024

// setCondition sets a condition (its transition time moves only when its
// status does); its message is cut to maxConditionMessage.
func setCondition(s *cpv1.PodCheckpointStatus, typ string, st metav1.ConditionStatus, reason, msg string, gen int64, now time.Time) {
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{
		Type: typ, Status: st, Reason: reason, Message: cut(msg, maxConditionMessage),
		ObservedGeneration: gen, LastTransitionTime: metav1.NewTime(now),
	})
}

// cut returns s cut to at most n bytes at a rune boundary, marked "...".
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	n -= len("...")
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// statusSize is the size of s as written (JSON).
func statusSize(s *cpv1.PodCheckpointStatus) int {
	b, err := json.Marshal(s)
	if err != nil {
		return math.MaxInt // not writable either way
	}
	return len(b)
}

// largestFields names the status's three largest fields and their sizes,
// for the message of a status over the bound.
func largestFields(s *cpv1.PodCheckpointStatus) string {
	fields := map[string]any{
		"podSpecDigest": s.PodSpecDigest, "checkpointedContainers": s.CheckpointedContainers,
		"checkpointedInitContainers": s.CheckpointedInitContainers, "sourceImage": s.SourceImage,
		"lastRestore": s.LastRestore, "export": s.Export, "conditions": s.Conditions, "checkpointLocation": s.CheckpointLocation,
	}
	type sized struct {
		name string
		n    int
	}
	var all []sized
	for name, v := range fields {
		if b, err := json.Marshal(v); err == nil && string(b) != "null" {
			all = append(all, sized{name, len(b)})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n || all[i].n == all[j].n && all[i].name < all[j].name })
	var parts []string
	for _, f := range all[:min(3, len(all))] {
		parts = append(parts, fmt.Sprintf("%s %d bytes", f.name, f.n))
	}
	return strings.Join(parts, ", ")
}

// boundedStatus is what is written instead of a status over the bound:
// the holder and the source pod the edit set, and the Ready and Exported
// conditions the object had, Ready now False CheckpointFailed with msg.
// Nothing else: whatever made the status large is left out, and an object
// that failed holds no data the node keeps (the callers remove it).
func boundedStatus(before, edited *cpv1.PodCheckpointStatus, msg string, gen int64, now time.Time) cpv1.PodCheckpointStatus {
	out := cpv1.PodCheckpointStatus{NodeName: edited.NodeName, SourcePodUID: edited.SourcePodUID}
	for _, c := range before.Conditions {
		if c.Type == cpv1.ConditionReady || c.Type == cpv1.ConditionExported {
			c.Message = cut(c.Message, maxConditionMessage)
			out.Conditions = append(out.Conditions, c)
		}
	}
	setReady(&out, metav1.ConditionFalse, cpv1.ReasonFailed, msg, gen, now)
	return out
}
