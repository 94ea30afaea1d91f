// Package restartrecord is the durable record of a pod's in-place restart
// (KEP-5532, carried out under the kubelet by internal/podstate): the pod and
// its container instances, the phases a restart passes through and the
// events that move it on (Pod.Enter), the edits each restart step makes,
// the tracked pods' records in memory (Records) and on disk (Store), and
// the one way a record changes: a Change, saved durably before anything
// acts on it, or put back. podstate drives restarts with it; `cri-shim pods`
// reads it.
package restartrecord

import (
	"maps"
	"slices"
	"sync/atomic"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartapi"
)

// Phase is where a pod is in its in-place restart (KEP-5532's state machine,
// as seen from under the kubelet).
type Phase string

const (
	// PhaseRunning: nothing in progress; exits of containers with rules are classified.
	PhaseRunning Phase = "Running"
	// PhaseTerminating: a rule matched; the pod's containers (or, for a
	// Restart rule, the one container) are being stopped
	// while the kubelet is shown them still running.
	PhaseTerminating Phase = "TerminatingForRestart"
	// PhaseStartup: the shim starts the pod's containers again in the
	// kubelet's original order, hidden from the kubelet until all are up; then
	// it swaps them in at once and the pod is Running again.
	PhaseStartup Phase = "Startup"
)

// Pod is the persisted state of one pod sandbox that carries restart rules.
// Its fields are changed under podstate's lock, inside a Change that saves
// them before the change is acted on.
type Pod struct {
	SandboxID    string        `json:"sandboxId"`
	UID          string        `json:"uid"`
	Name         string        `json:"name"`
	Namespace    string        `json:"namespace"`
	LogDirectory string        `json:"logDirectory"`
	Rules        podspec.Rules `json:"rules"`
	Problems     []string      `json:"problems,omitempty"`
	// Termination is how a restart stops the pod's containers
	// (podspec.TerminationKey); empty in state written before it existed,
	// which is graceful.
	Termination podspec.Termination `json:"termination,omitempty"`
	// Forced holds, per container name, the action a command asked for (the
	// pod management channel's RestartContainer / RestartAllContainers): the
	// container's next exit is classified with it instead of the rules.
	Forced map[string]string `json:"forced,omitempty"`
	// Held are containers the orchestrator terminated: their exits are left
	// alone until it restarts them (SetHeld).
	Held map[string]bool `json:"held,omitempty"`

	// Creates holds the kubelet's latest CreateContainer request per container
	// name (protobuf), so the first container can be started again exactly as
	// the kubelet would.
	Creates map[string][]byte `json:"creates"`
	// Instances is the one record of every container instance created in
	// this sandbox that still exists, by container ID: what
	// the restart knows of it and what the kubelet is shown of it.
	Instances map[string]*Instance `json:"instances"`
	// Seq is the order in which the kubelet first created the pod's containers;
	// WaitExit marks the ones that ran to completion before the next was
	// created (regular init containers).
	Seq []SeqEntry `json:"seq"`

	Phase      Phase     `json:"phase"`
	PhaseSince time.Time `json:"phaseSince"`
	Restarts   int       `json:"restarts"`
	// Scope is the one container a Restart rule restarts; empty for RestartAllContainers.
	Scope string `json:"scope,omitempty"`
	// ContainerRestarts counts Restart-rule restarts per container (its backoff position).
	ContainerRestarts map[string]int      `json:"containerRestarts,omitempty"`
	Trigger           *restartapi.Trigger `json:"trigger,omitempty"`
	// Refined is set once the shown instances were checked against the
	// runtime, before the first stop; a resumed restart must not check again
	// (it would see the instances it stopped itself).
	Refined bool `json:"refined,omitempty"`
	// Creating is the replay create in flight ("name/attempt"): a shim killed
	// between the runtime creating the container and this state recording it
	// finds the container by name and attempt instead of creating another.
	Creating string `json:"creating,omitempty"`
	// Retried are containers whose replayed start was interrupted (the shim
	// died during StartContainer) and were created once more in this restart.
	Retried map[string]bool `json:"retried,omitempty"`
	// Latest is the newest instance of each container name.
	Latest    map[string]string `json:"latest,omitempty"`
	NotBefore time.Time         `json:"notBefore,omitzero"`
	LastError string            `json:"lastError,omitempty"`
	// Stopped: the kubelet stopped the sandbox; nothing in it is restarted any more.
	Stopped bool `json:"stopped,omitempty"`

	// In memory only.
	// Reads counts the kubelet's PodSandboxStatus calls for this pod; each
	// hold keeps its count when it began (Instance.HeldAt).
	Reads *Reads `json:"-"`
	// CreateReq is Creates decoded, per name, for replays (decoding the
	// kubelet's request cost a tenth of a millisecond per restart). Only the
	// pod's restart steps read and change the requests; a create of the
	// container by the kubelet drops its entry.
	CreateReq map[string]*runtimeapi.CreateContainerRequest `json:"-"`
	// WarmFailed are the containers whose warm restart failed in the
	// restart in progress: they start cold. Cleared at the swap.
	WarmFailed map[string]bool `json:"-"`
	// Backlog is the restart's wait for the kubelet's removals (Backlogged).
	Backlog Backlog `json:"-"`
}

// SeqEntry is one container of the pod's start order.
type SeqEntry struct {
	Name     string `json:"name"`
	WaitExit bool   `json:"waitExit"`
}

// Snapshot is a copy of p that a step puts back (*p = snap) when the record
// of its change could not be written: every map and slice a step edits in
// place is copied.
func (p *Pod) Snapshot() Pod {
	c := *p
	c.Forced, c.Held, c.Creates = maps.Clone(p.Forced), maps.Clone(p.Held), maps.Clone(p.Creates)
	c.Instances, c.Seq, c.ContainerRestarts = cloneInstances(p.Instances), slices.Clone(p.Seq), maps.Clone(p.ContainerRestarts)
	c.Retried, c.Latest, c.CreateReq = maps.Clone(p.Retried), maps.Clone(p.Latest), maps.Clone(p.CreateReq)
	if p.Trigger != nil {
		t := *p.Trigger
		c.Trigger = &t
	}
	return c
}

// Reads counts one pod's PodSandboxStatus calls (N), and when the latest
// came (At, Unix ns). Atomic: the kubelet's reads do not wait for the lock a
// restart step holds across its state write.
type Reads struct {
	N  atomic.Uint64
	At atomic.Int64
}

// Backlog is a restart's wait for the kubelet's removals (in memory: a
// restarted shim waits afresh).
type Backlog struct {
	Until time.Time // when the wait ends; zero: not begun
	Over  bool      // waited out: the restart goes on whatever the backlog
}
