package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// needAPIServer starts etcd and kube-apiserver once (up.sh --start apiserver)
// and returns a client with the test admin's credentials.
func needAPIServer(t testing.TB) kubernetes.Interface {
	t.Helper()
	needNode(t)
	node.apiOnce.Do(func() { node.apiErr = script("up.sh", "--start", "apiserver") })
	if node.apiErr != nil {
		t.Fatalf("control plane: %v", node.apiErr)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", node.env["ADMIN_KUBECONFIG"])
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// apiKubelet runs the kubelet registered with the API server (through the
// shim) for the rest of the test; afterwards the standalone one is back for
// the tests that need it.
func apiKubelet(t testing.TB, cs kubernetes.Interface) { apiKubeletAs(t, cs, "kubelet-api") }

// apiKubeletAs is apiKubelet with another of up.sh's API-registered
// kubelets (component of up.sh --start: kubelet-api, kubelet-api-nogate).
func apiKubeletAs(t testing.TB, cs kubernetes.Interface, component string) {
	t.Helper()
	pauseKubelet(t)
	t.Cleanup(func() { pauseKubelet(t) })
	if err := script("up.sh", "--start", component); err != nil {
		t.Fatal(err)
	}
	waitNodeReady(t, cs, node.env["NODE_NAME"])
}

// waitNodeReady waits until node name is Ready in the API.
func waitNodeReady(t testing.TB, cs kubernetes.Interface, name string) {
	t.Helper()
	eventually(t, 2*time.Minute, "node "+name+" Ready in the API", func() error {
		n, err := cs.CoreV1().Nodes().Get(ctxT(t, 10*time.Second), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("node %s not Ready: %v", n.Name, n.Status.Conditions)
	})
}

// testNamespace creates a namespace with a default ServiceAccount (there is no
// controller manager to make one) and removes it after the test.
func testNamespace(t testing.TB, cs kubernetes.Interface, prefix string) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(ctxT(t, 10*time.Second), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = cs.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{})
	})
	if _, err := cs.CoreV1().ServiceAccounts(ns.Name).Create(ctxT(t, 10*time.Second), &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

// apiPod is a busybox pod bound to the test node (no scheduler runs).
func apiPod(name string, annotations map[string]string, cmd ...string) *corev1.Pod {
	no := false
	grace := int64(1)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec: corev1.PodSpec{
			NodeName:                      node.env["NODE_NAME"],
			AutomountServiceAccountToken:  &no,
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "main", Image: busybox, ImagePullPolicy: corev1.PullNever, Command: cmd,
			}},
		},
	}
}

// waitPod waits until the pod in the API satisfies ok.
func waitPod(t testing.TB, cs kubernetes.Interface, ns, name string, timeout time.Duration, what string, ok func(*corev1.Pod) error) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	done := false
	defer func() {
		if !done {
			logAbout(t, ns+"/"+name, 30)
		}
	}()
	eventually(t, timeout, what, func() error {
		var err error
		p, err = cs.CoreV1().Pods(ns).Get(ctxT(t, 10*time.Second), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return ok(p)
	})
	done = true
	return p
}

func podReady(p *corev1.Pod) error {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("pod %s is %s, not Ready: %v", p.Name, p.Status.Phase, p.Status.Conditions)
}

// The control plane of the test stack: the kubelet registers through the
// shim, a pod created through the API runs through the shim and is shown
// Running and Ready, and its deletion removes it from the node.
func TestAPIServerPodThroughShim(t *testing.T) {
	cs := needAPIServer(t)
	apiKubelet(t, cs)
	n, err := cs.CoreV1().Nodes().Get(ctxT(t, 10*time.Second), node.env["NODE_NAME"], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info := n.Status.NodeInfo
	t.Logf("node %s: kubelet %s, runtime %s", n.Name, info.KubeletVersion, info.ContainerRuntimeVersion)
	if info.KubeletVersion != "v"+node.env["KUBELET_VERSION"] || !strings.HasPrefix(info.ContainerRuntimeVersion, "containerd://") {
		t.Fatalf("node info: kubelet %q, runtime %q", info.KubeletVersion, info.ContainerRuntimeVersion)
	}
	ns := testNamespace(t, cs, "e2e-api")
	if _, err := cs.CoreV1().Pods(ns).Create(ctxT(t, 10*time.Second), apiPod("api-pod", nil, "sh", "-c", "echo started; exec sleep 3600"),
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPod(t, cs, ns, "api-pod", 2*time.Minute, "pod Running and Ready", podReady)
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	if out := mustCrictl(t, node.env["SHIM_SOCK"], "ps", "-q", "--id", id); strings.TrimSpace(out) == "" {
		t.Fatalf("container %s of the API pod not listed through the shim", id)
	}
	if err := cs.CoreV1().Pods(ns).Delete(ctxT(t, 10*time.Second), "api-pod", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "pod gone from the API and the node", func() error {
		if _, err := cs.CoreV1().Pods(ns).Get(ctxT(t, 10*time.Second), "api-pod", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still in the API (%v)", err)
		}
		if out, _ := crictl(t, node.env["SHIM_SOCK"], "ps", "-a", "-q", "--id", id); strings.TrimSpace(out) != "" {
			return fmt.Errorf("container %s still on the node", id)
		}
		return nil
	})
}
