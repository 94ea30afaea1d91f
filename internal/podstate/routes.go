package podstate

import (
	"context"
	"errors"
	"io"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/wire"
)

const svc = "/runtime.v1.RuntimeService/"

// The in-place restart takes part in these CRI calls (proxy hooks). Every
// status path the kubelet reads (ListContainers, ContainerStatus,
// GetContainerEvents) goes through the same view, so the kubelet never sees
// a triggering exit as final, whichever call it happens to make first.
var (
	_ proxy.RunPodSandboxHook        = (*Manager)(nil)
	_ proxy.CreateContainerHook      = (*Manager)(nil)
	_ proxy.StopContainerHook        = (*Manager)(nil)
	_ proxy.RemoveContainerHook      = (*Manager)(nil)
	_ proxy.StopPodSandboxHook       = (*Manager)(nil)
	_ proxy.RemovePodSandboxHook     = (*Manager)(nil)
	_ proxy.ListPodSandboxObserver   = (*Manager)(nil)
	_ proxy.ListContainersBytesHook  = (*Manager)(nil)
	_ proxy.ContainerStatusBytesHook = (*Manager)(nil)
	_ proxy.GetContainerEventsHook   = (*Manager)(nil)
	_ proxy.StreamContainersHook     = (*Manager)(nil)
	_ proxy.Activity                 = (*Manager)(nil)
)

// HookActive: RunPodSandbox is always seen (it is where a pod's rules are
// read); the other calls only while a pod on the node is tracked.
func (m *Manager) HookActive(method proxy.Method) bool {
	if method == proxy.RunPodSandbox {
		return true
	}
	return m.Tracked() > 0
}

// ObserveListPodSandbox notes a ListPodSandbox call (see sawSandboxList).
func (m *Manager) ObserveListPodSandbox(reqLen int) { m.sawSandboxList(reqLen) }

func (m *Manager) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.RunPodSandboxRequest, runtimeapi.RunPodSandboxResponse]) (*runtimeapi.RunPodSandboxResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	cfg := req.GetConfig()
	rules, problems := ParseRules(cfg.GetAnnotations())
	md := cfg.GetMetadata()
	for _, pr := range problems {
		m.metrics.problems.Inc()
		m.log.Warn("podstate: "+pr, "pod", md.GetNamespace()+"/"+md.GetName())
	}
	if len(rules) == 0 && (m.trackAlso == nil || !m.trackAlso(cfg.GetAnnotations())) {
		if len(problems) > 0 {
			if err := m.st.saveProblems(&Pod{SandboxID: resp.PodSandboxId, UID: md.GetUid(), Name: md.GetName(),
				Namespace: md.GetNamespace(), Problems: problems, Phase: PhaseRunning}); err != nil {
				m.log.Error("podstate: recording annotation problems", "err", err)
			}
		}
		return resp, nil
	}
	p := &Pod{
		SandboxID: resp.PodSandboxId, UID: md.GetUid(), Name: md.GetName(), Namespace: md.GetNamespace(),
		LogDirectory: cfg.GetLogDirectory(), Rules: rules, Problems: problems, Phase: PhaseRunning,
		PhaseSince: m.clock.Now(),
	}
	m.mu.Lock()
	m.adopt(p)
	err = m.save(p)
	if err != nil {
		delete(m.pods, p.SandboxID)
		m.tracked.Store(int32(len(m.pods)))
	}
	m.mu.Unlock()
	if err != nil {
		// A pod whose rules could not be recorded would run without them
		// after a restart of the shim: its sandbox is taken down again and
		// the kubelet retries.
		m.rollbackSandbox(ctx, resp.PodSandboxId)
		return nil, unavailable(err)
	}
	m.log.Info("podstate: pod has restart rules", "pod", p.Namespace+"/"+p.Name, "sandbox", p.SandboxID, "containers", len(rules))
	return resp, nil
}

