package podstate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/events"
)

// Annotations the kubelet puts on every container it creates
// (pkg/kubelet/kuberuntime/labels.go, kubelet v1.36.3).
const (
	annotationGracePeriod  = "io.kubernetes.pod.terminationGracePeriod"
	annotationPreStop      = "io.kubernetes.container.preStopHandler"
	annotationRestartCount = "io.kubernetes.container.restartCount"
	defaultGracePeriod     = 30 * time.Second
	// maxHold caps how long an instance stays held after a swap when no
	// full list releases it (see Pod.held).
	maxHold = time.Minute
)

// stopAll stops every old instance that still runs, in parallel, as the
// kubelet would: the preStop exec hook, then SIGTERM and SIGKILL after the
// pod's grace period (StopContainer's timeout).
func (m *Manager) stopAll(ctx context.Context, old map[string]string) error {
	var wg sync.WaitGroup
	errs := make(chan error, len(old))
	for id := range old {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.stopOne(ctx, id); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return errors.Join(collect(errs)...)
}

func collect(ch <-chan error) []error {
	var out []error
	for err := range ch {
		out = append(out, err)
	}
	return out
}

func (m *Manager) stopOne(ctx context.Context, id string) error {
	st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if status.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		return fmt.Errorf("status of %s: %w", id, err)
	}
	s := st.GetStatus()
	if s.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return nil
	}
	grace := defaultGracePeriod
	if v, err := strconv.ParseInt(s.Annotations[annotationGracePeriod], 10, 64); err == nil && v >= 0 {
		grace = time.Duration(v) * time.Second
	}
	start := m.clock.Now()
	if h := s.Annotations[annotationPreStop]; h != "" {
		m.runPreStop(ctx, id, h, grace)
	}
	left := grace - m.clock.Now().Sub(start)
	if left < 0 {
		left = 0
	}
	_, err = m.rt.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: int64(left / time.Second)})
	if err != nil && status.Code(err) != codes.NotFound {
		return fmt.Errorf("stop %s: %w", id, err)
	}
	return nil
}

// runPreStop runs an exec preStop hook; HTTP and sleep hooks are not run by the
// shim (logged), the container is then stopped with its full grace period.
func (m *Manager) runPreStop(ctx context.Context, id, handlerJSON string, grace time.Duration) {
	var h corev1.LifecycleHandler
	if err := json.Unmarshal([]byte(handlerJSON), &h); err != nil {
		m.log.Warn("podstate: unreadable preStop handler; skipped", "container", id, "err", err)
		return
	}
	switch {
	case h.Exec != nil:
		_, err := m.rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: h.Exec.Command, Timeout: int64(grace / time.Second)})
		if err != nil {
			m.log.Warn("podstate: preStop exec failed", "container", id, "err", err)
		}
	case h.Sleep != nil:
		d := time.Duration(h.Sleep.Seconds) * time.Second
		if d > grace {
			d = grace
		}
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	default:
		m.log.Warn("podstate: preStop handler type not run by the shim during an in-place restart", "container", id)
	}
}

// replay starts the pod's containers again as the kubelet first started them:
// its own recorded CreateContainer requests, in its order, each with the next
// restart count and log file; a container that ran to completion the first
// time (a regular init container) must exit 0 before the next one starts. The
// new instances stay hidden until all are up, then swap() shows them at once.
// Why the shim and not the kubelet does the starting: docs/in-place-restart.md.
func (m *Manager) replay(ctx context.Context, sandboxID string) error {
	m.mu.Lock()
	p := m.pods[sandboxID]
	if p == nil || p.Phase != PhaseStartup {
		m.mu.Unlock()
		return nil
	}
	seq := append([]SeqEntry(nil), p.Seq...)
	if p.Scope != "" {
		seq = []SeqEntry{{Name: p.Scope}}
	}
	m.mu.Unlock()
	if len(seq) == 0 {
		return fmt.Errorf("no recorded start order for the pod")
	}
	var exited []*runtimeapi.ContainerStatus
	for _, e := range seq {
		if !m.inPhase(sandboxID, PhaseStartup) {
			return nil // abandoned (the kubelet stopped the pod)
		}
		id, err := m.replayOne(ctx, sandboxID, e.Name)
		if err != nil {
			return err
		}
		s, err := m.waitFor(ctx, id, e.WaitExit)
		if err != nil {
			return err
		}
		if s.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED {
			exited = append(exited, s)
		}
		if e.WaitExit && s.ExitCode != 0 {
			// A genuine failure after the restart: show it; the pod's
			// restartPolicy decides (Never: the pod fails).
			m.log.Info("podstate: init container failed after the restart; handing the pod back to the kubelet",
				"container", e.Name, "exitCode", s.ExitCode)
			break
		}
	}
	return m.swap(sandboxID, exited)
}

