// Package podstate is cri-shim's in-place pod restart (KEP-5532's
// RestartAllContainers) for an unmodified kubelet: when a container of a pod
// with a matching restart rule exits, the pod's containers are stopped
// gracefully and started again in the same sandbox, init containers first,
// with the kubelet doing the starting. docs/in-place-restart.md explains the
// mechanism and the kubelet code it relies on.
package podstate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	corev1 "k8s.io/api/core/v1"
)

// runtimeService is the part of the CRI the manager calls on the runtime itself.
type runtimeService interface {
	ListContainers(ctx context.Context, in *runtimeapi.ListContainersRequest, opts ...grpc.CallOption) (*runtimeapi.ListContainersResponse, error)
	ContainerStatus(ctx context.Context, in *runtimeapi.ContainerStatusRequest, opts ...grpc.CallOption) (*runtimeapi.ContainerStatusResponse, error)
	StopContainer(ctx context.Context, in *runtimeapi.StopContainerRequest, opts ...grpc.CallOption) (*runtimeapi.StopContainerResponse, error)
	CreateContainer(ctx context.Context, in *runtimeapi.CreateContainerRequest, opts ...grpc.CallOption) (*runtimeapi.CreateContainerResponse, error)
	StartContainer(ctx context.Context, in *runtimeapi.StartContainerRequest, opts ...grpc.CallOption) (*runtimeapi.StartContainerResponse, error)
	ExecSync(ctx context.Context, in *runtimeapi.ExecSyncRequest, opts ...grpc.CallOption) (*runtimeapi.ExecSyncResponse, error)
	ListPodSandbox(ctx context.Context, in *runtimeapi.ListPodSandboxRequest, opts ...grpc.CallOption) (*runtimeapi.ListPodSandboxResponse, error)
	RemoveContainer(ctx context.Context, in *runtimeapi.RemoveContainerRequest, opts ...grpc.CallOption) (*runtimeapi.RemoveContainerResponse, error)
	StopPodSandbox(ctx context.Context, in *runtimeapi.StopPodSandboxRequest, opts ...grpc.CallOption) (*runtimeapi.StopPodSandboxResponse, error)
	RemovePodSandbox(ctx context.Context, in *runtimeapi.RemovePodSandboxRequest, opts ...grpc.CallOption) (*runtimeapi.RemovePodSandboxResponse, error)
}

// Manager tracks the pods that carry restart rules and drives their restarts.
// Pods without rules cost nothing: the proxy's routes check Tracked() and
// forward raw when it is zero.
type Manager struct {
	rt    runtimeService
	st    *store
	bo    *backoff.Tracker
	log   *slog.Logger
	clock backoff.Clock

	tracked atomic.Int32

	mu sync.Mutex
	// saves counts state writes that succeeded (under mu), so a step can
	// tell whether a nested step already saved.
	saves uint64
	// saveFailing: the last save failed (under mu); its recovery is logged.
	saveFailing bool
	pods        map[string]*Pod   // by sandbox ID
	byID        map[string]string // container ID -> sandbox ID

	work    chan string
	active  map[string]context.CancelFunc // sandboxes with an executor running, and its stop (stopExecutor)
	metrics *metrics

	// sandboxListAt is when the kubelet last listed every sandbox (0 once a
	// container list consumed it); sandboxListSeen when it last did at all.
	// They tell the PLEG's relist from the stats provider's list (isRelist).
	sandboxListAt, sandboxListSeen atomic.Int64

	// trackAlso, when set, makes pods without restart rules tracked too when
	// it reports true for their annotations (pods that declare an
	// orchestrator may be restarted on its command).
	trackAlso func(annotations map[string]string) bool

	// eventsLive reports the event feed's subscription (events.Feed.Live);
	// without one, Run rescans every second.
	eventsLive func() uint64

	// exited holds the runtime's own encoded ContainerStatus answers for
	// exited instances of tracked pods, container ID -> *exitedStatus (see
	// exitedstatus.go). A sync.Map so a lookup that misses takes no lock.
	exited sync.Map
}