func (m *Manager) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest,
	next proxy.UnaryNext[runtimeapi.CreateContainerRequest, runtimeapi.CreateContainerResponse]) (*runtimeapi.CreateContainerResponse, error) {
	// While a pod restarts, the kubelet still sees its old containers running
	// and may create the next one (a main container after a sidecar it sees
	// started); that creation waits for the restart to finish, so the pod's
	// start order holds. The kubelet's own deadline (--runtime-request-timeout,
	// 2 minutes by default) bounds the wait. A container the restart creates
	// itself is refused at once (replace.go).
	if err := m.refuseReplacement(req); err != nil {
		return nil, err
	}
	if err := m.waitIdle(ctx, req.PodSandboxId); err != nil {
		return nil, err
	}
	completed := m.completedBefore(ctx, req)
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := m.recordCreate(req, resp.ContainerId, completed); err != nil {
		// A container the shim has no record of could not be replayed
		// after a restart of the shim: it is removed again and the kubelet
		// retries the create.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, rerr := m.rt.RemoveContainer(rctx, &runtimeapi.RemoveContainerRequest{ContainerId: resp.ContainerId}); rerr != nil && status.Code(rerr) != codes.NotFound {
			m.log.Error("podstate: removing a container whose creation could not be recorded", "container", resp.ContainerId, "err", rerr)
		}
		return nil, unavailable(err)
	}
	return resp, nil
}

// completedBefore returns, for the first creation of a container name in a
// tracked pod, the name of the container the kubelet created just before it
// when that one's newest instance has exited 0: a regular init container,
// which a restart must wait for. "" otherwise.
func (m *Manager) completedBefore(ctx context.Context, req *runtimeapi.CreateContainerRequest) string {
	name := req.GetConfig().GetMetadata().GetName()
	m.mu.Lock()
	p := m.pods[req.PodSandboxId]
	if p == nil || len(p.Seq) == 0 || slices.ContainsFunc(p.Seq, func(e SeqEntry) bool { return e.Name == name }) {
		m.mu.Unlock()
		return ""
	}
	prev := p.Seq[len(p.Seq)-1].Name
	prevID := p.Latest[prev]
	m.mu.Unlock()
	st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: prevID})
	if err == nil && st.GetStatus().GetState() == runtimeapi.ContainerState_CONTAINER_EXITED && st.GetStatus().GetExitCode() == 0 {
		return prev
	}
	return ""
}

// recordCreate remembers a kubelet-created container of a tracked pod. The
// first creation of each name records the pod's start order, and completed
// (completedBefore) marks the container before it as one to wait for. When
// that cannot be recorded nothing changes.
func (m *Manager) recordCreate(req *runtimeapi.CreateContainerRequest, id, completed string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pods[req.PodSandboxId]
	if p == nil {
		return nil
	}
	snap := p.snapshot()
	name := req.GetConfig().GetMetadata().GetName()
	if b, err := proto.Marshal(req); err == nil {
		p.Creates[name] = b
	}
	delete(p.createReq, name)
	p.IDs[id] = name
	m.byID[id] = p.SandboxID
	if !slices.ContainsFunc(p.Seq, func(e SeqEntry) bool { return e.Name == name }) {
		for i := range p.Seq {
			if p.Seq[i].Name == completed {
				p.Seq[i].WaitExit = true
			}
		}
		p.Seq = append(p.Seq, SeqEntry{Name: name})
	}
	p.Latest[name] = id
	if err := m.save(p); err != nil {
		*p = snap
		delete(m.byID, id)
		return err
	}
	return nil
}

// stopContainer: the kubelet stops a container itself (the pod is being
// deleted, a liveness probe failed): its exit is the kubelet's decision, so
// no rule restarts it.
func (m *Manager) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest,
	next proxy.UnaryNext[runtimeapi.StopContainerRequest, runtimeapi.StopContainerResponse]) (*runtimeapi.StopContainerResponse, error) {
	// An instance that already exited on its own keeps its rule (replace.go).
	if err := m.classifyBeforeStop(ctx, req.ContainerId); err != nil {
		return nil, unavailable(err)
	}
	m.mu.Lock()
	if p := m.pods[m.byID[req.ContainerId]]; p != nil && !p.Settled[req.ContainerId] {
		settle(p, req.ContainerId)
		if err := m.save(p); err != nil {
			// Not stopped: unrecorded, a rule could restart it after a
			// restart of the shim. The kubelet retries.
			delete(p.Settled, req.ContainerId)
			m.mu.Unlock()
			return nil, unavailable(err)
		}
	}
	m.mu.Unlock()
	return next(ctx, req)
}