// replayOne creates and starts one container again, once: a container created
// before a crash of the shim is found in p.New and only started if needed.
func (m *Manager) replayOne(ctx context.Context, sandboxID, name string) (string, error) {
	if err := m.adoptCreated(ctx, sandboxID, name); err != nil {
		return "", err
	}
	m.mu.Lock()
	p := m.pods[sandboxID]
	existing := ""
	for id, n := range p.New {
		if n == name {
			existing = id
		}
	}
	retried := p.Retried[name]
	m.mu.Unlock()
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
		m.mu.Lock()
		delete(p.New, existing)
		delete(p.IDs, existing)
		delete(m.byID, existing)
		if p.Retried == nil {
			p.Retried = map[string]bool{}
		}
		p.Retried[name] = true
		// Not recorded: the retry finds the removed instance NotFound
		// (interrupted) and goes on from there; nothing is created before
		// the create's intent below is recorded.
		err = m.save(p)
		m.mu.Unlock()
		if err != nil {
			return "", err
		}
	}
	m.mu.Lock()
	raw, logDir, req := p.Creates[name], p.LogDirectory, p.createReq[name]
	m.mu.Unlock()
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
	m.mu.Lock()
	creating := p.Creating
	p.Creating = intent
	err := m.save(p)
	if err != nil {
		p.Creating = creating
	}
	m.mu.Unlock()
	if err != nil {
		return "", err
	}
	resp, err := m.rt.CreateContainer(ctx, req)
	if err != nil {
		// req now carries this attempt; the retry starts again from the
		// recorded request, so a failed create does not skip an attempt.
		m.mu.Lock()
		delete(p.createReq, name)
		m.mu.Unlock()
		return "", fmt.Errorf("create %q again: %w", name, err)
	}
	id := resp.ContainerId
	reason := string(ActionRestartAllContainers)
	m.mu.Lock()
	if p.Scope != "" {
		reason = string(corev1.ContainerRestartRuleActionRestart)
	}
	m.mu.Unlock()
	m.metrics.containers.WithLabelValues(reason).Inc()
	m.mu.Lock()
	if p.New == nil {
		p.New = map[string]string{}
	}
	p.New[id] = name
	p.IDs[id] = name
	m.byID[id] = sandboxID
	if b, err := proto.Marshal(req); err == nil {
		p.Creates[name] = b
		if p.createReq == nil {
			p.createReq = map[string]*runtimeapi.CreateContainerRequest{}
		}
		p.createReq[name] = req
	}
	// Not saved here: the saved intent (p.Creating) lets a restarted shim
	// adopt this instance by name and attempt (adoptCreated); the next
	// intent or the swap saves it.
	m.mu.Unlock()
	// Just created: no need to ask its state before starting it.
	if _, err := m.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
		return id, fmt.Errorf("start restarted container %s: %w", id, err)
	}
	return id, nil
}

// sandboxReady reports whether the runtime lists the sandbox as ready; err
// when the runtime does not answer.
func (m *Manager) sandboxReady(ctx context.Context, sandboxID string) (bool, error) {
	resp, err := m.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{Id: sandboxID}})
	if err != nil {
		return false, fmt.Errorf("sandbox %s: %w", sandboxID, err)
	}
	for _, sb := range resp.Items {
		if sb.Id == sandboxID && sb.State == runtimeapi.PodSandboxState_SANDBOX_READY {
			return true, nil
		}
	}
	return false, nil
}

