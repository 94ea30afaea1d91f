package kubeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodRef names one incarnation of a pod.
type PodRef struct {
	Namespace, Name, UID string
}

// String is the pod's namespace/name, as kubectl names it.
func (p PodRef) String() string { return p.Namespace + "/" + p.Name }

// Condition is a pod condition the shim owns.
type Condition struct {
	Type   corev1.PodConditionType
	Status corev1.ConditionStatus
	Reason string
	// Message is for humans; the API keeps it whole, so it is bounded here.
	Message string
	// At is when the shim saw the transition (lastTransitionTime); a write
	// delayed by an unreachable API server still carries it.
	At time.Time
}

// SetPodCondition queues c for pod. Conditions of one pod coalesce: only
// the newest of each type is written, in one patch with the others.
func (w *Writer) SetPodCondition(pod PodRef, c Condition) {
	if w == nil {
		return
	}
	if c.At.IsZero() {
		c.At = time.Now()
	}
	w.q.put(&item{key: itemKey(kindStatus, pod.Namespace, pod.UID), ns: pod.Namespace, kind: kindStatus, pod: pod, conds: map[string]Condition{string(c.Type): c}})
}

// maxMessage bounds a condition message (the API has no limit of its own
// short of the object size; a container's output may end up in one).
const maxMessage = 1024

// patchConditions writes conds into the pod's status with a strategic
// merge patch: conditions merge by type, so the kubelet's and others'
// conditions are left as they are. The patch carries the pod's UID, which
// the API server checks against the stored pod: a pod of the same name
// created since is not touched (the patch is refused and dropped).
//
// A static pod's sandbox carries the pod's config hash as its UID, and the
// API object the kubelet keeps for it, its mirror pod, has a UID of its own
// and the hash in mirrorAnnotation. The API server refuses a patch whose UID
// is not the stored pod's as a change of an immutable field (422 Invalid;
// k8s.io/apiserver/pkg/registry/rest/update.go, BeforeUpdate and
// validateCommonFields). Refused, the patch reads the pod once
// and, if it is the mirror of this static pod, is made again with the
// mirror's UID, as the kubelet's status manager does (it translates static
// UIDs to mirror UIDs, pkg/kubelet/status/status_manager.go, syncPod).
func (w *Writer) patchConditions(ctx context.Context, pod PodRef, conds map[string]Condition) error {
	uid := pod.UID
	if m, ok := w.mirrors[pod.UID]; ok {
		uid = m
	}
	err := w.patchAs(ctx, pod, uid, conds)
	if !apierrors.IsInvalid(err) && !apierrors.IsConflict(err) {
		return err
	}
	p, gerr := w.res.GetPod(ctx, pod.Namespace, pod.Name)
	if gerr != nil || p.Annotations[mirrorAnnotation] != pod.UID || string(p.UID) == uid {
		delete(w.mirrors, pod.UID)
		return err
	}
	if len(w.mirrors) >= maxMirrors {
		clear(w.mirrors)
	}
	w.mirrors[pod.UID] = string(p.UID)
	return w.patchAs(ctx, pod, string(p.UID), conds)
}

// mirrorAnnotation is the annotation of a mirror pod naming its static pod
// by config hash (kubetypes.ConfigMirrorAnnotationKey; set in
// pkg/kubelet/pod/mirror_client.go, CreateMirrorPod, from the static pod's
// kubernetes.io/config.hash, which pkg/kubelet/config/common.go also makes
// the static pod's UID).
const mirrorAnnotation = "kubernetes.io/config.mirror"

// maxMirrors bounds the static-to-mirror UIDs the writer remembers.
const maxMirrors = 4096

func (w *Writer) patchAs(ctx context.Context, pod PodRef, uid string, conds map[string]Condition) error {
	b, err := conditionsPatch(PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: uid}, conds)
	if err != nil {
		return err
	}
	if err := w.res.PatchPodStatus(ctx, pod.Namespace, pod.Name, b); err != nil {
		return fmt.Errorf("patch status of pod %s: %w", pod, err)
	}
	return nil
}

func conditionsPatch(pod PodRef, conds map[string]Condition) ([]byte, error) {
	list := make([]map[string]any, 0, len(conds))
	for _, c := range conds {
		list = append(list, map[string]any{
			"type": c.Type, "status": c.Status,
			// An empty reason or message is written as null, which deletes
			// the field: a merge patch keeps the fields it does not name,
			// and the reason of the condition's previous status would stay.
			"reason": orNull(c.Reason), "message": orNull(truncate(c.Message, maxMessage)),
			"lastTransitionTime": metav1.NewTime(c.At.UTC().Truncate(time.Second)),
		})
	}
	sort.Slice(list, func(i, j int) bool {
		return list[i]["type"].(corev1.PodConditionType) < list[j]["type"].(corev1.PodConditionType)
	})
	return json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID},
		"status":   map[string]any{"conditions": list},
	})
}

func orNull(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Cut at a rune boundary.
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}
