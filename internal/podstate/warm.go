package podstate

// Warm restarts: a replayed container restored from the pod's latest
// checkpoint instead of started fresh, when the pod asks for it
// (docs/in-place-restart.md, "Warm restart"). The checkpoint side is
// internal/warm's; the server gives it to New (Options.Warm).

import (
	"context"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/restartapi"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// warmRequest is the request a replay creates the container with: the
// warm one if the pod asks for it and it can be had, else req. ws is nil
// for a cold create. A pod whose warm start of this container already failed
// in this restart is started cold.
func (m *Manager) warmRequest(ctx context.Context, p *restartrecord.Pod, name string, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerRequest, *restartapi.WarmStart) {
	failed := false
	m.with(p.SandboxID, func(p *restartrecord.Pod) { failed = p != nil && p.WarmFailed[name] })
	if m.opts.Warm == nil || failed {
		return req, nil
	}
	ws, err := m.opts.Warm(ctx, req)
	if err != nil {
		m.warmCold(p, name, err.Error())
		return req, nil
	}
	if ws == nil {
		return req, nil
	}
	return ws.Request, ws
}

// warmCold records that a container of a pod asking for warm restarts
// starts cold in this restart, and tells why.
func (m *Manager) warmCold(p *restartrecord.Pod, name, why string) {
	m.with(p.SandboxID, func(p *restartrecord.Pod) {
		if p == nil {
			return
		}
		if p.WarmFailed == nil {
			p.WarmFailed = map[string]bool{}
		}
		p.WarmFailed[name] = true
	})
	m.metrics.warm.WithLabelValues("cold").Inc()
	m.log.Warn("podstate: warm restart not possible; starting the container cold", "pod", p.Namespace+"/"+p.Name, "container", name, "why", why)
	m.opts.Observer.WarmRestart(refOf(p), restartapi.WarmResult{Container: name, Cold: why})
}

// warmStarted tells that a container was restored from its checkpoint.
func (m *Manager) warmStarted(p *restartrecord.Pod, name string, ws *restartapi.WarmStart) {
	age := m.clock.Now().Sub(ws.CheckpointedAt)
	m.metrics.warm.WithLabelValues("restored").Inc()
	m.log.Info("podstate: container restored from its pod's checkpoint", "pod", p.Namespace+"/"+p.Name, "container", name,
		"checkpoint", ws.Checkpoint, "age", age.Round(time.Second))
	m.opts.Observer.WarmRestart(refOf(p), restartapi.WarmResult{Container: name, Checkpoint: ws.Checkpoint, Age: age})
}