// adoptCreated takes over the container of a replay create whose intent was
// saved (p.Creating = "name/attempt") but whose ID was not: the shim was
// killed during or after the create. It may even have been started since, so
// it is found by name and attempt, not by a recomputed restart count.
func (m *Manager) adoptCreated(ctx context.Context, sandboxID, name string) error {
	m.mu.Lock()
	p := m.pods[sandboxID]
	a, pending := strings.CutPrefix(p.Creating, name+"/")
	m.mu.Unlock()
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
		m.mu.Lock()
		defer m.mu.Unlock()
		snap := p.snapshot()
		_, known := m.byID[c.Id]
		if p.New == nil {
			p.New = map[string]string{}
		}
		p.New[c.Id] = name
		p.IDs[c.Id] = name
		m.byID[c.Id] = sandboxID
		p.Creating = ""
		if err := m.save(p); err != nil {
			// Not adopted until recorded: the saved intent still finds it.
			*p = snap
			if !known {
				delete(m.byID, c.Id)
			}
			return err
		}
		break
	}
	return nil
}

// waitFor waits until a started container runs (or, with exit, has exited).
func (m *Manager) waitFor(ctx context.Context, id string, exit bool) (*runtimeapi.ContainerStatus, error) {
	deadline := m.clock.Now().Add(30 * time.Second)
	for {
		st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			return nil, fmt.Errorf("status of %s: %w", id, err)
		}
		s := st.GetStatus()
		switch {
		case !m.inPhase(m.sandboxOf(id), PhaseStartup):
			return s, nil
		case s.State == runtimeapi.ContainerState_CONTAINER_EXITED:
			return s, nil
		case !exit && s.State == runtimeapi.ContainerState_CONTAINER_RUNNING:
			return s, nil
		case !exit && m.clock.Now().After(deadline):
			return s, nil // up or not, the kubelet will judge it once it is shown
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (m *Manager) inPhase(sandboxID string, ph Phase) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pods[sandboxID]
	return p != nil && p.Phase == ph
}

func (m *Manager) sandboxOf(id string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byID[id]
}

// swap ends a restart: the new instances become visible and the old ones show
// their real (exited) state, as the previous instance of each container.
// A new instance that already exited again (a container that crashes at
// once) is classified in the same locked step, so the kubelet never sees its
// exit unclassified between the swap and the next scan. A swap that cannot be
// recorded is not made: the replay is retried and swaps again.
func (m *Manager) swap(sandboxID string, exited []*runtimeapi.ContainerStatus) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pods[sandboxID]
	if p == nil || p.Phase != PhaseStartup {
		for _, s := range exited {
			if _, err := m.classifyLocked(s); err != nil {
				return err
			}
		}
		return nil
	}
	snap, saves := p.snapshot(), m.saves
	for id, name := range p.New {
		p.Latest[name] = id
	}
	if p.Scope != "" {
		if p.ContainerRestarts == nil {
			p.ContainerRestarts = map[string]int{}
		}
		p.ContainerRestarts[p.Scope]++
	} else {
		p.Restarts++
	}
	p.Scope = ""
	took := m.clock.Now().Sub(p.Trigger.FinishedAt)
	p.Phase, p.PhaseSince = PhaseRunning, m.clock.Now()
	// Hold the instances the last full list showed running whose container
	// gets a new instance now (see Pod.held).
	replaced := map[string]bool{}
	for _, name := range p.New {
		replaced[name] = true
	}
	for id := range p.shownRunning {
		if replaced[p.IDs[id]] {
			if p.held == nil {
				p.held = map[string]time.Time{}
			}
			p.held[id] = m.clock.Now().Add(maxHold)
		}
	}
	p.Old, p.Fake, p.New, p.LastError, p.Creating = nil, nil, nil, "", ""
	var err error
	for _, s := range exited {
		if _, err = m.classifyLocked(s); err != nil {
			break
		}
	}
	if err == nil && m.saves == saves {
		err = m.save(p) // one save for the swap and what it classified
	}
	if err != nil && m.saves == saves {
		*p = snap
		return err
	}
	// Recorded (a classification's save carried the swap; an exit whose
	// verdict could not be recorded is classified at the next look).
	m.metrics.latency.Observe(took.Seconds())
	m.log.Info("podstate: pod restarted in place", "pod", p.Namespace+"/"+p.Name, "restarts", p.Restarts, "sinceExit", took.Round(time.Millisecond))
	return nil
}

