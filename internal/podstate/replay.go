package podstate

// Replaying the kubelet's recorded creates: the new instances, started in the
// pod's order and hidden until the swap.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartapi"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// replay starts the pod's containers again as the kubelet first started them:
// its own recorded CreateContainer requests, in its order, each with the next
// restart count and log file; a container that ran to completion the first
// time (a regular init container) must exit 0 before the next one starts. The
// new instances stay hidden until all are up, then swap() shows them at once.
// Why the shim and not the kubelet does the starting: docs/in-place-restart.md.
func (m *Manager) replay(ctx context.Context, sandboxID string) error {
	startup, seq := false, []restartrecord.SeqEntry(nil)
	m.with(sandboxID, func(p *restartrecord.Pod) {
		if startup = p != nil && p.Phase == restartrecord.PhaseStartup; !startup {
			return
		}
		seq = slices.Clone(p.Seq)
		if p.Scope != "" {
			seq = []restartrecord.SeqEntry{{Name: p.Scope}}
		}
	})
	if !startup {
		return nil
	}
	if len(seq) == 0 {
		return fmt.Errorf("no recorded start order for the pod")
	}
	var exited []*runtimeapi.ContainerStatus
	handBack := false
	for _, e := range seq {
		if m.stopping() {
			return errStopping
		}
		id, err := m.replayOne(ctx, sandboxID, e.Name)
		if errors.Is(err, errNotStartup) {
			return nil // abandoned (the kubelet stopped the pod)
		}
		if err != nil {
			return err
		}
		s, err := m.waitFor(ctx, sandboxID, id, e.WaitExit)
		if err != nil {
			return err
		}
		if s.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED {
			exited = append(exited, s)
			m.trace(sandboxID, traceExited, "name", e.Name, "container", id, "exitCode", s.ExitCode)
		} else {
			m.trace(sandboxID, traceUp, "name", e.Name, "container", id, "state", s.GetState().String())
		}
		if e.WaitExit && s.ExitCode != 0 {
			// A genuine failure after the restart: show it; the pod's
			// restartPolicy decides (Never: the pod fails).
			m.log.Info("podstate: init container failed after the restart; handing the pod back to the kubelet",
				"container", e.Name, "exitCode", s.ExitCode)
			handBack = true
			break
		}
	}
	return m.swap(sandboxID, exited, handBack)
}

// errNotStartup: the pod's restart is no longer replaying (abandoned).
var errNotStartup = errors.New("podstate: the pod's restart is no longer in Startup")

