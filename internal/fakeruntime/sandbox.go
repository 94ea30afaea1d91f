package fakeruntime

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type sandbox struct {
	id, name  string
	seq       int // creation order, for stable lists
	cfg       *runtimeapi.PodSandboxConfig
	handler   string
	ready     bool
	createdAt int64
	ip        string
	netClosed bool // the network is torn down (after a stop): no IP is reported
}

func (sb *sandbox) status() *runtimeapi.PodSandboxStatus {
	state := runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	if sb.ready {
		state = runtimeapi.PodSandboxState_SANDBOX_READY
	}
	ip := sb.ip
	if sb.netClosed {
		ip = ""
	}
	return &runtimeapi.PodSandboxStatus{Id: sb.id, Metadata: sb.cfg.GetMetadata(), State: state, CreatedAt: sb.createdAt,
		Network: &runtimeapi.PodSandboxNetworkStatus{Ip: ip},
		Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{
			Options: sb.cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()}},
		Labels: sb.cfg.GetLabels(), Annotations: sb.cfg.GetAnnotations(), RuntimeHandler: sb.handler}
}

func hostNetwork(cfg *runtimeapi.PodSandboxConfig) bool {
	return cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE
}

// reservedErr is containerd's registrar.ReservedErr.
func reservedErr(name, owner string) string {
	return fmt.Sprintf("name %q is reserved for %q", name, owner)
}

// RunPodSandbox creates a READY sandbox (sandbox_run.go).
func (r *Runtime) RunPodSandbox(_ context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	cfg := req.GetConfig()
	md := cfg.GetMetadata()
	if md == nil {
		return nil, status.Error(codes.Unknown, "sandbox config must include metadata")
	}
	name := strings.Join([]string{md.Name, md.Namespace, md.Uid, strconv.FormatUint(uint64(md.Attempt), 10)}, "_")
	r.mu.Lock()
	if owner, ok := r.names[name]; ok {
		r.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "failed to reserve sandbox name %q: %s", name, reservedErr(name, owner))
	}
	id := r.newIDLocked()
	r.nSandboxes++
	r.seq++
	sb := &sandbox{id: id, name: name, seq: r.seq, cfg: proto.Clone(cfg).(*runtimeapi.PodSandboxConfig), handler: req.RuntimeHandler,
		ready: true, createdAt: r.now()}
	if !hostNetwork(cfg) {
		sb.ip = r.opts.podIP(r.nSandboxes)
	}
	r.names[name] = id
	r.sandboxes[id] = sb
	evs := []*runtimeapi.ContainerEventResponse{r.eventLocked(id, id, runtimeapi.ContainerEventType_CONTAINER_CREATED_EVENT),
		r.eventLocked(id, id, runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT)}
	r.mu.Unlock()
	r.events.send(evs...)
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: id}, nil
}

// StopPodSandbox kills the sandbox's containers, then the sandbox, and
// tears its network down (sandbox_stop.go); an unknown sandbox is success.
func (r *Runtime) StopPodSandbox(_ context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	r.mu.Lock()
	var evs []*runtimeapi.ContainerEventResponse
	if id := lookup(r.sandboxes, req.PodSandboxId); id != "" {
		evs = r.stopSandboxLocked(r.sandboxes[id])
	}
	r.mu.Unlock()
	r.events.send(evs...)
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (r *Runtime) stopSandboxLocked(sb *sandbox) []*runtimeapi.ContainerEventResponse {
	var evs []*runtimeapi.ContainerEventResponse
	for _, c := range r.containersOfLocked(sb.id) {
		evs = append(evs, r.killLocked(c, 137)...)
	}
	if sb.ready {
		sb.ready = false
		evs = append(evs, r.eventLocked(sb.id, sb.id, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT))
	}
	sb.netClosed = true
	return evs
}

// RemovePodSandbox stops the sandbox, removes its containers and then
// itself (sandbox_remove.go); an unknown sandbox is success.
func (r *Runtime) RemovePodSandbox(_ context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	r.mu.Lock()
	var evs []*runtimeapi.ContainerEventResponse
	if id := lookup(r.sandboxes, req.PodSandboxId); id != "" {
		sb := r.sandboxes[id]
		evs = r.stopSandboxLocked(sb)
		for _, c := range r.containersOfLocked(id) {
			evs = append(evs, r.removeContainerLocked(c)...)
		}
		// The sandbox's DELETED event is sent before the sandbox leaves the
		// store, so it carries its (not ready) status.
		evs = append(evs, r.eventLocked(id, id, runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT))
		delete(r.names, sb.name)
		delete(r.sandboxes, id)
	}
	r.mu.Unlock()
	r.events.send(evs...)
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

// PodSandboxStatus answers as sandbox_status.go, NotFound wording included.
func (r *Runtime) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := lookup(r.sandboxes, req.PodSandboxId)
	if id == "" {
		return nil, status.Error(codes.NotFound, "an error occurred when try to find sandbox: not found")
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: r.sandboxes[id].status()}, nil
}

// ListPodSandbox filters by ID (or unique prefix), state and labels (sandbox_list.go).
func (r *Runtime) ListPodSandbox(_ context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := req.GetFilter()
	wantID := f.GetId()
	if id := lookup(r.sandboxes, wantID); id != "" {
		wantID = id
	}
	out := &runtimeapi.ListPodSandboxResponse{}
	for _, sb := range sortedBySeq(r.sandboxes, func(sb *sandbox) int { return sb.seq }) {
		id := sb.id
		if wantID != "" && wantID != id {
			continue
		}
		st := sb.status()
		if (f.GetState() != nil && f.GetState().State != st.State) || !labelsMatch(f.GetLabelSelector(), st.Labels) {
			continue
		}
		out.Items = append(out.Items, &runtimeapi.PodSandbox{Id: id, Metadata: st.Metadata, State: st.State, CreatedAt: st.CreatedAt,
			Labels: st.Labels, Annotations: st.Annotations, RuntimeHandler: st.RuntimeHandler})
	}
	return out, nil
}

// SandboxExit plays the sandbox's own process ending (the pause process
// killed behind the runtime's back): the sandbox turns NOTREADY with a
// STOPPED event and its containers are left as they are.
func (r *Runtime) SandboxExit(id string) error {
	r.mu.Lock()
	sb := r.sandboxes[lookup(r.sandboxes, id)]
	if sb == nil || !sb.ready {
		r.mu.Unlock()
		return fmt.Errorf("fakeruntime: no ready sandbox %q", id)
	}
	sb.ready = false
	ev := r.eventLocked(sb.id, sb.id, runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	r.mu.Unlock()
	r.events.send(ev)
	return nil
}

// Sandbox is a copy of a sandbox's status, as PodSandboxStatus would answer.
func (r *Runtime) Sandbox(id string) (*runtimeapi.PodSandboxStatus, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[lookup(r.sandboxes, id)]
	if sb == nil {
		return nil, false
	}
	return proto.Clone(sb.status()).(*runtimeapi.PodSandboxStatus), true
}

// Counts is how many sandboxes and containers the runtime holds.
func (r *Runtime) Counts() (sandboxes, containers int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sandboxes), len(r.containers)
}

func labelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// sortedBySeq lists m's values in creation order: containerd's order is
// unspecified, a stable one makes failures reproducible.
func sortedBySeq[T any](m map[string]T, seq func(T) int) []T {
	out := make([]T, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b T) int { return seq(a) - seq(b) })
	return out
}
