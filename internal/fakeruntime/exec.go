package fakeruntime

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ExecResult is what a command run by ExecSync did.
type ExecResult struct {
	Stdout, Stderr []byte
	ExitCode       int32
}

// Program plays a program of the containers' images for ExecSync: it gets
// the container's ID and the command (Cmd[0] is the program's name) and
// returns what the command did. ctx ends at the request's timeout; a
// program that outlives it is answered DeadlineExceeded, as containerd
// kills the exec then.
type Program func(ctx context.Context, containerID string, cmd []string) ExecResult

// AddProgram makes ExecSync run p for commands whose first word is name,
// in every container; nil removes it. A command with no program fails as
// containerd's does for a program missing from the image.
func (r *Runtime) AddProgram(name string, p Program) {
	r.hooksMu.Lock()
	defer r.hooksMu.Unlock()
	if p == nil {
		delete(r.programs, name)
		return
	}
	r.programs[name] = p
}

// ExecSync runs a command in a RUNNING container as containerd 2.4.2's
// container_execsync.go does, its errors wrapped in "failed to exec in
// container": an unknown container is NotFound, one that is not running
// Unknown; the command is the Program named by its first word, and one
// without a Program fails to start as runc fails (Unknown); a timeout
// that passes is DeadlineExceeded. The exit code, stdout and stderr are
// the program's.
func (r *Runtime) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	r.mu.Lock()
	c := r.containers[lookup(r.containers, req.ContainerId)]
	var st runtimeapi.ContainerState
	if c != nil {
		st = c.state()
	}
	r.mu.Unlock()
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "failed to exec in container: failed to find container %q in store: not found", req.ContainerId)
	}
	if st != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil, status.Errorf(codes.Unknown, "failed to exec in container: container is in %s state", st)
	}
	var p Program
	if len(req.Cmd) > 0 {
		r.hooksMu.Lock()
		p = r.programs[req.Cmd[0]]
		r.hooksMu.Unlock()
	}
	if p == nil {
		return nil, status.Errorf(codes.Unknown, "failed to exec in container: failed to start exec %q: %s", randomID(), noProgram(req.Cmd))
	}
	timeout := time.Duration(req.Timeout) * time.Second
	ectx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		ectx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	done := make(chan ExecResult, 1)
	go func() { done <- p(ectx, c.id, append([]string(nil), req.Cmd...)) }()
	select {
	case res := <-done:
		return &runtimeapi.ExecSyncResponse{Stdout: res.Stdout, Stderr: res.Stderr, ExitCode: res.ExitCode}, nil
	case <-ectx.Done():
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		return nil, status.Errorf(codes.DeadlineExceeded, "failed to exec in container: timeout %v exceeded: %v", timeout, context.DeadlineExceeded)
	}
}

// noProgram is runc's error for a command whose program is not in the
// container (runc v1.3 libcontainer: exec: ...: executable file not found).
func noProgram(cmd []string) string {
	name := ""
	if len(cmd) > 0 {
		name = cmd[0]
	}
	return fmt.Sprintf("OCI runtime exec failed: exec failed: unable to start container process: exec: %q: executable file not found in $PATH", name)
}