// EventsFrom tells the manager which event feed delivers exits to OnEvent, so
// its rescans can be rarer while the feed is subscribed. Call before Run.
func (m *Manager) EventsFrom(live func() uint64) { m.eventsLive = live }

// TrackAlso sets which pods without restart rules are tracked anyway. Call
// before serving.
func (m *Manager) TrackAlso(f func(annotations map[string]string) bool) { m.trackAlso = f }

// New loads the persisted pods from stateDir and returns a manager. Restarts
// that were in progress when the shim stopped resume when Run starts.
func New(rt runtimeService, stateDir string, bo *backoff.Tracker, log *slog.Logger) (*Manager, error) {
	st, err := newStore(stateDir)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		rt: rt, st: st, bo: bo, log: log, clock: backoff.RealClock,
		pods: map[string]*Pod{}, byID: map[string]string{},
		work: make(chan string, 64), active: map[string]context.CancelFunc{},
		metrics: newMetrics(), eventsLive: func() uint64 { return 0 },
	}
	pods, errs := st.load()
	for _, err := range errs {
		log.Error("podstate: unreadable state file skipped", "err", err)
	}
	// Stopped sandboxes first: where a pod has an old sandbox and a live
	// one, the live one's curve position is the one that stays.
	slices.SortStableFunc(pods, func(a, b *Pod) int {
		if a.Stopped == b.Stopped {
			return 0
		}
		if a.Stopped {
			return -1
		}
		return 1
	})
	for _, p := range pods {
		m.adopt(p)
		if p.Trigger != nil && p.Scope == "" {
			bo.Restore(backoff.Key{PodUID: p.UID}, p.SandboxID, backoff.State{Restarts: p.Restarts, NotBefore: p.NotBefore})
		}
		for c, n := range p.ContainerRestarts {
			bo.Restore(backoff.Key{PodUID: p.UID, Container: c}, p.SandboxID, backoff.State{Restarts: n})
		}
	}
	return m, nil
}

func (m *Manager) adopt(p *Pod) {
	if p.IDs == nil {
		p.IDs = map[string]string{}
	}
	if p.Latest == nil {
		p.Latest = map[string]string{}
	}
	if p.Creates == nil {
		p.Creates = map[string][]byte{}
	}
	if p.Phase == "" {
		p.Phase = PhaseRunning
	}
	m.pods[p.SandboxID] = p
	for id := range p.IDs {
		m.byID[id] = p.SandboxID
	}
	m.tracked.Store(int32(len(m.pods)))
}

// Tracked is the number of pods with rules; zero means every call may be forwarded raw.
func (m *Manager) Tracked() int { return int(m.tracked.Load()) }

// save writes p's record durably. An error (wrapping statefile.ErrNotDurable)
// means the change it records must not be acted on: the caller undoes it in
// memory (p.snapshot) and fails, a CRI call with Unavailable (unavailable),
// so the kubelet or the executor tries again. m.mu held.
// errPodRemoved refuses a save of a pod whose sandbox was removed meanwhile.
var errPodRemoved = errors.New("podstate: the pod's sandbox was removed")

