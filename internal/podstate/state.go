package podstate

import (
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
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

// Trigger is the exit that started a pod restart.
type Trigger struct {
	Container   string    `json:"container"`
	ContainerID string    `json:"containerId"`
	ExitCode    int32     `json:"exitCode"`
	StartedAt   time.Time `json:"startedAt"`
	FinishedAt  time.Time `json:"finishedAt"`
	// Action is the rule's action: RestartAllContainers, or Restart (this container only).
	Action string `json:"action"`
	// Delay is the backoff applied before the restart.
	Delay time.Duration `json:"delay"`
}

// Pod is the persisted state of one pod sandbox that carries restart rules.
type Pod struct {
	SandboxID    string   `json:"sandboxId"`
	UID          string   `json:"uid"`
	Name         string   `json:"name"`
	Namespace    string   `json:"namespace"`
	LogDirectory string   `json:"logDirectory"`
	Rules        Rules    `json:"rules"`
	Problems     []string `json:"problems,omitempty"`
	// Termination is how a restart stops the pod's containers
	// (TerminationAnnotation); empty in state written before it existed,
	// which is graceful.
	Termination Termination `json:"termination,omitempty"`
	// Forced holds, per container name, the action a command asked for (the
	// pod management channel's RestartContainer / RestartAllContainers): the
	// container's next exit is classified with it instead of the rules.
	Forced map[string]string `json:"forced,omitempty"`
	// Held are containers the orchestrator terminated: their exits are left
	// alone until it restarts them (hold.go).
	Held map[string]bool `json:"held,omitempty"`

	// Creates holds the kubelet's latest CreateContainer request per container
	// name (protobuf), so the first container can be started again exactly as
	// the kubelet would.
	Creates map[string][]byte `json:"creates"`
	// IDs maps every container instance created in this sandbox to its name.
	IDs map[string]string `json:"ids"`
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
	ContainerRestarts map[string]int `json:"containerRestarts,omitempty"`
	Trigger           *Trigger       `json:"trigger,omitempty"`
	// Old are the instances from before the restart in progress (ID -> name).
	Old map[string]string `json:"old,omitempty"`
	// Fake are the old instances shown to the kubelet as running until the
	// swap: those that were running when the rule matched, and the trigger.
	Fake map[string]bool `json:"fake,omitempty"`
	// Refined is set once Fake was checked against the runtime, before the
	// first stop; a resumed restart must not check again (it would see the
	// instances it stopped itself).
	Refined bool `json:"refined,omitempty"`
	// New are the instances the shim created for the restart in progress (ID -> name),
	// hidden from the kubelet until every one is up.
	New map[string]string `json:"new,omitempty"`
	// Creating is the replay create in flight ("name/attempt"): a shim killed
	// between the runtime creating the container and this state recording it
	// finds the container by name and attempt instead of creating another.
	Creating string `json:"creating,omitempty"`
	// Retried are containers whose replayed start was interrupted (the shim
	// died during StartContainer) and were created once more in this restart.
	Retried map[string]bool `json:"retried,omitempty"`
	// Settled are exits already handled (no rule matched, or an earlier
	// restart dealt with them): the kubelet sees them as they are.
	Settled map[string]bool `json:"settled,omitempty"`
	// Dead are instances seen exited; they are not shown running during a restart.
	Dead map[string]bool `json:"dead,omitempty"`
	// Latest is the newest instance of each container name.
	Latest    map[string]string `json:"latest,omitempty"`
	NotBefore time.Time         `json:"notBefore,omitzero"`
	LastError string            `json:"lastError,omitempty"`
	// Stopped: the kubelet stopped the sandbox; nothing in it is restarted any more.
	Stopped bool `json:"stopped,omitempty"`

	// KeepShown are old instances a swap replaced after a list showed them
	// running, until when they are held. The kubelet reads a pod as one list
	// and then, seconds later under load, the status of each container that
	// list showed (kuberuntime_container.go getPodContainerStatuses). A swap
	// in between would show it the old instance exited and not the new one: a
	// terminated container that then "becomes" running, which its status
	// manager refuses ("attempted illegal transition"), failing a
	// restartPolicy Never pod. A held instance is shown running, in
	// ContainerStatus and in lists without a state filter, until no read of
	// the pod can belong to a list from before the swap (heldLocked). Recorded with the swap, so a shim restarted in between
	// keeps to the same picture.
	KeepShown map[string]time.Time `json:"keepShown,omitempty"`

	// In memory only. shownRunning are the instances some list showed
	// running (any caller, any filter): a swap holds those it replaces.
	shownRunning map[string]bool
	// reads counts the kubelet's PodSandboxStatus calls for this pod
	// (ObservePodSandboxStatus); keptAt is its count when each hold began.
	// A hold loaded from disk has none and counts from this process's start.
	reads  *podReads
	keptAt map[string]uint64
	// createReq is Creates decoded, per name, for replays (decoding the
	// kubelet's request cost a tenth of a millisecond per restart). Only the
	// pod's executor reads and changes the requests; recordCreate drops an
	// entry when the kubelet creates the container again.
	createReq map[string]*runtimeapi.CreateContainerRequest
	// warmFailed are the containers whose warm restart failed in the
	// restart in progress: they start cold (warm.go). Cleared at the swap.
	warmFailed map[string]bool
}

// SeqEntry is one container of the pod's start order.
type SeqEntry struct {
	Name     string `json:"name"`
	WaitExit bool   `json:"waitExit"`
}
