package fakeruntime

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Exit codes and reasons as containerd's internal/cri/server/helpers.go has them.
const (
	exitSIGKILL        = 137
	exitSIGTERM        = 143
	errorStartExitCode = 128
	errorStartReason   = "StartError"
	completeExitReason = "Completed"
	errorExitReason    = "Error"
	oomExitReason      = "OOMKilled"
)

// container's state follows from its timestamps, as containerd's
// containerstore.Status.State: finished is EXITED, started is RUNNING,
// otherwise CREATED.
type container struct {
	id, sandboxID, name string
	seq                 int
	cfg                 *runtimeapi.ContainerConfig
	logPath, imageRef   string
	createdAt           int64
	startedAt           int64
	finishedAt          int64
	exitCode            int32
	reason, message     string
	// exiting: the process died at this time with this code, and its
	// exit is not recorded yet (ExitUnrecorded).
	exiting *exit
}

type exit struct {
	at   int64
	code int32
}

func (c *container) state() runtimeapi.ContainerState {
	switch {
	case c.finishedAt != 0:
		return runtimeapi.ContainerState_CONTAINER_EXITED
	case c.startedAt != 0:
		return runtimeapi.ContainerState_CONTAINER_RUNNING
	}
	return runtimeapi.ContainerState_CONTAINER_CREATED
}

// status is container_status.go's toCRIContainerStatus. img is the
// container's image if the runtime still holds it: the status names its
// first tag, as containerd's ContainerStatus does, and otherwise the image
// the config asked for. ImageRef and ImageId are the image's ID (an image
// with no repo digest, as every image of the fake).
func (c *container) status(img *runtimeapi.Image) *runtimeapi.ContainerStatus {
	state := c.state()
	reason := c.reason
	if state == runtimeapi.ContainerState_CONTAINER_EXITED && reason == "" {
		reason = errorExitReason
		if c.exitCode == 0 {
			reason = completeExitReason
		}
	}
	var st, ft int64
	switch state {
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		st = c.startedAt
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		st, ft = c.startedAt, c.finishedAt
	}
	spec := c.cfg.GetImage()
	if len(img.GetRepoTags()) > 0 {
		spec = &runtimeapi.ImageSpec{Image: img.RepoTags[0]}
	}
	stop := c.cfg.GetStopSignal()
	if stop == runtimeapi.Signal_SIGNAL_RUNTIME_DEFAULT {
		stop = runtimeapi.Signal_SIGNAL_SIGTERM // the image's own is not modelled
	}
	return &runtimeapi.ContainerStatus{Id: c.id, Metadata: c.cfg.GetMetadata(), State: state, CreatedAt: c.createdAt,
		StartedAt: st, FinishedAt: ft, ExitCode: c.exitCode, Image: spec, ImageRef: c.imageRef, ImageId: c.imageRef,
		Reason: reason, Message: c.message, Labels: c.cfg.GetLabels(), Annotations: c.cfg.GetAnnotations(),
		Mounts: c.cfg.GetMounts(), LogPath: c.logPath, User: &runtimeapi.ContainerUser{}, StopSignal: stop}
}

func (c *container) listItem() *runtimeapi.Container {
	return &runtimeapi.Container{Id: c.id, PodSandboxId: c.sandboxID, Metadata: c.cfg.GetMetadata(), Image: c.cfg.GetImage(),
		ImageRef: c.imageRef, ImageId: c.imageRef, State: c.state(), CreatedAt: c.createdAt, Labels: c.cfg.GetLabels(), Annotations: c.cfg.GetAnnotations()}
}

func notFoundContainer(id string) error {
	return status.Errorf(codes.NotFound, "an error occurred when try to find container %q: not found", id)
}

// statusLocked is c's status with its image as the runtime holds it now.
func (r *Runtime) statusLocked(c *container) *runtimeapi.ContainerStatus {
	return c.status(r.images[c.imageRef])
}

