package podcheckpoint

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// A checkpoint whose status would be over maxStatusBytes (a pod with
// very many containers of long image names: the container lists) is not
// recorded: the object fails with
// a message naming the size, the bound and the largest field, the status
// written is small, and the checkpoint's data is removed.
func TestStatusOverTheBoundIsRefused(t *testing.T) {
	e := newEnv(t)
	e.run(t)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "uid-1"}, Spec: corev1.PodSpec{NodeName: "node-a"}}
	for i := range 256 {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{
			Name: fmt.Sprintf("c%d", i), Image: "registry.example/" + strings.Repeat("x", 480) + fmt.Sprintf(":%d", i)})
	}
	e.pods[key("ns", "web")] = p
	e.rt.addPod(p)
	e.create(object("ns", "cp", "web"))
	got := e.waitReason(t, "ns", "cp", cpv1.ReasonFailed)
	c := ready(got)
	for _, want := range []string{"over its bound of 65536", "(checkpointedContainers 1", "not written"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("Ready message %q lacks %q", c.Message, want)
		}
	}
	if n := statusSize(&got.Status); n > 4096 {
		t.Errorf("the status written instead is %d bytes", n)
	}
	if len(got.Status.CheckpointedContainers) != 0 || got.Status.PodSpecDigest != "" || got.Status.CheckpointLocation != nil || got.Status.NodeName != "node-a" {
		t.Errorf("status written instead: %+v", got.Status)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(e.root, DataDir(got))); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the data of the unrecorded checkpoint was kept")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Condition messages are cut at a rune boundary to maxConditionMessage.
func TestConditionMessageIsBounded(t *testing.T) {
	var s cpv1.PodCheckpointStatus
	setCondition(&s, cpv1.ConditionReady, metav1.ConditionFalse, cpv1.ReasonFailed, strings.Repeat("é", maxConditionMessage), 1, time.Now())
	m := s.Conditions[0].Message
	if len(m) > maxConditionMessage || !strings.HasSuffix(m, "...") || !strings.HasPrefix(m, "éé") || strings.ContainsRune(m, '\uFFFD') {
		t.Fatalf("message of %d bytes: %q...", len(m), m[:min(len(m), 20)])
	}
}

// boundedStatus keeps the holder, the source pod and the Ready and
// Exported conditions, nothing else.
func TestBoundedStatusKeepsTheHolder(t *testing.T) {
	uid := "pod-uid"
	var before cpv1.PodCheckpointStatus
	setCondition(&before, cpv1.ConditionExported, metav1.ConditionFalse, cpv1.ReasonExportFailed, "push 1 failed", 1, time.Now())
	setCondition(&before, "Other", metav1.ConditionTrue, "X", strings.Repeat("y", 10000), 1, time.Now())
	edited := before.DeepCopy()
	edited.NodeName = "node-a"
	edited.SourcePodUID = ptrUID(uid)
	out := boundedStatus(&before, edited, "too large", 2, time.Now())
	if out.NodeName != "node-a" || out.SourcePodUID == nil || len(out.Conditions) != 2 {
		t.Fatalf("bounded status %+v", out)
	}
	if c := ready(&cpv1.PodCheckpoint{Status: out}); c.Reason != cpv1.ReasonFailed || c.Message != "too large" {
		t.Fatalf("Ready %+v", c)
	}
}

func ptrUID(s string) *types.UID { u := types.UID(s); return &u }