// stopPodSandbox: the kubelet is stopping the pod (deleted, or terminal); a
// restart in progress is abandoned, the pod is shown as it really is, and no
// rule restarts anything in it any more.
func (m *Manager) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.StopPodSandboxRequest, runtimeapi.StopPodSandboxResponse]) (*runtimeapi.StopPodSandboxResponse, error) {
	m.mu.Lock()
	if p := m.pods[req.PodSandboxId]; p != nil && !p.Stopped {
		phase := p.Phase
		if err := m.abandon(p); err != nil {
			m.mu.Unlock()
			return nil, unavailable(err)
		}
		if phase != PhaseRunning {
			m.log.Info("podstate: pod is being stopped; restart abandoned", "pod", p.Namespace+"/"+p.Name, "phase", phase)
		}
	}
	m.mu.Unlock()
	return next(ctx, req)
}

// removeContainer forgets an instance the kubelet's container GC removed, so
// a crash-looping pod's record (saved at every restart step) does not grow
// with every restart. Not saved here: the next step's save carries it, and a
// restarted shim prunes what the runtime no longer has (reconcile).
func (m *Manager) RemoveContainer(ctx context.Context, req *runtimeapi.RemoveContainerRequest,
	next proxy.UnaryNext[runtimeapi.RemoveContainerRequest, runtimeapi.RemoveContainerResponse]) (*runtimeapi.RemoveContainerResponse, error) {
	// Dropped before (no cached answer outlives the container) and after (a
	// status asked while the removal ran may have been kept again).
	m.dropExited(req.ContainerId)
	resp, err := next(ctx, req)
	m.dropExited(req.ContainerId)
	if err != nil && status.Code(err) != codes.NotFound {
		return nil, err
	}
	m.mu.Lock()
	if p := m.pods[m.byID[req.ContainerId]]; p != nil {
		m.forget(p, req.ContainerId)
	}
	m.mu.Unlock()
	return resp, err
}

func (m *Manager) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest,
	next proxy.UnaryNext[runtimeapi.RemovePodSandboxRequest, runtimeapi.RemovePodSandboxResponse]) (*runtimeapi.RemovePodSandboxResponse, error) {
	resp, err := next(ctx, req)
	if err != nil && status.Code(err) != codes.NotFound {
		return nil, err
	}
	m.mu.Lock()
	// The state file, or a problems-only record, of this sandbox: under the
	// lock, as every save is, so that no save of the pod runs meanwhile
	// (the store's sequence map is not safe for concurrent writes) and none
	// recreates the file afterwards (save skips pods no longer tracked).
	if rerr := m.st.remove(req.PodSandboxId); rerr != nil {
		m.log.Error("podstate: removing state file", "err", rerr)
	}
	if p := m.pods[req.PodSandboxId]; p != nil {
		for id := range p.IDs {
			delete(m.byID, id)
		}
		delete(m.pods, req.PodSandboxId)
		m.stopExecutor(req.PodSandboxId)
		m.tracked.Store(int32(len(m.pods)))
		// Only the curve keys this sandbox owns: another (live) sandbox
		// of the same pod keeps its position (backoff.Tracker).
		m.bo.Forget(p.UID, req.PodSandboxId)
	}
	m.mu.Unlock()
	return resp, err
}

func (m *Manager) listContainers(ctx context.Context, req *runtimeapi.ListContainersRequest,
	next proxy.UnaryNext[runtimeapi.ListContainersRequest, runtimeapi.ListContainersResponse]) (*runtimeapi.ListContainersResponse, error) {
	// A state filter is applied after the view: an exited old instance that is
	// shown as running must match a "running" filter.
	want := req.GetFilter().GetState()
	if want != nil {
		req.Filter.State = nil
	}
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if resp.Containers, err = m.viewContainers(ctx, resp.Containers, want, want == nil && isFull(req.GetFilter())); err != nil {
		return nil, err
	}
	return resp, nil
}

// StreamContainers is ListContainers in batches (kubelets with CRI list
// streaming): every batch goes through the same view.
func (m *Manager) StreamContainers(ctx context.Context, req *runtimeapi.StreamContainersRequest,
	send func(*runtimeapi.StreamContainersResponse) error,
	next proxy.StreamNext[runtimeapi.StreamContainersRequest, runtimeapi.StreamContainersResponse]) error {
	want := req.GetFilter().GetState()
	if want != nil {
		req.Filter.State = nil
	}
	cs, err := next(ctx, req)
	if err != nil {
		return err
	}
	for {
		r, err := cs.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if r.Containers, err = m.viewContainers(ctx, r.Containers, want, want == nil && isFull(req.GetFilter())); err != nil {
			return err
		}
		if err := send(r); err != nil {
			return err
		}
	}
}