var logFileRe = regexp.MustCompile(`^(\d+)\.log`)

// nextRestartCount is one more than both the recorded request's count and the
// highest N.log in the container's log directory, as the kubelet computes it
// when a container has no status left (calcRestartCountByLogDir).
func nextRestartCount(req *runtimeapi.CreateContainerRequest, logDir string) int {
	n := int(req.GetConfig().GetMetadata().GetAttempt()) + 1
	if v, err := strconv.Atoi(req.GetConfig().GetAnnotations()[annotationRestartCount]); err == nil && v+1 > n {
		n = v + 1
	}
	if logDir != "" {
		entries, _ := os.ReadDir(filepath.Join(logDir, req.GetConfig().GetMetadata().GetName()))
		for _, e := range entries {
			if mm := logFileRe.FindStringSubmatch(e.Name()); mm != nil {
				if v, err := strconv.Atoi(mm[1]); err == nil && v+1 > n {
					n = v + 1
				}
			}
		}
	}
	return n
}

// OnEvent takes the runtime's container events (the shim's event feed) so an
// exit is classified the moment it happens; Run's periodic scan covers gaps
// (reconnects, restarts of the shim or of containerd). Only the exited
// container's own status is decoded, and only for a tracked container.
func (m *Manager) OnEvent(e *events.Event) {
	if m.Tracked() == 0 {
		return
	}
	if e.Type == runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT {
		m.dropExited(e.ContainerID) // removed, maybe behind the shim
		return
	}
	if e.Type != runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT {
		return
	}
	m.mu.Lock()
	_, known := m.byID[e.ContainerID]
	m.mu.Unlock()
	if !known {
		return
	}
	s, err := e.Status()
	if err != nil {
		m.log.Warn("podstate: container event without a readable status", "container", e.ContainerID, "err", err)
		return
	}
	// A verdict that could not be recorded is made again at the next look
	// (save logged it).
	_, _ = m.classify(s)
}

type metrics struct {
	latency    prometheus.Histogram
	containers *prometheus.CounterVec
	restarts   prometheus.Counter
	delay      prometheus.Histogram
	problems   prometheus.Counter
	reused     prometheus.Counter
}

func newMetrics() *metrics {
	return &metrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "cri_shim_pod_restart_duration_seconds", Help: "From the triggering exit to all containers running again (backoff included).",
			Buckets: prometheus.ExponentialBuckets(0.25, 2, 12),
		}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cri_shim_pod_restarts_total", Help: "In-place pod restarts started by a RestartAllContainers rule.",
		}),
		containers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cri_shim_container_restarts_total", Help: "Containers started again by cri-shim, by reason (the rule action).",
		}, []string{"reason"}),
		delay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "cri_shim_restart_backoff_seconds", Help: "Backoff delay (KEP-4603 curve) applied before each restart cri-shim governs.",
			Buckets: []float64{0, 1, 2, 4, 8, 16, 32, 60, 120, 300},
		}),
		problems: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cri_shim_restart_rule_problems_total", Help: "Malformed restart-rules annotations (the pod runs with plain kubelet behaviour).",
		}),
		reused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cri_shim_exited_status_reused_total", Help: "ContainerStatus calls for exited instances of governed containers answered with the runtime's kept answer, without a round trip.",
		}),
	}
}

// Collectors are the manager's metrics, for the shim's registry.
func (m *Manager) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.metrics.restarts, m.metrics.delay, m.metrics.problems, m.metrics.latency, m.metrics.containers, m.metrics.reused}
}
