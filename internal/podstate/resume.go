package podstate

// What a new shim process does before it answers the kubelet.

import (
	"context"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
	"github.com/cri-shim/cri-shim/internal/wire"
)

// Resume brings the records in step with the runtime before the shim answers
// its first call: a create the previous process made but had not recorded is
// adopted, pods whose sandbox went away are dropped, and exits that happened
// while no shim ran are judged against the rules. After an in-place upgrade
// the kubelet's calls wait on the socket that stayed open and reach the new
// process the moment it serves; without this, its first list could show an
// instance a restart created but had not recorded, beside the old one shown
// exited, and the kubelet would stop the pod. A runtime that does not answer
// leaves the work to Run.
func (m *Manager) Resume(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	type create struct{ sandbox, name string }
	var pending []create
	m.mu.Lock()
	for id, p := range m.pods.All() {
		if name, _, ok := strings.Cut(p.Creating, "/"); ok && p.Phase == restartrecord.PhaseStartup {
			pending = append(pending, create{id, name})
		}
	}
	m.mu.Unlock()
	for _, c := range pending {
		if err := m.adoptCreated(ctx, c.sandbox, c.name); err != nil {
			m.log.Warn("podstate: an interrupted create is adopted later, by the pod's restart", "sandbox", c.sandbox, "container", c.name, "err", err)
		}
	}
	m.reconcile(ctx)
	m.scan(ctx)
	m.recordShown(ctx)
}

// recordShown takes what the view shows running now as what the previous
// process's last lists showed: the kubelet may still read the statuses of
// such a list from this process, and a swap before its next relist must keep
// that picture (Instance.HeldUntil). Nothing is released here.
func (m *Manager) recordShown(ctx context.Context) {
	if m.Tracked() == 0 {
		return
	}
	resp, err := m.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return // the records' own picture (Pod.ResumeShown) stands
	}
	vs := make([]wire.Container, len(resp.Containers))
	for i, c := range resp.Containers {
		vs[i] = wire.ContainerOf(c)
	}
	_, _ = m.Verdicts(ctx, vs, nil)
}
