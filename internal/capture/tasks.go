package capture

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/pkg/rootfs"
	"github.com/containerd/typeurl/v2"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Tasks is what the service needs of containerd below the CRI: pause and
// resume (the CRI has none; cgroup freezer via runc), and the two halves of a
// container capture, taken while the container is paused.
type Tasks interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Paused reports whether the task is paused now.
	Paused(ctx context.Context, id string) (bool, error)
	// Checkpoint has runc/CRIU write the container's process images into
	// imageDir (CRIU's work files into workDir), leaving it running. On a
	// paused task containerd neither pauses nor resumes it.
	Checkpoint(ctx context.Context, id, imageDir, workDir string) error
	// RWDiff writes the container's writable layer as a layer tar (gzip).
	RWDiff(ctx context.Context, id string, w io.Writer) error
	// Info is what containerd knows of the container for the archive.
	Info(ctx context.Context, id string) (ContainerInfo, error)
}

// ContainerInfo is containerd's record of a container.
type ContainerInfo struct {
	Runtime string
	Spec    []byte // the OCI spec, JSON
	Created time.Time
}

// criNamespace is the containerd namespace of the CRI plugin's containers.
const criNamespace = "k8s.io"

// ContainerdTasks is Tasks on containerd's task service, through the
// containerd v2 client on a connection of its own (the CRI connection carries
// undecoded frames).
type ContainerdTasks struct {
	conn   *grpc.ClientConn
	client *client.Client
	svc    tasksapi.TasksClient
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
	return &ContainerdTasks{conn: conn, client: c, svc: c.TaskService()}, nil
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

// Checkpoint runs the task checkpoint with runc's image path set: CRIU writes
// straight into imageDir and nothing goes through the content store (what
// containerd's CRI CheckpointContainer does instead, at three more copies).
// It is the task service's call alone: the client's Task.Checkpoint would
// first load the container and the task, take a lease, read the container
// and the task's status again, and drop the lease after, six round trips
// while the pod is paused, none of which a checkpoint into a path needs
// (containerd's plugins/services/tasks/local.go Checkpoint writes nothing to
// the content store when the options carry an image path).
func (t *ContainerdTasks) Checkpoint(ctx context.Context, id, imageDir, workDir string) error {
	opts, err := typeurl.MarshalAnyToProto(&options.CheckpointOptions{Exit: false, ImagePath: imageDir, WorkPath: workDir})
	if err != nil {
		return err
	}
	_, err = t.svc.Checkpoint(nsCtx(ctx), &tasksapi.CheckpointTaskRequest{ContainerID: id, Options: opts})
	return err
}

// RWDiff computes the writable layer's diff with containerd's diff service,
// under a lease so that the blob survives until it is copied.
func (t *ContainerdTasks) RWDiff(ctx context.Context, id string, w io.Writer) error {
	ctx = nsCtx(ctx)
	ctx, done, err := t.client.WithLease(ctx)
	if err != nil {
		return err
	}
	defer done(context.WithoutCancel(ctx))
	info, err := t.client.ContainerService().Get(ctx, id)
	if err != nil {
		return err
	}
	desc, err := rootfs.CreateDiff(ctx, info.SnapshotKey, t.client.SnapshotService(info.Snapshotter), t.client.DiffService(),
		diff.WithReference("cri-shim-rw-"+id))
	if err != nil {
		return fmt.Errorf("writable layer diff: %w", err)
	}
	ra, err := t.client.ContentStore().ReaderAt(ctx, desc)
	if err != nil {
		return err
	}
	defer ra.Close()
	_, err = io.Copy(w, content.NewReader(ra))
	return err
}

// Info reads the container record.
func (t *ContainerdTasks) Info(ctx context.Context, id string) (ContainerInfo, error) {
	c, err := t.client.ContainerService().Get(nsCtx(ctx), id)
	if err != nil {
		return ContainerInfo{}, err
	}
	return ContainerInfo{Runtime: c.Runtime.Name, Spec: c.Spec.GetValue(), Created: c.CreatedAt}, nil
}
