// Package fakeruntime is an in-memory CRI runtime for tests, served over
// gRPC on a unix socket so the code under test talks to it exactly as it
// talks to containerd. Every package's tests share it, so a behaviour the
// shim depends on is written once, here, and pinned by this package's tests.
//
// It answers as containerd 2.2's CRI server does (internal/cri/server at
// v2.2.7) where the shim depends on the answer:
//
//   - sandbox_run.go: RunPodSandbox reserves the name
//     name_namespace_uid_attempt ("failed to reserve sandbox name ..."),
//     the sandbox is READY, and CREATED then STARTED events carry the
//     sandbox ID as their container ID. A sandbox on the node's network
//     reports no IP.
//   - sandbox_stop.go, sandbox_remove.go: StopPodSandbox kills every
//     container of the sandbox (exit 137) then the sandbox (NOTREADY, a
//     STOPPED event, no IP any more); RemovePodSandbox stops it, removes
//     its containers (a DELETED event each) and sends DELETED for the
//     sandbox; both succeed for an unknown sandbox.
//   - sandbox_status.go, sandbox_list.go: PodSandboxStatus of an unknown
//     sandbox is NotFound "an error occurred when try to find sandbox: not
//     found"; ListPodSandbox filters by ID (or unique prefix), state and
//     labels.
//   - container_create.go: CreateContainer needs a READY sandbox ("sandbox
//     container %q is not running"), the container's and the sandbox's
//     metadata, and reserves name_pod_namespace_uid_attempt until the
//     container is removed; the log path is the sandbox's log directory
//     joined with the container's; a CREATED event follows.
//   - container_start.go: StartContainer only from CREATED: otherwise
//     Unknown "failed to set starting state for container %q: container is
//     in CONTAINER_RUNNING state" and the container is unchanged. A start
//     in a sandbox that is not ready fails after the container was marked
//     starting, which leaves it EXITED with 128 "StartError" and no start
//     time; so does a start whose call has ended (the caller cancelled
//     it) by the time the runtime carries it out, as the task is created
//     and started under the call's context. A STARTED event follows a
//     start.
//   - container_stop.go: StopContainer of an unknown container succeeds;
//     only a RUNNING container is killed (143 after SIGTERM with a timeout,
//     137 with none); an exited one keeps its first exit code and time.
//   - container_remove.go: RemoveContainer of an unknown container
//     succeeds; a RUNNING one is stopped forcibly (137) first, then
//     removed, with a DELETED event.
//   - container_status.go: an unknown container is NotFound "an error
//     occurred when try to find container %q: not found"; Reason is
//     "Completed" or "Error" after an exit unless set (OOMKilled,
//     StartError); StartedAt only from RUNNING on, FinishedAt only once
//     EXITED; all timestamps in nanoseconds.
//   - container_list.go: ListContainers filters by ID, sandbox (each by ID
//     or unique prefix), state and labels.
//   - helpers.go generateAndSendContainerEvent, container_events.go and
//     internal/eventq: every event carries the sandbox's status (nil once
//     the sandbox is gone) and the status of every container of the
//     sandbox at the time it is sent; events sent while nobody subscribes
//     are held for the next subscriber; a subscriber has a 100-event
//     buffer and a slow one slows every sender down, as in containerd.
//
// Errors leave as containerd's instrumentation layer turns them into gRPC
// statuses: NotFound for a missing object, Unknown for the rest.
//
// Images are recorded by name and any image name is accepted by
// CreateContainer, as if pulled. ExecSync runs nothing and answers exit 0 in
// a RUNNING container. Calls the shim does not depend on (stats, exec and
// attach streams, the Stream* lists containerd 2.2 does not implement either)
// are Unimplemented.
//
// Tests steer it with hooks: Exit, OOMKill, ExitOnStart and SandboxExit play
// processes ending; OnCall and FailNext run code or inject an error before
// any method; Rewrite changes a method's answers; NextIDs names the next
// objects; EndEventStreams ends event streams; Calls and Requests count
// and record the calls it served.
package fakeruntime