// replayOne creates and starts one container again, once: a container created
// before a crash of the shim is found among the new instances and only started if needed.
func (m *Manager) replayOne(ctx context.Context, sandboxID, name string) (string, error) {
	if err := m.adoptCreated(ctx, sandboxID, name); err != nil {
		return "", err
	}
	var (
		p                *restartrecord.Pod
		existing, logDir string
		retried          bool
		raw              []byte
		req              *runtimeapi.CreateContainerRequest
	)
	m.with(sandboxID, func(pod *restartrecord.Pod) {
		if pod == nil || pod.Phase != restartrecord.PhaseStartup {
			return
		}
		p, existing, retried = pod, pod.NewOf(name), pod.Retried[name]
		raw, logDir, req = pod.Creates[name], pod.LogDirectory, pod.CreateReq[name]
	})
	if p == nil {
		return "", errNotStartup
	}
	if existing != "" {
		st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: existing})
		if err != nil && status.Code(err) != codes.NotFound {
			return "", fmt.Errorf("status of %s: %w", existing, err)
		}
		s := st.GetStatus()
		// Exited without ever running: our StartContainer was cut short (the
		// shim died mid-call and the runtime cancelled the start). That is not
		// the container failing; create it once more. A second start error is
		// real and is shown.
		interrupted := err != nil || (s.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED && s.GetStartedAt() == 0)
		if !interrupted || retried {
			return existing, m.ensureStarted(ctx, existing)
		}
		// A start that failed because the sandbox died is not an
		// interruption; and containerd 2.2.1 panics removing a container
		// whose sandbox is gone (nri GetIPs on a nil sandbox), so nothing is
		// removed then: the step fails and the restart is abandoned.
		if ready, err := m.sandboxReady(ctx, sandboxID); err != nil || !ready {
			return "", fmt.Errorf("start of %s failed and sandbox %s is not ready (%v)", existing, sandboxID, err)
		}
		m.log.Info("podstate: replayed start was interrupted; creating the container once more", "container", name)
		if _, err := m.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: existing}); err != nil && status.Code(err) != codes.NotFound {
			return "", fmt.Errorf("remove interrupted %s: %w", existing, err)
		}
		// Nothing is created before the create's intent below is
		// recorded; a retry after a failed write finds the removed
		// instance NotFound (interrupted) and goes on from there.
		if err := m.update(sandboxID, func(p *restartrecord.Pod) error {
			m.pods.RemoveInstance(p, existing)
			if p.Retried == nil {
				p.Retried = map[string]bool{}
			}
			p.Retried[name] = true
			return nil
		}); err != nil {
			return "", err
		}
	}
	if req == nil {
		if raw == nil {
			return "", fmt.Errorf("no recorded CreateContainer for %q", name)
		}
		req = &runtimeapi.CreateContainerRequest{}
		if err := proto.Unmarshal(raw, req); err != nil {
			return "", fmt.Errorf("recorded CreateContainer for %q: %w", name, err)
		}
	} else {
		// The request kept from this shim's own last create of the
		// container: no other create of it happened since (the kubelet's
		// drops the kept request), so its attempt is the newest log file's
		// and the directory need not be read.
		logDir = ""
	}
	n := nextRestartCount(req, logDir)
	cfg := req.GetConfig()
	cfg.Metadata.Attempt = uint32(n)
	if cfg.Annotations == nil {
		cfg.Annotations = map[string]string{}
	}
	cfg.Annotations[annotationRestartCount] = strconv.Itoa(n)
	cfg.LogPath = filepath.Join(name, fmt.Sprintf("%d.log", n))
	intent := fmt.Sprintf("%s/%d", name, n)
	if err := m.update(sandboxID, func(p *restartrecord.Pod) error { p.Creating = intent; return nil }); err != nil {
		return "", err
	}
	// A create that fails, or a restore that could not be staged, leaves
	// the next try to start again from the recorded request (req now
	// carries this attempt), so no attempt is skipped.
	dropReq := func(p *restartrecord.Pod) {
		if p != nil {
			delete(p.CreateReq, name)
		}
	}
	create, ws := m.warmRequest(ctx, p, name, req)
	if ws != nil {
		defer ws.Release()
	}
	m.trace(sandboxID, traceCreate, "name", name, "attempt", n)
	resp, err := m.rt.CreateContainer(ctx, create)
	if err != nil {
		m.with(sandboxID, dropReq)
		if ws != nil && ctx.Err() == nil && !m.stopping() {
			m.warmCold(p, name, "creating the container from checkpoint "+ws.Checkpoint+" failed: "+err.Error())
			return m.replayOne(ctx, sandboxID, name)
		}
		return "", fmt.Errorf("create %q again: %w", name, err)
	}
	id := resp.ContainerId
	m.trace(sandboxID, traceCreated, "name", name, "container", id)
	if ws != nil && ws.Created != nil {
		if err := ws.Created(id); err != nil {
			if _, rerr := m.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); rerr != nil && status.Code(rerr) != codes.NotFound {
				return "", fmt.Errorf("restore of %s from checkpoint %s could not be staged (%v); removing it: %w", name, ws.Checkpoint, err, rerr)
			}
			m.with(sandboxID, dropReq)
			if ctx.Err() == nil && !m.stopping() {
				m.warmCold(p, name, "staging the restore from checkpoint "+ws.Checkpoint+" failed: "+err.Error())
				return m.replayOne(ctx, sandboxID, name)
			}
			return "", fmt.Errorf("create %q again: staging its restore: %w", name, err)
		}
	}
	reason := string(podspec.ActionRestartAllContainers)
	m.with(sandboxID, func(p *restartrecord.Pod) {
		if p == nil {
			return
		}
		if p.Scope != "" {
			reason = string(corev1.ContainerRestartRuleActionRestart)
		}
		m.pods.AddInstance(p, id, name, restartrecord.PartNew)
		if b, err := proto.Marshal(req); err == nil {
			p.Creates[name] = b
			if p.CreateReq == nil {
				p.CreateReq = map[string]*runtimeapi.CreateContainerRequest{}
			}
			p.CreateReq[name] = req
		}
		// Not saved here: the saved intent (p.Creating) lets a restarted
		// shim adopt this instance by name and attempt (adoptCreated); the
		// next intent or the swap saves it.
	})
	m.metrics.containers.WithLabelValues(reason).Inc()
	// Just created: no need to ask its state before starting it.
	_, err = m.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id})
	if ws != nil && ws.Started != nil {
		err = ws.Started(id, err)
	}
	if err != nil {
		if ws != nil && ctx.Err() == nil && !m.stopping() {
			return m.coldAfterFailedRestore(ctx, p, sandboxID, name, id, ws, err)
		}
		return id, fmt.Errorf("start restarted container %s: %w", id, err)
	}
	m.trace(sandboxID, traceStarted, "name", name, "container", id)
	if ws != nil {
		m.warmStarted(p, name, ws)
	}
	return id, nil
}

