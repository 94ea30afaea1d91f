package fleet

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
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
	// restoreFrom resolves the restore of p from the PodCheckpoint name, as
	// the node's RunPodSandbox would (in-process nodes only).
	restoreFrom(ctx context.Context, p *corev1.Pod, name string) error
	// pending and dropped are the node's API writer's queue and drops.
	pending() float64
	dropped() float64
}

func (n *simNode) add(p *corev1.Pod)    { n.rt.set(p) }
func (n *simNode) remove(p *corev1.Pod) { n.rt.remove(string(p.UID)) }
func (n *simNode) dropped() float64     { return n.metric("cri_shim_kubeapi_dropped_total") }
func (n *simNode) restoreFrom(ctx context.Context, p *corev1.Pod, name string) error {
	_, err := n.restores.Resolve(ctx, p.Namespace, p.Name, string(p.UID), name)
	return err
}

// procNode is `cri-shim serve` with [kubernetes] as the node, its runtime
// endpoint an in-memory CRI runtime (internal/fakeruntime) in this process.
// The harness runs each pod bound to the node through the shim's socket as
// the kubelet would (RunPodSandbox, CreateContainer, StartContainer), so the
// shim's pod table has it. Its checkpoints fail (the runtime has no tasks
// API): process mode calibrates the steady state, not the capture.
type procNode struct {
	name string
	rt   *fakeruntime.Runtime
	cmd  *exec.Cmd
	cri  runtimeapi.RuntimeServiceClient // the shim's socket
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
	sock := filepath.Join(dir, "shim.sock")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: the shim did not listen within 30 s (%s)", name, filepath.Join(dir, "shim.log"))
		}
	}
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	n.cri = runtimeapi.NewRuntimeServiceClient(cc)
	return n
}

func (n *procNode) add(p *corev1.Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := n.cri
	sbc := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: p.Name, Namespace: p.Namespace, Uid: string(p.UID)}}
	sb, err := c.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbc})
	if err != nil {
		log.Printf("node %s: RunPodSandbox %s/%s: %v", n.name, p.Namespace, p.Name, err)
		return
	}
	for _, ct := range p.Spec.Containers {
		_, _ = n.rt.ImageClient().PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: ct.Image}})
		cr, err := c.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, SandboxConfig: sbc,
			Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: ct.Name}, Image: &runtimeapi.ImageSpec{Image: ct.Image}}})
		if err == nil {
			_, err = c.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: cr.ContainerId})
		}
		if err != nil {
			log.Printf("node %s: container %s of %s/%s: %v", n.name, ct.Name, p.Namespace, p.Name, err)
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
	_, _ = n.cri.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
	_, _ = n.cri.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
}

func (n *procNode) restart(*corev1.Pod) bool { return false }
func (n *procNode) restoreFrom(context.Context, *corev1.Pod, string) error {
	return errors.New("process mode cannot drive a restore")
}
func (n *procNode) pending() float64 { return 0 }
func (n *procNode) dropped() float64 { return 0 }
