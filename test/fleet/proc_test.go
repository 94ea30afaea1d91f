package fleet

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
)

// shimNode is a node's shim as the phases drive it: in this process
// (simNode) or the real binary over an in-memory runtime (procNode).
type shimNode interface {
	add(p *corev1.Pod)
	remove(p *corev1.Pod)
	// restart reports an in-place restart of p; false when the mode cannot.
	restart(p *corev1.Pod) bool
	// pending and dropped are the node's API writer's queue and drops.
	pending() float64
	dropped() float64
}

func (n *simNode) add(p *corev1.Pod)    { n.rt.set(p) }
func (n *simNode) remove(p *corev1.Pod) { n.rt.remove(string(p.UID)) }
func (n *simNode) dropped() float64     { return n.metric("cri_shim_kubeapi_dropped_total") }

// procNode is `cri-shim serve` with [kubernetes] as the node, its runtime
// endpoint an in-memory CRI runtime (internal/fakeruntime) in this process
// that has a sandbox and a running container for every pod bound to the
// node. Its checkpoints fail (the runtime has no tasks API): process mode
// calibrates the steady state, not the capture.
type procNode struct {
	name string
	rt   *fakeruntime.Runtime
	cmd  *exec.Cmd
	mu   sync.Mutex
	sb   map[string]string // pod UID -> sandbox ID
}

func startProcNode(t testing.TB, cp *controlPlane, name, root string) *procNode {
	t.Helper()
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	_, kc := cp.pki.client(t, cp.host, "system:node:"+name, []string{"system:nodes"})
	n := &procNode{name: name, rt: fakeruntime.New(), sb: map[string]string{}}
	stop, err := n.rt.Serve(filepath.Join(dir, "runtime.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	cfg := fmt.Sprintf(`state_dir = %q
[server]
listen = %q
[runtime]
endpoint = %q
[metrics]
address = ''
[log]
level = 'warn'
[checkpoint]
root = %q
[kubernetes]
kubeconfig = %q
node_name = %q
`, filepath.Join(dir, "state"), filepath.Join(dir, "shim.sock"), filepath.Join(dir, "runtime.sock"), filepath.Join(dir, "checkpoints"), kc, name)
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	bin, _ := filepath.Abs("../../_output/cri-shim")
	n.cmd = exec.Command(bin, "serve", "--config", filepath.Join(dir, "config.toml"))
	startLogged(t, n.cmd, filepath.Join(dir, "shim.log"))
	t.Cleanup(func() {
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		_, _ = n.cmd.Process.Wait()
	})
	return n
}

func (n *procNode) add(p *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := n.rt.Client()
	sb, err := c.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: p.Name, Namespace: p.Namespace, Uid: string(p.UID)}}})
	if err != nil {
		return
	}
	for _, ct := range p.Spec.Containers {
		_, _ = n.rt.ImageClient().PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ct.Image}})
		cr, err := c.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId,
			Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: ct.Name}, Image: &runtimeapi.ImageSpec{Image: ct.Image}}})
		if err == nil {
			_, _ = c.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId})
		}
	}
	n.mu.Lock()
	n.sb[string(p.UID)] = sb.PodSandboxId
	n.mu.Unlock()
}

func (n *procNode) remove(p *corev1.Pod) {
	n.mu.Lock()
	id := n.sb[string(p.UID)]
	delete(n.sb, string(p.UID))
	n.mu.Unlock()
	if id == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = n.rt.Client().StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
	_, _ = n.rt.Client().RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
}

func (n *procNode) restart(*corev1.Pod) bool { return false }
func (n *procNode) pending() float64         { return 0 }
func (n *procNode) dropped() float64         { return 0 }