// CreateContainer creates a CREATED container in a READY sandbox
// (container_create.go) from an image the runtime holds (resolveLocked).
func (r *Runtime) CreateContainer(_ context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	r.mu.Lock()
	sbID := lookup(r.sandboxes, req.PodSandboxId)
	sb := r.sandboxes[sbID]
	var err error
	switch cmd, smd := req.GetConfig().GetMetadata(), req.GetSandboxConfig().GetMetadata(); {
	case sb == nil:
		err = status.Errorf(codes.NotFound, "failed to find sandbox id %q: not found", req.PodSandboxId)
	case !sb.ready:
		err = status.Errorf(codes.Unknown, "sandbox container %q is not running", sbID)
	case cmd == nil:
		err = status.Error(codes.Unknown, "container config must include metadata")
	case smd == nil:
		err = status.Error(codes.Unknown, "pod sandbox config must include metadata")
	}
	if err != nil {
		r.mu.Unlock()
		return nil, err
	}
	cmd, smd := req.Config.Metadata, req.SandboxConfig.Metadata
	name := strings.Join([]string{cmd.Name, smd.Name, smd.Namespace, smd.Uid, strconv.FormatUint(uint64(cmd.Attempt), 10)}, "_")
	if owner, ok := r.names[name]; ok {
		r.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "failed to reserve container name %q; check if another CreateContainer request is in progress: %s",
			name, reservedErr(name, owner))
	}
	// The image is resolved after the name is reserved (which a failure
	// releases): an unknown image is NotFound whatever the name.
	img, err := r.resolveLocked(req.Config.GetImage().GetImage())
	if err != nil {
		r.mu.Unlock()
		return nil, imageError(req.Config.GetImage().GetImage(), err)
	}
	id := r.newIDLocked()
	r.seq++
	c := &container{id: id, sandboxID: sbID, name: name, seq: r.seq, cfg: proto.Clone(req.Config).(*runtimeapi.ContainerConfig),
		imageRef: img.Id, createdAt: r.now()}
	if dir := req.SandboxConfig.GetLogDirectory(); dir != "" && req.Config.LogPath != "" {
		c.logPath = filepath.Join(dir, req.Config.LogPath)
	}
	r.names[name] = id
	r.containers[id] = c
	ev := r.eventLocked(id, sbID, runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT)
	r.mu.Unlock()
	r.events.send(ev)
	return &runtimeapi.CreateContainerResponse{ContainerId: id}, nil
}

// StartContainer starts a CREATED container only (container_start.go).
func (r *Runtime) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	r.mu.Lock()
	c := r.containers[lookup(r.containers, req.ContainerId)]
	if c == nil {
		r.mu.Unlock()
		return nil, notFoundContainer(req.ContainerId)
	}
	if st := c.state(); st != runtimeapi.ContainerState_CONTAINER_CREATED {
		r.mu.Unlock()
		return nil, status.Errorf(codes.Unknown, "failed to set starting state for container %q: container is in %s state", c.id, st)
	}
	// From here on a failure leaves the container EXITED with StartError.
	var startErr error
	if sb := r.sandboxes[c.sandboxID]; sb == nil {
		startErr = fmt.Errorf("sandbox %q not found: not found", c.sandboxID)
	} else if !sb.ready {
		startErr = fmt.Errorf("sandbox container %q is not running", c.sandboxID)
	} else if err := ctx.Err(); err != nil {
		// The caller is gone (a shim killed mid-call): containerd creates
		// and starts the task under the call's context, so both fail.
		startErr = fmt.Errorf("failed to create containerd task: %w", err)
	}
	if startErr != nil {
		c.finishedAt, c.exitCode, c.reason, c.message = r.now(), errorStartExitCode, errorStartReason, startErr.Error()
		r.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		return nil, status.Error(codes.Unknown, startErr.Error())
	}
	c.startedAt = r.now()
	evs := []*runtimeapi.ContainerEventResponse{r.eventLocked(c.id, c.sandboxID, runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)}
	if code, ok := r.exitOnStart[c.cfg.GetMetadata().GetName()]; ok {
		evs = append(evs, r.killLocked(c, code)...)
	}
	r.mu.Unlock()
	r.events.send(evs...)
	return &runtimeapi.StartContainerResponse{}, nil
}

// killLocked ends a RUNNING container with code and returns its STOPPED
// event; a container in any other state keeps its first exit, and one whose
// process had died (ExitUnrecorded) its own exit time and code.
func (r *Runtime) killLocked(c *container, code int32) []*runtimeapi.ContainerEventResponse {
	if c.state() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil
	}
	c.finishedAt, c.exitCode = r.now(), code
	if e := c.exiting; e != nil { // it had died already: its own exit
		c.finishedAt, c.exitCode, c.exiting = e.at, e.code, nil
	}
	return []*runtimeapi.ContainerEventResponse{r.eventLocked(c.id, c.sandboxID, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)}
}

// StopContainer kills a RUNNING container: with a timeout its process dies
// of SIGTERM (143), without one of SIGKILL (137). Any other container, and
// an unknown one, is left as it is with success (container_stop.go).
func (r *Runtime) StopContainer(_ context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	r.mu.Lock()
	var evs []*runtimeapi.ContainerEventResponse
	if c := r.containers[lookup(r.containers, req.ContainerId)]; c != nil {
		code := int32(exitSIGKILL)
		if req.Timeout > 0 {
			code = exitSIGTERM
		}
		if c.exiting == nil { // else its task is gone: nothing to signal
			evs = r.killLocked(c, code)
		}
	}
	r.mu.Unlock()
	r.events.send(evs...)
	return &runtimeapi.StopContainerResponse{}, nil
}