// coldAfterFailedRestore removes a container whose restore from a checkpoint
// failed at its start and creates it again cold. The failed instance never
// ran and was never shown; once it is gone and forgotten, the replay goes on
// as if it had not been made.
func (m *Manager) coldAfterFailedRestore(ctx context.Context, p *restartrecord.Pod, sandboxID, name, id string, ws *restartapi.WarmStart, startErr error) (string, error) {
	if _, err := m.rt.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id}); err != nil && status.Code(err) != codes.NotFound {
		return id, fmt.Errorf("restore of %s from checkpoint %s failed (%v); removing it: %w", name, ws.Checkpoint, startErr, err)
	}
	m.with(sandboxID, func(p *restartrecord.Pod) {
		if p != nil {
			m.pods.RemoveInstance(p, id)
		}
	})
	m.warmCold(p, name, "restoring from checkpoint "+ws.Checkpoint+" failed: "+startErr.Error())
	return m.replayOne(ctx, sandboxID, name)
}

// sandboxReady reports whether the runtime has the sandbox, ready (asked
// of the runtime itself: the pod table may be a relist behind); err when
// the runtime does not answer.
func (m *Manager) sandboxReady(ctx context.Context, sandboxID string) (bool, error) {
	resp, err := m.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sandboxID})
	if status.Code(err) == codes.NotFound {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("sandbox %s: %w", sandboxID, err)
	}
	return resp.GetStatus().GetState() == runtimeapi.PodSandboxState_SANDBOX_READY, nil
}

// adoptCreated takes over the container of a replay create whose intent was
// saved (p.Creating = "name/attempt") but whose ID was not: the shim was
// killed during or after the create. It may even have been started since, so
// it is found by name and attempt, not by a recomputed restart count.
func (m *Manager) adoptCreated(ctx context.Context, sandboxID, name string) error {
	a, pending := "", false
	m.with(sandboxID, func(p *restartrecord.Pod) {
		if p != nil {
			a, pending = strings.CutPrefix(p.Creating, name+"/")
		}
	})
	attempt, err := strconv.ParseUint(a, 10, 32)
	if !pending || err != nil {
		return nil
	}
	resp, err := m.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sandboxID}})
	if err != nil {
		return fmt.Errorf("looking for an interrupted create of %q: %w", name, err)
	}
	for _, c := range resp.Containers {
		if c.GetMetadata().GetName() != name || c.GetMetadata().GetAttempt() != uint32(attempt) {
			continue
		}
		// Not adopted until recorded: the saved intent still finds it.
		return ignoreUntracked(m.update(sandboxID, func(p *restartrecord.Pod) error {
			if in := p.Inst(c.Id); in != nil {
				in.Part = restartrecord.PartNew
			} else {
				m.pods.AddInstance(p, c.Id, name, restartrecord.PartNew)
			}
			p.Creating = ""
			return nil
		}))
	}
	return nil
}

// waitFor waits until a started container runs (or, with exit, has exited).
// It looks again when the event feed reports the container started or
// stopped, or a pod's phase changes; without a live feed (or should an
// event be lost) it looks every stateRecheck.
func (m *Manager) waitFor(ctx context.Context, sandboxID, id string, exit bool) (*runtimeapi.ContainerStatus, error) {
	deadline := m.clock.Now().Add(30 * time.Second)
	defer m.stateWaits.Delete(id)
	for {
		changed := m.stateWait(id) // before the look, so no event falls between
		st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			return nil, fmt.Errorf("status of %s: %w", id, err)
		}
		s := st.GetStatus()
		startup, phase := false, (<-chan struct{})(nil)
		m.with(sandboxID, func(p *restartrecord.Pod) {
			startup, phase = p != nil && p.Phase == restartrecord.PhaseStartup, m.phaseWait()
		})
		switch {
		case !startup:
			return s, nil
		case s.State == runtimeapi.ContainerState_CONTAINER_EXITED:
			return s, nil
		case !exit && s.State == runtimeapi.ContainerState_CONTAINER_RUNNING:
			return s, nil
		case !exit && m.clock.Now().After(deadline):
			return s, nil // up or not, the kubelet will judge it once it is shown
		}
		recheck := stateRecheck
		if m.opts.EventsLive() == 0 {
			recheck = stateRecheckNoEvents
		}
		t := time.NewTimer(recheck)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-m.quit:
			t.Stop()
			return nil, errStopping
		case <-changed:
		case <-phase:
		case <-t.C:
		}
		t.Stop()
	}
}

// How often waitFor looks at a container's state with no event about it:
// with the event feed subscribed the look only covers a lost event;
// without it, it is the wait's resolution.
const (
	stateRecheck         = time.Second
	stateRecheckNoEvents = 50 * time.Millisecond
)

// stateWait returns a channel the event feed closes at the container's
// next start or stop event (OnEvent).
func (m *Manager) stateWait(id string) <-chan struct{} {
	w, ok := m.stateWaits.Load(id)
	if !ok {
		w, _ = m.stateWaits.LoadOrStore(id, make(chan struct{}))
	}
	return w.(chan struct{})
}
