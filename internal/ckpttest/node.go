package ckpttest

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/store"
)

// Node is a test's node: the fake runtime with a sandbox "sb1" of running
// containers c1 (app) and c2 (sidecar), an exited init container i1 and a
// created one x1, and a sandbox "sb2" with c3; the state store, the pod
// table, and an empty checkpoint directory Dir ("cp1") under Root.
type Node struct {
	RT       *Runtime
	Store    *store.Store
	Table    *podtable.Table // the node's sandboxes: sync after adding some
	Root     string
	StateDir string
	Dir      string
	Log      *slog.Logger
}

// NewNode makes the node.
func NewNode(t *testing.T) *Node {
	t.Helper()
	base := t.TempDir()
	rt := NewRuntime(t)
	rt.AddSandbox(t, "sb1", "pod1")
	rt.AddSandbox(t, "sb2", "pod2")
	rt.AddContainer(t, "sb1", "c2", "sidecar", runtimeapi.ContainerState_CONTAINER_RUNNING, 20, 0)
	rt.AddContainer(t, "sb1", "c1", "app", runtimeapi.ContainerState_CONTAINER_RUNNING, 30, 0)
	rt.AddContainer(t, "sb1", "i1", "init", runtimeapi.ContainerState_CONTAINER_EXITED, 10, 0)
	rt.AddContainer(t, "sb1", "x1", "done", runtimeapi.ContainerState_CONTAINER_CREATED, 40, 0)
	rt.AddContainer(t, "sb2", "c3", "other", runtimeapi.ContainerState_CONTAINER_RUNNING, 50, 0)
	n := &Node{RT: rt, Root: filepath.Join(base, "checkpoints"), StateDir: filepath.Join(base, "state"),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	var err error
	if n.Store, err = store.Open(store.RootIn(n.StateDir)); err != nil {
		t.Fatal(err)
	}
	n.Table = podtable.New(rt, n.Store, n.Log)
	n.Dir = filepath.Join(n.Root, "cp1")
	if err := os.MkdirAll(n.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return n
}