// isFull says whether a list (its state filter already taken out) shows every
// container, as the kubelet's PLEG relist does.
func isFull(f *runtimeapi.ContainerFilter) bool {
	return f.GetState() == nil && f.GetId() == "" && f.GetPodSandboxId() == "" && len(f.GetLabelSelector()) == 0
}

// sawSandboxList notes a ListPodSandbox without a filter: an encoded request
// of at most 2 bytes (no filter, or an empty one, as the kubelet sends).
func (m *Manager) sawSandboxList(reqLen int) {
	if reqLen > 2 || m.Tracked() == 0 {
		return
	}
	now := time.Now().UnixNano()
	m.sandboxListAt.Store(now)
	m.sandboxListSeen.Store(now)
}

// relistWindow is how soon after its sandbox list the PLEG lists containers.
const relistWindow = 500 * time.Millisecond

// isRelist says whether a full container list is the PLEG's relist, which
// the kubelet's next status reads follow, rather than the stats provider's,
// which nothing follows. The PLEG lists every sandbox and then every
// container (kuberuntime_manager.go, GetPods); the CRI stats provider lists
// every container and then every sandbox (stats/cri_stats_provider.go,
// getPodAndContainerMaps), with the same empty filters. A container list
// that closely follows a sandbox list is the relist. A caller that never
// lists sandboxes (not a kubelet v1.36) has every full list taken as one.
func (m *Manager) isRelist() bool {
	seen := m.sandboxListSeen.Load()
	if seen == 0 || time.Since(time.Unix(0, seen)) > 10*time.Second {
		return true
	}
	at := m.sandboxListAt.Swap(0)
	return at != 0 && time.Since(time.Unix(0, at)) < relistWindow
}

// viewContainers classifies unseen exits, then applies the restart view and
// the caller's state filter to a list of containers.
func (m *Manager) viewContainers(ctx context.Context, cs []*runtimeapi.Container, want *runtimeapi.ContainerStateValue, full bool) ([]*runtimeapi.Container, error) {
	vs := make([]cview, len(cs))
	for i, c := range cs {
		vs[i] = viewOf(c)
	}
	verdicts, err := m.viewList(ctx, vs, want, full)
	if err != nil {
		return nil, err
	}
	out := cs[:0]
	for i, c := range cs {
		if verdicts[i].hide {
			continue
		}
		if verdicts[i].fake {
			c.State = runtimeapi.ContainerState_CONTAINER_RUNNING
		}
		out = append(out, c)
	}
	return out, nil
}

// viewList decides, for each listed container, whether the kubelet sees it
// and whether it is shown running although it is not. A fake verdict is only
// given to a container that is not running. When an exit's verdict could not
// be recorded the list is not answered (Unavailable): shown as it is, the
// exit would have the kubelet restart the container itself.
func (m *Manager) viewList(ctx context.Context, vs []cview, want *runtimeapi.ContainerStateValue, full bool) ([]verdict, error) {
	if err := m.classifyExited(ctx, vs); err != nil {
		return nil, unavailable(err)
	}
	// Only the PLEG's relist releases holds and records what was shown: the
	// kubelet's next statuses follow it (see Pod.held).
	full = full && m.isRelist()
	m.mu.Lock()
	defer m.mu.Unlock()
	if full {
		for _, p := range m.pods {
			p.held = nil
			clear(p.shownRunning)
		}
	}
	out := make([]verdict, len(vs))
	for i, c := range vs {
		state := c.state
		p := m.pods[c.sandbox]
		if p != nil {
			hide, fake := m.view(p, c.id)
			if hide {
				out[i].hide = true
				continue
			}
			if fake && state != runtimeapi.ContainerState_CONTAINER_RUNNING {
				out[i].fake = true
				state = runtimeapi.ContainerState_CONTAINER_RUNNING
			}
		}
		if want != nil && state != want.State {
			out[i].hide = true
			continue
		}
		if full && p != nil && state == runtimeapi.ContainerState_CONTAINER_RUNNING {
			if p.shownRunning == nil {
				p.shownRunning = map[string]bool{}
			}
			p.shownRunning[c.id] = true
		}
	}
	return out, nil
}