func (m *Manager) save(p *Pod) error {
	if m.pods[p.SandboxID] != p {
		// Removed (or replaced) while a step held it: writing it would bring
		// back the record of a sandbox that is gone, and the step must stop.
		return errPodRemoved
	}
	if err := m.st.save(p); err != nil {
		if !m.saveFailing {
			m.log.Error("podstate: state write failed; restart steps are not carried out until writes succeed again",
				"pod", p.Namespace+"/"+p.Name, "err", err)
		}
		m.saveFailing = true
		return fmt.Errorf("podstate: recording pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	m.saves++
	if m.saveFailing {
		m.saveFailing = false
		m.log.Info("podstate: state writes succeed again")
	}
	return nil
}

// snapshot is a copy of p that a step puts back (*p = snap) when the record
// of its change could not be written: every map and slice a step edits in
// place is copied.
func (p *Pod) snapshot() Pod {
	c := *p
	c.Forced, c.Held, c.Creates, c.IDs = maps.Clone(p.Forced), maps.Clone(p.Held), maps.Clone(p.Creates), maps.Clone(p.IDs)
	c.Seq, c.ContainerRestarts = slices.Clone(p.Seq), maps.Clone(p.ContainerRestarts)
	c.Old, c.Fake, c.New, c.Retried = maps.Clone(p.Old), maps.Clone(p.Fake), maps.Clone(p.New), maps.Clone(p.Retried)
	c.Settled, c.Dead, c.Latest = maps.Clone(p.Settled), maps.Clone(p.Dead), maps.Clone(p.Latest)
	c.shownRunning, c.held, c.createReq = maps.Clone(p.shownRunning), maps.Clone(p.held), maps.Clone(p.createReq)
	if p.Trigger != nil {
		t := *p.Trigger
		c.Trigger = &t
	}
	return c
}

// kick asks Run to work on a sandbox; a full queue is fine, the periodic scan catches it.
func (m *Manager) kick(sandboxID string) {
	select {
	case m.work <- sandboxID:
	default:
	}
}

// Run drives restarts until ctx ends: it resumes what was in progress and
// rescans, so nothing depends on a single event (OnEvent sees exits at once).
func (m *Manager) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	m.reconcile(ctx)
	m.scan(ctx)
	ticks := 0
	var lastLive uint64
	for {
		select {
		case <-ctx.Done():
			return
		case id := <-m.work:
			m.startExecutor(ctx, &wg, id)
		case <-tick.C:
			if ticks++; ticks%10 == 0 {
				m.reconcile(ctx)
			}
			// While the event feed is subscribed, exits arrive through
			// OnEvent (and the kubelet's status calls): the scan is a
			// safety net every 10 s. Without a subscription, or after a new
			// one (events in between are lost), it runs at once.
			if live := m.eventsLive(); live == 0 || live != lastLive || ticks%10 == 0 {
				m.scan(ctx)
				lastLive = live
			}
			m.mu.Lock()
			var ids []string
			for id, p := range m.pods {
				if p.Phase != PhaseRunning {
					ids = append(ids, id)
				}
			}
			m.mu.Unlock()
			for _, id := range ids {
				m.startExecutor(ctx, &wg, id)
			}
		}
	}
}

func (m *Manager) startExecutor(ctx context.Context, wg *sync.WaitGroup, sandboxID string) {
	m.mu.Lock()
	if m.active[sandboxID] != nil || m.pods[sandboxID] == nil {
		m.mu.Unlock()
		return
	}
	ectx, cancel := context.WithCancel(ctx)
	m.active[sandboxID] = cancel
	m.mu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() {
			cancel()
			m.mu.Lock()
			delete(m.active, sandboxID)
			m.mu.Unlock()
		}()
		if err := m.execute(ectx, sandboxID); err != nil && ectx.Err() == nil {
			if m.abandonIfSandboxGone(ctx, sandboxID, err) {
				return
			}
			// Retried every second; logged when the error changes, not each time.
			m.mu.Lock()
			p := m.pods[sandboxID]
			repeat := p != nil && p.LastError == err.Error()
			if p != nil {
				p.LastError = err.Error()
			}
			m.mu.Unlock()
			if !repeat {
				m.log.Error("podstate: restart step failed; retrying every second", "sandbox", sandboxID, "err", err)
			}
		}
	}()
}

// abandon ends the pod's restart in progress for good: the pod is shown as it
// really is and no rule restarts anything in it any more. When that cannot be
// recorded nothing changes. m.mu held.
func (m *Manager) abandon(p *Pod) error {
	snap := p.snapshot()
	p.Phase, p.PhaseSince, p.Scope = PhaseRunning, m.clock.Now(), ""
	p.Old, p.Fake, p.New, p.shownRunning, p.held = nil, nil, nil, nil, nil
	p.Stopped = true
	if err := m.save(p); err != nil {
		*p = snap
		return err
	}
	m.stopExecutor(p.SandboxID)
	return nil
}