// RemoveContainer kills a RUNNING container (137) and removes it; an
// unknown one is success (container_remove.go).
func (r *Runtime) RemoveContainer(_ context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	r.mu.Lock()
	var evs []*runtimeapi.ContainerEventResponse
	if c := r.containers[lookup(r.containers, req.ContainerId)]; c != nil {
		evs = r.removeContainerLocked(c)
	}
	r.mu.Unlock()
	r.events.send(evs...)
	return &runtimeapi.RemoveContainerResponse{}, nil
}

func (r *Runtime) removeContainerLocked(c *container) []*runtimeapi.ContainerEventResponse {
	evs := r.killLocked(c, exitSIGKILL)
	delete(r.containers, c.id)
	delete(r.names, c.name)
	return append(evs, r.eventLocked(c.id, c.sandboxID, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT))
}

// ContainerStatus answers as container_status.go, NotFound wording included.
func (r *Runtime) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.containers[lookup(r.containers, req.ContainerId)]
	if c == nil {
		return nil, notFoundContainer(req.ContainerId)
	}
	return &runtimeapi.ContainerStatusResponse{Status: r.statusLocked(c)}, nil
}

// ListContainers filters by ID and sandbox (each an ID or a unique
// prefix), state and labels (container_list.go).
func (r *Runtime) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := req.GetFilter()
	wantID, wantSB := f.GetId(), f.GetPodSandboxId()
	if id := lookup(r.containers, wantID); id != "" {
		wantID = id
	}
	if id := lookup(r.sandboxes, wantSB); id != "" {
		wantSB = id
	}
	out := &runtimeapi.ListContainersResponse{}
	for _, c := range sortedBySeq(r.containers, func(c *container) int { return c.seq }) {
		if (wantID != "" && wantID != c.id) || (wantSB != "" && wantSB != c.sandboxID) ||
			(f.GetState() != nil && f.GetState().State != c.state()) || !labelsMatch(f.GetLabelSelector(), c.cfg.GetLabels()) {
			continue
		}
		out.Containers = append(out.Containers, c.listItem())
	}
	return out, nil
}

// Exit plays a RUNNING container's process ending with code: the container
// is EXITED with its finish time and a STOPPED event follows.
func (r *Runtime) Exit(id string, code int32) error {
	return r.exit(id, code, "")
}

// ExitUnrecorded plays a RUNNING container's process ending with code
// while containerd handles the exit: it deletes the task before it records
// the exit (handleContainerExit, internal/cri/server/events.go), so the
// status says RUNNING and a StopContainer returns at once and changes
// nothing (container_stop.go) until record is called, which records the
// exit with the time it happened and sends the STOPPED event.
func (r *Runtime) ExitUnrecorded(id string, code int32) (record func(), err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.containers[lookup(r.containers, id)]
	if c == nil || c.state() != runtimeapi.ContainerState_CONTAINER_RUNNING || c.exiting != nil {
		return nil, fmt.Errorf("fakeruntime: no running container %q", id)
	}
	c.exiting = &exit{at: r.now(), code: code}
	return func() {
		r.mu.Lock()
		evs := r.killLocked(c, code)
		r.mu.Unlock()
		r.events.send(evs...)
	}, nil
}

// OOMKill plays the kernel killing a RUNNING container for memory: EXITED
// with 137 and reason OOMKilled.
func (r *Runtime) OOMKill(id string) error {
	return r.exit(id, exitSIGKILL, oomExitReason)
}

func (r *Runtime) exit(id string, code int32, reason string) error {
	r.mu.Lock()
	c := r.containers[lookup(r.containers, id)]
	if c == nil || c.state() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		r.mu.Unlock()
		return fmt.Errorf("fakeruntime: no running container %q", id)
	}
	if reason != "" {
		c.reason = reason
	}
	evs := r.killLocked(c, code)
	r.mu.Unlock()
	r.events.send(evs...)
	return nil
}

// ExitOnStart makes every container named name (its metadata name) exit
// with code right after it starts, as a process that fails at once.
func (r *Runtime) ExitOnStart(name string, code int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exitOnStart[name] = code
}

// Container is a copy of a container's status, as ContainerStatus would
// answer, and its sandbox's ID.
func (r *Runtime) Container(id string) (st *runtimeapi.ContainerStatus, sandboxID string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.containers[lookup(r.containers, id)]
	if c == nil {
		return nil, "", false
	}
	return proto.Clone(r.statusLocked(c)).(*runtimeapi.ContainerStatus), c.sandboxID, true
}

func (r *Runtime) containersOfLocked(sandboxID string) []*container {
	var out []*container
	for _, c := range r.containers {
		if c.sandboxID == sandboxID {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b *container) int { return a.seq - b.seq })
	return out
}
