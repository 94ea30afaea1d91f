// Package fleet is the fleet-scale harness (make bench-fleet, issue 30): one
// real etcd and kube-apiserver from the test stack, and N simulated nodes in
// this process, each running the shim's real API side (its API client and
// writer, the pod status reporter, the PodCheckpoint controller with its pod
// informer) over an in-memory runtime, with its own client certificate as
// system:node:<name>, so the Node authorizer, NodeRestriction and the
// admission policies of deploy/ apply as on a real node. A kubelet-like
// baseline (one pod watch, lease renewals) runs the same way. The API
// server's audit log says who asked what; its /metrics and /proc say what
// that cost. Results: bench/results/fleet-*.md.
package fleet