// abandonIfSandboxGone is called when a restart step failed: if the pod's
// sandbox is gone or no longer ready (stopped or removed by a client that
// bypassed the shim, or by the runtime), retrying would only create
// containers in a dead sandbox, so the restart is abandoned (reconcile drops
// the state of a removed sandbox). A runtime that does not answer changes
// nothing: the step is retried.
func (m *Manager) abandonIfSandboxGone(ctx context.Context, sandboxID string, stepErr error) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if ready, err := m.sandboxReady(ctx, sandboxID); err != nil || ready {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pods[sandboxID]
	if p == nil || p.Stopped {
		return true
	}
	lastErr, phase := p.LastError, p.Phase
	p.LastError = "restart abandoned, sandbox gone or not ready: " + stepErr.Error()
	if err := m.abandon(p); err != nil {
		// Tried again with the step, every second.
		p.LastError = lastErr
		return false
	}
	m.log.Warn("podstate: sandbox gone or not ready; restart abandoned", "pod", p.Namespace+"/"+p.Name, "phase", phase, "err", stepErr)
	return true
}

// reconcile forgets pods whose sandbox the runtime no longer has (removed
// while the shim was down, or by a client that bypassed it).
func (m *Manager) reconcile(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := m.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return // runtime down: keep everything, try again later
	}
	live := map[string]bool{}
	for _, sb := range resp.Items {
		live[sb.Id] = true
	}
	cs, err := m.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return
	}
	exists := make(map[string]bool, len(cs.Containers))
	for _, c := range cs.Containers {
		exists[c.Id] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// Forget instances the runtime no longer has (removed without going
	// through the shim; the kubelet's removals are seen by removeContainer),
	// so a pod's state stays the size of its live containers however often it
	// restarts. In any phase: a crash-looping pod is almost never Running.
	for _, p := range m.pods {
		pruned := false
		for id := range p.IDs {
			if !exists[id] && m.forget(p, id) {
				pruned = true
			}
		}
		if pruned {
			// A record that still names removed instances is harmless; the
			// next save carries the pruning (a failure is logged by save).
			_ = m.save(p)
		}
	}
	for id, p := range m.pods {
		if live[id] {
			continue
		}
		for cid := range p.IDs {
			delete(m.byID, cid)
		}
		delete(m.pods, id)
		m.stopExecutor(id)
		m.bo.Forget(p.UID, id)
		_ = m.st.remove(id)
		m.log.Info("podstate: sandbox gone from the runtime; state dropped", "pod", p.Namespace+"/"+p.Name, "sandbox", id)
	}
	m.tracked.Store(int32(len(m.pods)))
	m.pruneExited(exists)
	m.st.pruneProblems(live)
}

// scan classifies exits of tracked pods that nobody has asked about yet, so a
// restart starts within a second even if the kubelet is slow to look.
func (m *Manager) scan(ctx context.Context) {
	if m.Tracked() == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := m.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{
		Filter: &runtimeapi.ContainerFilter{State: &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_EXITED}},
	})
	if err != nil {
		return
	}
	vs := make([]cview, len(resp.Containers))
	for i, c := range resp.Containers {
		vs[i] = viewOf(c)
	}
	// An exit whose verdict could not be recorded is classified again at
	// the next look (save logged it).
	_ = m.classifyExited(ctx, vs)
}

