package e2e

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/cri-shim/cri-shim/internal/podstatus"
)

// gateOptIn is the namespace label deploy/admission/restart-readiness.yaml's
// binding selects: only pods of namespaces labelled so get the readiness gate.
const gateOptIn = `{"metadata":{"labels":{"restart.cri-shim.io/readiness-gate":"enabled"}}}`

// enableGate labels the namespace as an operator opting in to the readiness
// gate does, and waits until the admission policy adds the gate there (the
// API server applies a new policy, and sees a namespace's new label, within
// seconds).
func enableGate(t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	if _, err := cs.CoreV1().Namespaces().Patch(ctxT(t, 10*time.Second), ns, types.MergePatchType, []byte(gateOptIn), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the readiness gate policy in force", func() error {
		g, err := admittedGates(t, cs, ns, restartingPod("dry-run", 0))
		if err != nil {
			return err
		}
		if len(g) != 1 || g[0].ConditionType != podstatus.ReadyCondition {
			return fmt.Errorf("readiness gates %v", g)
		}
		return nil
	})
}

// admittedGates are the readiness gates the pod would be created with in ns
// (a dry-run create: admission runs, nothing is stored).
func admittedGates(t *testing.T, cs kubernetes.Interface, ns string, p *corev1.Pod) ([]corev1.PodReadinessGate, error) {
	t.Helper()
	out, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return nil, err
	}
	return out.Spec.ReadinessGates, nil
}

// The readiness gate's admission policy as the test stack applies it from
// deploy/admission, on kube-apiserver: it adds the gate, once, to pods with a
// cri-shim restart or pod-management annotation in a namespace labelled
// restart.cri-shim.io/readiness-gate=enabled, and to no other pod: not in an
// unlabelled namespace (where no shim may write the gate, and the pod would
// never be Ready), not to a pod without such an annotation, not to a mirror
// pod, and not a second time.
func TestReadinessGatePolicyScope(t *testing.T) {
	cs := needAPIServer(t)
	opted := testNamespace(t, cs, "e2e-gate-on")
	plain := testNamespace(t, cs, "e2e-gate-off")
	enableGate(t, cs, opted)

	gated := func(name string, gates ...corev1.PodConditionType) *corev1.Pod {
		p := restartingPod(name, 0)
		for _, g := range gates {
			p.Spec.ReadinessGates = append(p.Spec.ReadinessGates, corev1.PodReadinessGate{ConditionType: g})
		}
		return p
	}
	mirror := restartingPod("mirror", 0)
	mirror.Annotations["kubernetes.io/config.mirror"] = "0123456789abcdef"
	other := corev1.PodConditionType("example.com/other")
	for _, c := range []struct {
		what string
		ns   string
		pod  *corev1.Pod
		want []corev1.PodConditionType
	}{
		{"restart rules, namespace not labelled", plain, restartingPod("rules", 0), nil},
		{"pod management, namespace not labelled", plain, apiPod("mgmt", map[string]string{"pod-management.cri-shim.io/main": `{"port": 50051, "version": "1.0"}`}, "sleep", "1"), nil},
		{"restart rules", opted, restartingPod("rules", 0), []corev1.PodConditionType{podstatus.ReadyCondition}},
		{"pod management", opted, apiPod("mgmt", map[string]string{"pod-management.cri-shim.io/main": `{"port": 50051, "version": "1.0"}`}, "sleep", "1"), []corev1.PodConditionType{podstatus.ReadyCondition}},
		{"no cri-shim annotation", opted, apiPod("plain", map[string]string{"example.com/note": "x"}, "sleep", "1"), nil},
		{"the gate already there", opted, gated("has-gate", podstatus.ReadyCondition), []corev1.PodConditionType{podstatus.ReadyCondition}},
		{"another gate there", opted, gated("other-gate", other), []corev1.PodConditionType{other, podstatus.ReadyCondition}},
		{"mirror pod", opted, mirror, nil},
	} {
		g, err := admittedGates(t, cs, c.ns, c.pod)
		if err != nil {
			t.Errorf("%s: %v", c.what, err)
			continue
		}
		var got []corev1.PodConditionType
		for _, x := range g {
			got = append(got, x.ConditionType)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s (namespace %s): readiness gates %v, want %v", c.what, c.ns, got, c.want)
		}
	}
}
