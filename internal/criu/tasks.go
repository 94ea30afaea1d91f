package criu

import (
	"context"
	"fmt"
	"strings"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Tasks pauses and resumes containers' processes. The CRI has no pause, so the
// shim reaches containerd's task service for it (cgroup freezer via runc).
type Tasks interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Paused reports whether the task is paused now.
	Paused(ctx context.Context, id string) (bool, error)
}

// criNamespace is the containerd namespace of the CRI plugin's containers.
const criNamespace = "k8s.io"

// ContainerdTasks is Tasks on containerd's task service, through the
// containerd v2 client on a connection of its own (the CRI connection carries
// undecoded frames).
type ContainerdTasks struct {
	conn *grpc.ClientConn
	svc  tasksapi.TasksClient
}

// DialTasks connects lazily to containerd at endpoint (unix socket path or
// unix:// address); it does not wait for containerd to be up.
func DialTasks(endpoint string) (*ContainerdTasks, error) {
	path := strings.TrimPrefix(endpoint, "unix://")
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("containerd %s: %w", path, err)
	}
	c, err := client.NewWithConn(conn, client.WithDefaultNamespace(criNamespace))
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &ContainerdTasks{conn: conn, svc: c.TaskService()}, nil
}

// Close closes the connection.
func (t *ContainerdTasks) Close() error { return t.conn.Close() }

func nsCtx(ctx context.Context) context.Context { return namespaces.WithNamespace(ctx, criNamespace) }

// Pause freezes the container's processes.
func (t *ContainerdTasks) Pause(ctx context.Context, id string) error {
	_, err := t.svc.Pause(nsCtx(ctx), &tasksapi.PauseTaskRequest{ContainerID: id})
	return err
}

// Resume thaws them.
func (t *ContainerdTasks) Resume(ctx context.Context, id string) error {
	_, err := t.svc.Resume(nsCtx(ctx), &tasksapi.ResumeTaskRequest{ContainerID: id})
	return err
}

// Paused reports whether containerd sees the task paused.
func (t *ContainerdTasks) Paused(ctx context.Context, id string) (bool, error) {
	r, err := t.svc.Get(nsCtx(ctx), &tasksapi.GetRequest{ContainerID: id})
	if err != nil {
		return false, err
	}
	s := r.GetProcess().GetStatus()
	return s == tasktypes.Status_PAUSED || s == tasktypes.Status_PAUSING, nil
}