// listContainersBytes serves an unfiltered ListContainers (the kubelet's
// relist, and its per-pod lists by label) on the encoded messages: the
// response is read with protowire, and only when the view changes something
// is it edited, entry by entry, without decoding the rest. A request with a
// filter, or a message the peek cannot read, takes the decoded path.
func (m *Manager) ListContainersBytes(ctx context.Context, req []byte, next proxy.BytesNext) ([]byte, error) {
	filtered, err := peekListFilter(req)
	if err != nil || filtered {
		return m.listContainersDecoded(ctx, req, next)
	}
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	var vs []cview
	if err := wire.Each(resp, func(f wire.Field) error {
		if f.Num != fListContainers || f.Type != protowire.BytesType {
			return nil
		}
		v, err := peekContainer(f.Bytes)
		vs = append(vs, v)
		return err
	}); err != nil {
		return m.viewDecoded(ctx, resp, true)
	}
	verdicts, err := m.viewList(ctx, vs, nil, true)
	if err != nil {
		return nil, err
	}
	for _, v := range verdicts {
		if v.hide || v.fake {
			return editList(resp, verdicts)
		}
	}
	return resp, nil
}

// listContainersDecoded is listContainers on decoded messages, for a
// request listContainersBytes does not serve encoded.
func (m *Manager) listContainersDecoded(ctx context.Context, req []byte, next proxy.BytesNext) ([]byte, error) {
	var r runtimeapi.ListContainersRequest
	if err := proto.Unmarshal(req, &r); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "cri-shim: ListContainersRequest: %v", err)
	}
	resp, err := m.listContainers(ctx, &r, func(ctx context.Context, r *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
		b, err := proto.Marshal(r)
		if err != nil {
			return nil, err
		}
		out, err := next(ctx, b)
		if err != nil {
			return nil, err
		}
		resp := &runtimeapi.ListContainersResponse{}
		return resp, proto.Unmarshal(out, resp)
	})
	if err != nil {
		return nil, err
	}
	return proto.Marshal(resp)
}

// viewDecoded applies the view to an unfiltered list response it decodes.
func (m *Manager) viewDecoded(ctx context.Context, resp []byte, full bool) ([]byte, error) {
	var r runtimeapi.ListContainersResponse
	if err := proto.Unmarshal(resp, &r); err != nil {
		return nil, status.Errorf(codes.Internal, "cri-shim: runtime's ListContainersResponse: %v", err)
	}
	cs, err := m.viewContainers(ctx, r.Containers, nil, full)
	if err != nil {
		return nil, err
	}
	r.Containers = cs
	return proto.Marshal(&r)
}

// containerStatusBytes is containerStatus on the encoded response: only a
// status the view may change (an exit, or an instance shown running) is
// decoded; a running container's passes through as the runtime sent it.
func (m *Manager) ContainerStatusBytes(ctx context.Context, req []byte, next proxy.BytesNext) ([]byte, error) {
	id, plain, perr := peekStatusRequest(req)
	plain = plain && perr == nil
	if plain {
		if b := m.cachedExited(id); b != nil {
			return b, nil
		}
	}
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if v, ok, err := peekStatus(resp); err == nil && (!ok || !m.statusMayChange(v)) {
		if plain && ok && v.id == id {
			m.keepExited(v, resp)
		}
		return resp, nil
	}
	var r runtimeapi.ContainerStatusResponse
	if err := proto.Unmarshal(resp, &r); err != nil {
		return nil, status.Errorf(codes.Internal, "cri-shim: runtime's ContainerStatusResponse: %v", err)
	}
	if err := m.fixStatus(r.GetStatus()); err != nil {
		return nil, unavailable(err)
	}
	return proto.Marshal(&r)
}

// statusMayChange says whether fixStatus could do anything with this status:
// classify an exit, or show a not-running instance as running.
func (m *Manager) statusMayChange(v cview) bool {
	if v.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
		return false // fixStatus only ever shows RUNNING
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.statusMayChangeLocked(v)
}

// statusMayChangeLocked is statusMayChange with m.mu held.
func (m *Manager) statusMayChangeLocked(v cview) bool {
	if v.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
		return false
	}
	p := m.pods[m.byID[v.id]]
	if p == nil {
		return false
	}
	exited := v.state == runtimeapi.ContainerState_CONTAINER_EXITED
	if exited && (!p.Dead[v.id] || m.needsClassification(p, v.id, v.name)) {
		return true
	}
	_, fake := m.view(p, v.id)
	_, held := p.held[v.id]
	return fake || held
}

