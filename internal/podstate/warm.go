package podstate

// Warm restarts: a replayed container restored from the pod's latest
// checkpoint instead of started fresh, when the pod asks for it
// (docs/in-place-restart.md, "Warm restart"). The checkpoint side is
// internal/criu's; the server wires it in with WarmFrom.

import (
	"context"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// WarmStart is the create request that restores one container from a
// checkpoint, and what the restart's event says of it.
type WarmStart struct {
	Request        *runtimeapi.CreateContainerRequest
	Checkpoint     string
	CheckpointedAt time.Time
	// Release ends the restore's use of the checkpoint; called once the
	// container started or failed to.
	Release func()
	// Created, when set, prepares the restore of the container Request
	// created (its ID), before its start; on error the container is
	// removed and created again cold.
	Created func(id string) error
	// Started, when set, is given StartContainer's result and returns the
	// start's: an error too when the container started without its
	// checkpoint.
	Started func(id string, err error) error
}

// WarmSource answers, for the cold create request of a replayed container,
// the request that restores it: nil when the pod did not ask for it (or the
// checkpoint has nothing for the container), an error saying why when it
// asked and no checkpoint can be used. It must not wait on the API server.
type WarmSource func(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*WarmStart, error)

// WarmFrom sets where warm restarts come from. Call before Run.
func (m *Manager) WarmFrom(f WarmSource) { m.warm = f }

// WarmResult is how a replayed container of a pod that asks for warm
// restarts was started: from Checkpoint (taken Age before), or cold, for
// the reason in Cold.
type WarmResult struct {
	Container  string
	Checkpoint string
	Age        time.Duration
	Cold       string
}

// warmRequest is the request a replay creates the container with: the
// warm one if the pod asks for it and it can be had, else req. ws is nil
// for a cold create. A pod whose warm start of this container already failed
// in this restart is started cold.
func (m *Manager) warmRequest(ctx context.Context, p *Pod, name string, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerRequest, *WarmStart) {
	failed := false
	m.with(p.SandboxID, func(p *Pod) { failed = p != nil && p.warmFailed[name] })
	if m.warm == nil || failed {
		return req, nil
	}
	ws, err := m.warm(ctx, req)
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
func (m *Manager) warmCold(p *Pod, name, why string) {
	m.with(p.SandboxID, func(p *Pod) {
		if p == nil {
			return
		}
		if p.warmFailed == nil {
			p.warmFailed = map[string]bool{}
		}
		p.warmFailed[name] = true
	})
	m.metrics.warm.WithLabelValues("cold").Inc()
	m.log.Warn("podstate: warm restart not possible; starting the container cold", "pod", p.Namespace+"/"+p.Name, "container", name, "why", why)
	m.observer.WarmRestart(refOf(p), WarmResult{Container: name, Cold: why})
}

// warmStarted tells that a container was restored from its checkpoint.
func (m *Manager) warmStarted(p *Pod, name string, ws *WarmStart) {
	age := m.clock.Now().Sub(ws.CheckpointedAt)
	m.metrics.warm.WithLabelValues("restored").Inc()
	m.log.Info("podstate: container restored from its pod's checkpoint", "pod", p.Namespace+"/"+p.Name, "container", name,
		"checkpoint", ws.Checkpoint, "age", age.Round(time.Second))
	m.observer.WarmRestart(refOf(p), WarmResult{Container: name, Checkpoint: ws.Checkpoint, Age: age})
}
