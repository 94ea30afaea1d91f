// Package podstate holds in-place pod restart (KEP-5532 RestartAllContainers): the per-pod restart state machine, persisted under the state directory. Not implemented yet: see the in-place restart issue.
package podstate