func (m *Manager) containerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest,
	next proxy.UnaryNext[runtimeapi.ContainerStatusRequest, runtimeapi.ContainerStatusResponse]) (*runtimeapi.ContainerStatusResponse, error) {
	resp, err := next(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := m.fixStatus(resp.GetStatus()); err != nil {
		return nil, unavailable(err)
	}
	return resp, nil
}

// fixStatus classifies an exit it is the first to see and shows an old
// instance of a restarting pod as still running. An error: the exit's
// verdict could not be recorded, and the status must not be shown.
func (m *Manager) fixStatus(s *runtimeapi.ContainerStatus) error {
	if s == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.State == runtimeapi.ContainerState_CONTAINER_EXITED {
		if _, err := m.classifyLocked(s); err != nil {
			return err
		}
	}
	p := m.pods[m.byID[s.Id]]
	if p == nil {
		return nil
	}
	_, fake := m.view(p, s.Id)
	if until, ok := p.held[s.Id]; ok {
		if m.clock.Now().Before(until) && !p.Stopped {
			fake = true // listed running before a swap: keep to that list's picture
		} else {
			delete(p.held, s.Id)
		}
	}
	if fake {
		s.State = runtimeapi.ContainerState_CONTAINER_RUNNING
		s.FinishedAt, s.ExitCode, s.Reason, s.Message = 0, 0, "", ""
	}
	return nil
}

// view says how the kubelet sees one container of a tracked pod right now:
// during a restart, the instances that were running (and the trigger) still
// run, and the new instances do not exist yet. Called with m.mu held.
func (m *Manager) view(p *Pod, id string) (hide, fakeRunning bool) {
	if p.Phase == PhaseRunning {
		return false, false
	}
	if _, isNew := p.New[id]; isNew {
		return true, false
	}
	return false, p.Fake[id]
}

// GetContainerEvents relays the runtime's container events to the kubelet
// without the ones the restart view hides (see dropEvent).
func (m *Manager) GetContainerEvents(ctx context.Context, req *runtimeapi.GetEventsRequest,
	send func(*runtimeapi.ContainerEventResponse) error,
	next proxy.StreamNext[runtimeapi.GetEventsRequest, runtimeapi.ContainerEventResponse]) error {
	cs, err := next(ctx, req)
	if err != nil {
		return err
	}
	for {
		e, err := cs.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if m.Tracked() > 0 && m.dropEvent(e) {
			continue
		}
		if err := send(e); err != nil {
			return err
		}
	}
}

// dropEvent says whether an event is kept from the kubelet. An exit whose
// verdict could not be recorded is dropped too: the kubelet's next list is
// answered Unavailable until it is (viewList), so it never sees the exit
// unclassified.
func (m *Manager) dropEvent(e *runtimeapi.ContainerEventResponse) bool {
	for _, s := range e.ContainersStatuses {
		if s.Id != e.ContainerId {
			continue
		}
		if restarts, err := m.classify(s); restarts || err != nil {
			return true
		}
	}
	m.mu.Lock()
	p := m.pods[m.byID[e.ContainerId]]
	if p == nil {
		m.mu.Unlock()
		return false
	}
	hide, fake := m.view(p, e.ContainerId)
	m.mu.Unlock()
	if hide || fake {
		return true
	}
	for _, s := range e.ContainersStatuses {
		if err := m.fixStatus(s); err != nil {
			return true
		}
	}
	return false
}

// unavailable is the CRI answer to a call whose step was not carried out
// because its record could not be made durable: the kubelet retries it.
func unavailable(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unavailable, "cri-shim: "+err.Error()+"; not carried out")
}

// rollbackSandbox stops and removes a sandbox this call created, under a
// fresh context (the caller's may be the reason it failed).
func (m *Manager) rollbackSandbox(ctx context.Context, id string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if _, err := m.rt.StopPodSandbox(rctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		m.log.Error("podstate: stopping the sandbox of a failed RunPodSandbox", "sandbox", id, "err", err)
	}
	if _, err := m.rt.RemovePodSandbox(rctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		m.log.Error("podstate: removing the sandbox of a failed RunPodSandbox", "sandbox", id, "err", err)
	}
}

// waitIdle returns once the sandbox has no restart in progress.
func (m *Manager) waitIdle(ctx context.Context, sandboxID string) error {
	for {
		m.mu.Lock()
		p := m.pods[sandboxID]
		busy := p != nil && p.Phase != PhaseRunning
		m.mu.Unlock()
		if !busy {
			return nil
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
