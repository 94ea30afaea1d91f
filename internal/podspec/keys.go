// Package podspec is the one place that spells the pod annotations cri-shim
// reads (the *.cri-shim.io keys a workload author sets) and parses them. A
// pod's annotations are hostile input: every parser bounds what it repeats of
// a value, never fails the pod, and returns what it could not use as a
// problem naming the key. Parse reads them all into a Spec; each feature
// package takes its typed part.
package podspec

import (
	"maps"
	"slices"
	"strings"
)

// The pod annotations. docs/annotations.md lists them with their values.
const (
	// RestartRulesPrefix + container name: a JSON list of upstream
	// ContainerRestartRule (KEP-5532) for that container.
	RestartRulesPrefix = "restart-rules.cri-shim.io/"
	// TerminationKey: how an in-place restart stops the running
	// containers, "graceful" (default) or "immediate".
	TerminationKey = "restart.cri-shim.io/termination"
	// PodManagementPrefix + container name: the KEP-5309 podManagement
	// stanza of the orchestrator container, {"port": N, "version": "1.0"}.
	PodManagementPrefix = "pod-management.cri-shim.io/"
	// RestoreFromKey: the checkpoint a pod warm-starts from (a checkpoint
	// name, a PodCheckpoint object's name, or an image reference).
	RestoreFromKey = "checkpoint.cri-shim.io/restore-from"
	// WarmRestartKey ("true") asks that in-place restarts start from the
	// pod's latest checkpoint.
	WarmRestartKey = "checkpoint.cri-shim.io/warm-restart"
	// WarmRestartMaxAgeKey bounds that checkpoint's age (a Go duration, 1s
	// to 168h; default DefaultWarmRestartMaxAge).
	WarmRestartMaxAgeKey = "checkpoint.cri-shim.io/warm-restart-max-age"
	// IntervalKey (a Go duration) asks for a checkpoint of the pod that
	// often; the node's checkpoint.min_interval is the least.
	IntervalKey = "checkpoint.cri-shim.io/interval"
	// KeepKey (1 to 100) is how many of the pod's scheduled checkpoints are
	// kept (default 2).
	KeepKey = "checkpoint.cri-shim.io/keep"
)

// maxQuoted bounds how much of a pod's invalid value a problem repeats.
const maxQuoted = 64

// keysWith are the keys of ann that begin with prefix, sorted.
func keysWith(ann map[string]string, prefix string) []string {
	var keys []string
	for k := range maps.Keys(ann) {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}
