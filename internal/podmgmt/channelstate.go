package podmgmt

// The state of each pod's channel: connection, refusals, termination and the
// exit codes the orchestrator asked for; recorded in the store and read by the
// CLI.

import (
	"strings"

	"github.com/cri-shim/cri-shim/internal/store"
)

// setConnected sets the pod's connected gauge, unless the pod is closed or
// gone (their series are deleted under m.mu, so none comes back).
func (m *Manager) setConnected(p *pod, v float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pods[p.SandboxID] == p && !p.terminating.Load() && p.cancel != nil {
		m.metrics.connected.WithLabelValues(p.Namespace, p.Name).Set(v)
	}
}

// refuse ends a pod's channel for good: logged, counted, shown.
func (m *Manager) refuse(p *pod, r *refusal) {
	m.metrics.refused.WithLabelValues(r.reason).Inc()
	m.mu.Lock()
	m.metrics.connected.DeleteLabelValues(p.Namespace, p.Name)
	m.mu.Unlock()
	m.log.Warn("podmgmt: refusing the pod's orchestrator channel; the shim will not connect",
		"pod", p.Namespace+"/"+p.Name, "reason", r.reason, "err", r.err)
	m.setState(p, "refused("+r.reason+")")
}

// setState records the channel's state, in memory and, on a change, in the
// pod's directory for `cri-shim pods` ("connecting", which alternates with
// "backoff" while a sidecar does not answer, only in memory).
func (m *Manager) setState(p *pod, st string) {
	if old, _ := p.state.Swap(st).(string); old == st || st == "connecting" {
		return
	}
	m.writeState(p, st)
}

// terminate marks the pod terminating (no command carried out, no
// notification sent, no reconnect) and stops its connector, at once and in
// memory first; then records the mark. An error means the mark is not
// durable yet.
func (m *Manager) markTerminating(p *pod) error {
	p.terminating.Store(true)
	m.mu.Lock()
	if p.cancel != nil {
		p.cancel()
		p.cancel = nil
	}
	was := p.Terminating
	p.Terminating = true
	m.metrics.connected.DeleteLabelValues(p.Namespace, p.Name)
	m.mu.Unlock()
	if was {
		return nil
	}
	if err := m.save(p); err != nil {
		m.mu.Lock()
		p.Terminating = false // written on the kubelet's retry
		m.mu.Unlock()
		return err
	}
	return nil
}

// Channel is what `cri-shim pods` shows of a pod's channel.
type Channel struct {
	Namespace, Name, Container string
	Port                       int
	State                      string // state, since, drops, as last recorded
}

// ReadChannels reads the channel records of the shim whose state directory
// is stateDir.
func ReadChannels(stateDir string) []Channel {
	root := store.RootIn(stateDir)
	records, states := store.ReadBucket(root, recordBucket), store.ReadBucket(root, stateBucket)
	keys, _ := records.List()
	var out []Channel
	for _, sb := range keys {
		var p pod
		if records.GetJSON(sb, &p) != nil {
			continue
		}
		st, err := states.Get(sb)
		state := "waiting for the orchestrator to start"
		if err == nil {
			state = strings.TrimSpace(string(st))
		}
		out = append(out, Channel{p.Namespace, p.Name, p.Decl.Container, p.Decl.Port, state})
	}
	return out
}

// exitCode is the exit code a TerminateContainer command asked for, if any.
func (m *Manager) exitCode(id string) (int32, bool) {
	if m.overridden.Load() == 0 {
		return 0, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	code, ok := m.exitCodes[id]
	return code, ok
}

// setExitCode records (or, with ok false, forgets) a requested exit code; an
// error means the record could not be written (and the change is undone).
func (m *Manager) setExitCode(p *pod, id string, code int32, ok bool) error {
	m.mu.Lock()
	old, had := p.Overrides[id]
	m.setExitCodeLocked(p, id, code, ok)
	m.mu.Unlock()
	if err := m.save(p); err != nil {
		m.mu.Lock()
		m.setExitCodeLocked(p, id, old, had)
		m.mu.Unlock()
		return err
	}
	return nil
}

// setExitCodeLocked changes the pod's override and the index; m.mu held.
func (m *Manager) setExitCodeLocked(p *pod, id string, code int32, ok bool) {
	if ok {
		p.Overrides[id], m.exitCodes[id] = code, code
	} else {
		delete(p.Overrides, id)
		delete(m.exitCodes, id)
	}
	m.overridden.Store(int32(len(m.exitCodes)))
}