// classifyExited decides, for exited containers of tracked pods not yet
// classified, whether the exit triggers a pod restart. It fetches exit codes
// outside the lock. An error means a verdict could not be recorded: that
// exit is unclassified still and must not be shown as it is.
func (m *Manager) classifyExited(ctx context.Context, cs []cview) error {
	var need []string
	m.mu.Lock()
	for _, c := range cs {
		if c.state != runtimeapi.ContainerState_CONTAINER_EXITED {
			continue
		}
		p := m.pods[c.sandbox]
		if p == nil {
			continue
		}
		markDead(p, c.id)
		if m.needsClassification(p, c.id, c.name) {
			need = append(need, c.id)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, id := range need {
		st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil {
			continue
		}
		if _, err := m.classify(st.GetStatus()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) needsClassification(p *Pod, id, name string) bool {
	if p.Phase != PhaseRunning || p.Stopped || (len(p.Rules[name]) == 0 && p.Forced[name] == "") || p.Settled[id] ||
		p.Held[name] { // terminated by the orchestrator (hold.go)
		return false
	}
	if _, ours := p.IDs[id]; !ours {
		return false
	}
	return true
}

func markDead(p *Pod, id string) {
	if _, ours := p.IDs[id]; !ours || p.Dead[id] {
		return
	}
	if p.Dead == nil {
		p.Dead = map[string]bool{}
	}
	p.Dead[id] = true
}

// forget drops a container instance that no longer exists from the pod's
// record, unless a restart in progress still refers to it (its trigger, the
// instances it stops or shows, the ones it created) or it is the newest
// instance of its container. It reports whether it dropped it. m.mu held.
func (m *Manager) forget(p *Pod, id string) bool {
	if _, ok := p.IDs[id]; !ok {
		return false
	}
	restarting := p.Phase != PhaseRunning
	if p.Latest[p.IDs[id]] == id || p.Fake[id] || (restarting && p.Trigger != nil && p.Trigger.ContainerID == id) {
		return false
	}
	if _, ok := p.New[id]; ok {
		return false
	}
	if _, ok := p.Old[id]; ok && restarting && !p.Dead[id] {
		return false // still to be stopped by the restart
	}
	delete(p.IDs, id)
	delete(p.Old, id)
	delete(p.shownRunning, id)
	delete(p.held, id)
	delete(p.Settled, id)
	delete(p.Dead, id)
	delete(m.byID, id)
	return true
}

func settle(p *Pod, id string) {
	if p.Settled == nil {
		p.Settled = map[string]bool{}
	}
	p.Settled[id] = true
}

// classify records an exited container's verdict and, on a matching rule,
// starts the pod's restart. It reports whether the exit triggered a restart.
// An error means the verdict could not be recorded: nothing changed, nothing
// was started, and the exit is classified again at the next look.
func (m *Manager) classify(s *runtimeapi.ContainerStatus) (bool, error) {
	if s == nil || s.State != runtimeapi.ContainerState_CONTAINER_EXITED {
		return false, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.classifyLocked(s)
}

// classifyLocked is classify with m.mu held.
func (m *Manager) classifyLocked(s *runtimeapi.ContainerStatus) (bool, error) {
	sid := m.byID[s.Id]
	p := m.pods[sid]
	name := s.GetMetadata().GetName()
	if p == nil {
		return false, nil
	}
	markDead(p, s.Id)
	if !m.needsClassification(p, s.Id, name) {
		return p.Phase != PhaseRunning && p.Trigger != nil && p.Trigger.ContainerID == s.Id, nil
	}
	snap := p.snapshot()
	action := p.Rules.Match(name, s.ExitCode)
	if forced, ok := p.Forced[name]; ok {
		action = corev1.ContainerRestartRuleAction(forced)
		delete(p.Forced, name)
	}
	if action != ActionRestartAllContainers && action != corev1.ContainerRestartRuleActionRestart {
		settle(p, s.Id)
		if err := m.save(p); err != nil {
			*p = snap
			return false, err
		}
		return false, nil
	}
	now := m.clock.Now()
	finished := time.Unix(0, s.FinishedAt)
	started := time.Unix(0, s.StartedAt)
	key, scope := backoff.Key{PodUID: p.UID}, ""
	if action == corev1.ContainerRestartRuleActionRestart {
		// One container: its own curve, and only its instances take part.
		key.Container, scope = name, name
	}
	prevBackoff, prevOwner, hadBackoff := m.bo.Get(key)
	bst := m.bo.Exited(key, p.SandboxID, started, finished)
	p.Phase, p.PhaseSince, p.Scope = PhaseTerminating, now, scope
	p.Trigger = &Trigger{Container: name, ContainerID: s.Id, ExitCode: s.ExitCode, StartedAt: started, FinishedAt: finished, Action: string(action), Delay: bst.LastDelay}
	p.Old = maps.Clone(p.IDs)
	if scope != "" {
		for id, n := range p.Old {
			if n != scope {
				delete(p.Old, id)
			}
		}
	}
	// Shown running until the swap: the trigger, and every instance that may
	// still run. Instances of containers that ran to completion (regular init
	// containers, by the recorded start order) or were seen exited are shown
	// as they are: a terminated init container shown running again is a
	// transition the kubelet refuses. execute() checks the rest against the
	// runtime before it stops anything.
	completed := map[string]bool{}
	for _, e := range p.Seq {
		if e.WaitExit {
			completed[e.Name] = true
		}
	}
	p.Fake = map[string]bool{s.Id: true}
	for id, n := range p.Old {
		if !p.Dead[id] && !completed[n] {
			p.Fake[id] = true
		}
		settle(p, id)
	}
	p.New, p.Refined, p.Retried = nil, false, nil
	// Only instances other than the trigger need checking against the
	// runtime (refineFake); with none, the set is final now and this one
	// save covers it.
	p.Refined = len(p.Fake) == 1
	p.NotBefore = bst.NotBefore
	p.LastError = ""
	if err := m.save(p); err != nil {
		// Not started: the curve does not move either.
		*p = snap
		if hadBackoff {
			m.bo.Restore(key, prevOwner, prevBackoff)
		} else {
			m.bo.Drop(key)
		}
		return false, err
	}
	if scope == "" {
		m.metrics.restarts.Inc()
	}
	m.metrics.delay.Observe(bst.LastDelay.Seconds())
	m.log.Info("podstate: restart rule matched", "action", action,
		"pod", p.Namespace+"/"+p.Name, "container", name, "exitCode", s.ExitCode, "delay", bst.LastDelay)
	m.kick(p.SandboxID)
	return true, nil
}

// execute performs the next steps of a pod's restart; every step is safe to
// repeat, so a shim killed at any point finishes the restart when it comes back.
func (m *Manager) execute(ctx context.Context, sandboxID string) error {
	m.mu.Lock()
	p := m.pods[sandboxID]
	if p == nil {
		m.mu.Unlock()
		return nil
	}
	phase, notBefore := p.Phase, p.NotBefore
	// Only instances not yet seen exited need stopping: a CRI container
	// never runs again once it has exited.
	old := make(map[string]string, len(p.Old))
	for id, n := range p.Old {
		if !p.Dead[id] {
			old[id] = n
		}
	}
	m.mu.Unlock()

	switch phase {
	case PhaseTerminating:
		if err := m.refineFake(ctx, sandboxID); err != nil {
			return err
		}
		if err := m.stopAll(ctx, old); err != nil {
			return err
		}
		if wait := notBefore.Sub(m.clock.Now()); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
		m.mu.Lock()
		if p.Phase == PhaseTerminating {
			// Not saved here: the first create's intent is saved with it
			// before anything is created. A shim killed in between resumes
			// in Terminating, whose steps are all done and repeat as no-ops.
			p.Phase, p.PhaseSince = PhaseStartup, m.clock.Now()
		}
		m.mu.Unlock()
		return m.replay(ctx, sandboxID)
	case PhaseStartup:
		return m.replay(ctx, sandboxID)
	}
	return nil
}

// refineFake drops from the "shown running" set the instances that had in fact
// already exited when the rule matched (other than the trigger). It runs before
// stopAll, so every instance it sees exited exited on its own; nothing is
// stopped until that is recorded.
func (m *Manager) refineFake(ctx context.Context, sandboxID string) error {
	m.mu.Lock()
	p := m.pods[sandboxID]
	if p == nil || p.Trigger == nil || p.Refined {
		m.mu.Unlock()
		return nil
	}
	var check []string
	for id := range p.Fake {
		if id != p.Trigger.ContainerID && !p.Dead[id] {
			check = append(check, id)
		}
	}
	m.mu.Unlock()
	for _, id := range check {
		st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
		if err != nil || st.GetStatus().GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		m.mu.Lock()
		delete(p.Fake, id)
		m.mu.Unlock()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p.Refined = true
	if err := m.save(p); err != nil {
		p.Refined = false
		return err
	}
	return nil
}

func (m *Manager) ensureStarted(ctx context.Context, id string) error {
	st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return fmt.Errorf("status of restarted container %s: %w", id, err)
	}
	if st.GetStatus().GetState() == runtimeapi.ContainerState_CONTAINER_CREATED {
		if _, err := m.rt.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id}); err != nil {
			return fmt.Errorf("start restarted container %s: %w", id, err)
		}
	}
	return nil
}
