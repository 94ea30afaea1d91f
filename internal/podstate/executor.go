package podstate

// stopExecutor ends the sandbox's executor, if one runs, once its pod's
// restart is abandoned or its sandbox removed: a restart waiting out its
// backoff delay would otherwise keep a goroutine and the pod's record for
// the rest of the delay (up to the node maximum, 300 s), one per removed
// crash-looping pod under churn (test/e2e TestChurnFakeRuntime). m.mu held.
func (m *Manager) stopExecutor(sandboxID string) {
	if cancel := m.active[sandboxID]; cancel != nil {
		cancel()
	}
}
