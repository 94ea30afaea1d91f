// Package restartapi is what the in-place restart engine (internal/podstate)
// exchanges with the packages around it: what it tells of restarts (an
// Observer: internal/podstatus writes pod conditions and events) and the warm
// starts it is given (a WarmSource: internal/warm restores a replayed
// container from its pod's checkpoint). A leaf: the packages on either side
// import it and not each other, and the server wires them.
package restartapi

import (
	"context"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Observer hears of the in-place restarts the engine carries out. Its
// methods are called once the step is recorded, some with the engine's lock
// held: they must return at once (queue, never wait) and must not call the
// engine.
type Observer interface {
	// RestartStarted: t's exit matched a rule (or a command); the pod's
	// containers, or t.Container alone for a Restart rule, are restarted in
	// place after t.Delay of backoff.
	RestartStarted(pod PodRef, t Trigger)
	// RestartEnded: the restart t started is over, with outcome.
	RestartEnded(pod PodRef, t Trigger, outcome Outcome)
	// WarmRestart: a container of a pod that asks for warm restarts was
	// restored from a checkpoint, or started cold (r.Cold says why).
	WarmRestart(pod PodRef, r WarmResult)
}

// PodRef names the pod an Observer hears about.
type PodRef struct {
	Namespace, Name, UID string
}

// Trigger is the exit that started a pod restart (recorded in the engine's
// state as JSON).
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

// Outcome is how a restart ended.
type Outcome int

const (
	// Restarted: the new instances run and are shown.
	Restarted Outcome = iota
	// RestartedAgain: the new instances are shown, and one of them already
	// exited and started the next restart (RestartStarted came first).
	RestartedAgain
	// Abandoned: the pod is being stopped (or its sandbox is gone); the
	// restart was given up.
	Abandoned
)

// PodState is a tracked pod's restart state, for an observer that catches
// up: what it heard before the shim restarted may not have reached the API
// server.
type PodState struct {
	Pod PodRef
	// Restarting: a restart is in progress, started by Trigger.
	Restarting bool
	Trigger    Trigger
	// Since is when the pod entered its current phase.
	Since time.Time
	// RestartedAll: the pod restarted all its containers in place before.
	RestartedAll bool
}

// WarmResult is how a replayed container of a pod that asks for warm
// restarts was started: from Checkpoint (taken Age before), or cold, for
// the reason in Cold.
type WarmResult struct {
	Container  string
	Checkpoint string
	Age        time.Duration
	Cold       string
}

// WarmStart is the create request that restores one container from a
// checkpoint, and what the restart's event says of it.
type WarmStart struct {
	Request *runtimeapi.CreateContainerRequest
	// Checkpoint is the checkpoint's directory name under the root.
	Checkpoint     string
	CheckpointedAt time.Time
	// Release ends the restore's use of the checkpoint (retention may
	// remove it from then on); called once the container started or failed
	// to.
	Release func()
	// Created, when set, stages the restore of the container Request
	// created (its ID), before its start; on error the container is removed
	// and created again cold. Nil when the container is not restored (it
	// completed before the checkpoint and runs as a no-op).
	Created func(id string) error
	// Started, when set, is given StartContainer's result and returns the
	// start's: an error too when the container started without its
	// checkpoint (it was then stopped).
	Started func(id string, err error) error
}

// WarmSource answers, for the cold create request of a replayed container,
// the request that restores it: nil when the pod did not ask for it (or the
// checkpoint has nothing for the container), an error saying why when it
// asked and no checkpoint can be used. It must not wait on the API server.
type WarmSource func(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*WarmStart, error)
