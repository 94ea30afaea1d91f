package podstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
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
	// Forced holds, per container name, the action a command asked for (the
	// pod management channel's RestartContainer / RestartAllContainers): the
	// container's next exit is classified with it instead of the rules.
	Forced map[string]string `json:"forced,omitempty"`

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

	// In memory only. The kubelet reads pods as a full ListContainers (its
	// PLEG relist, kuberuntime GetPods(true)) and then, up to seconds later
	// under load, ContainerStatus of each container that list showed
	// (GetPodStatus, kuberuntime_container.go getPodContainerStatuses). A
	// swap in between would show it the old instance exited and not the new
	// one: a terminated container that then "becomes" running, which its
	// status manager refuses. shownRunning are the instances the last full
	// list showed running; a swap that replaces one holds it: ContainerStatus
	// shows it running until the next full list is served (the PLEG is
	// serial, so the statuses of the earlier list have been read by then) or
	// maxHold passes.
	shownRunning map[string]bool
	held         map[string]time.Time
}

// SeqEntry is one container of the pod's start order.
type SeqEntry struct {
	Name     string `json:"name"`
	WaitExit bool   `json:"waitExit"`
}

// store persists pods as one JSON file each, written atomically (temp file,
// rename), so a kill -9 at any point leaves either the old or the new state.
// There is no fsync: a killed process loses nothing the kernel already has,
// and after a machine crash the sandboxes themselves are gone (reconcile drops
// their state), so syncing would only slow every restart step down.
type store struct{ dir string }

func newStore(stateDir string) (*store, error) {
	dir := filepath.Join(stateDir, "pods")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("podstate: %w", err)
	}
	// Temp files of saves a kill -9 cut short.
	if tmps, err := filepath.Glob(filepath.Join(dir, ".*.tmp")); err == nil {
		for _, t := range tmps {
			_ = os.Remove(t)
		}
	}
	return &store{dir: dir}, nil
}

func (s *store) path(sandboxID string) string {
	return filepath.Join(s.dir, sandboxID+".json")
}

func (s *store) save(p *Pod) error {
	if strings.ContainsAny(p.SandboxID, "/\\.") || p.SandboxID == "" {
		return fmt.Errorf("podstate: refusing sandbox id %q as a file name", p.SandboxID)
	}
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	// One temp file per sandbox (saves of one pod are serialised by the
	// manager's lock), renamed over the state file: a kill -9 at any point
	// leaves the old or the new state, never a torn one.
	tmp := filepath.Join(s.dir, "."+p.SandboxID+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, s.path(p.SandboxID))
}

func (s *store) remove(sandboxID string) error {
	_ = os.Remove(filepath.Join(filepath.Dir(s.dir), "problems", sandboxID+".json"))
	err := os.Remove(s.path(sandboxID))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// saveProblems records a pod whose rules could not be used at all, so
// `cri-shim pods` can show why it runs with plain kubelet behaviour. Such pods
// are not tracked: their calls stay on the raw path.
func (s *store) saveProblems(p *Pod) error {
	dir := filepath.Join(filepath.Dir(s.dir), "problems")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, p.SandboxID+".json"), b, 0o600)
}

// ReadPods reads every pod the shim has state for (tracked or only with
// problems) from stateDir, for `cri-shim pods`; it never modifies anything.
func ReadPods(stateDir string) ([]Pod, error) {
	var out []Pod
	for _, sub := range []string{"pods", "problems"} {
		entries, err := os.ReadDir(filepath.Join(stateDir, sub))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".json") {
				continue
			}
			b, err := os.ReadFile(filepath.Join(stateDir, sub, e.Name()))
			if err != nil {
				return nil, err
			}
			var p Pod
			if err := json.Unmarshal(b, &p); err != nil {
				return nil, fmt.Errorf("%s: %w", e.Name(), err)
			}
			out = append(out, p)
		}
	}
	return out, nil
}

// load reads every saved pod; unreadable files are reported and skipped.
func (s *store) load() ([]*Pod, []error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, []error{err}
	}
	var pods []*Pod
	var errs []error
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var p Pod
		if err := json.Unmarshal(b, &p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.Name(), err))
			continue
		}
		pods = append(pods, &p)
	}
	return pods, errs
}

// pruneProblems drops problems-only records of sandboxes that are gone.
func (s *store) pruneProblems(live map[string]bool) {
	dir := filepath.Join(filepath.Dir(s.dir), "problems")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if id := strings.TrimSuffix(e.Name(), ".json"); !live[id] {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
