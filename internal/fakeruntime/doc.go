// Package fakeruntime is an in-memory CRI runtime for tests, served over
// gRPC on a unix socket so the code under test talks to it exactly as it
// talks to containerd. Every package's tests share it, so a behaviour the
// shim depends on is written once, here, and pinned by this package's tests.
//
// It answers as containerd 2.4's CRI server does (internal/cri/server at
// v2.4.2, the version CI runs) where the shim depends on the answer, and
// test/e2e's TestFakeRuntimeMatchesContainerd runs one CRI sequence on it
// and on the test node's containerd and compares the codes, messages and
// fields (on containerd 2.2 and 2.3 it allows exactly their known
// differences: CreateContainer's checkpoint-image check, and 2.2's statuses
// without image_id and stop_signal):
//
//   - sandbox_run.go: RunPodSandbox reserves the name
//     name_namespace_uid_attempt (FailedPrecondition "failed to reserve
//     sandbox name ...": registrar.ReservedErr is a conflict), the sandbox
//     is READY, and CREATED then STARTED events carry the sandbox ID as
//     their container ID. A sandbox on the node's network reports no IP.
//   - sandbox_stop.go, sandbox_remove.go: StopPodSandbox kills every
//     container of the sandbox (exit 137) then the sandbox (NOTREADY, a
//     STOPPED event, no IP any more); RemovePodSandbox stops it, removes
//     its containers (a DELETED event each) and sends DELETED for the
//     sandbox before it leaves the store (the event carries its NOTREADY
//     status); both succeed for an unknown sandbox.
//   - sandbox_status.go, sandbox_list.go: PodSandboxStatus of an unknown
//     sandbox is NotFound "an error occurred when try to find sandbox: not
//     found"; ListPodSandbox filters by ID (or unique prefix), state and
//     labels.
//   - container_create.go: CreateContainer needs a READY sandbox ("sandbox
//     container %q is not running"), the container's and the sandbox's
//     metadata, and reserves name_pod_namespace_uid_attempt until the
//     container is removed (FailedPrecondition "failed to reserve container
//     name %q; check if another CreateContainer request is in progress:
//     ..."); then it resolves the image as images/service.go LocalResolve
//     does: by its normalized name ("busybox" is
//     docker.io/library/busybox:latest), its ID or a unique prefix of the
//     ID; an image the runtime does not hold is NotFound "failed to resolve
//     image %q: not found", an empty reference Unknown "... ambiguous digest
//     string" (it is a prefix of every ID). The log path is the sandbox's
//     log directory joined with the container's; a CREATED event follows.
//   - images/image_pull.go, image_status.go, image_remove.go: PullImage
//     holds the image and answers its ID; ImageStatus of an image it does
//     not hold answers no image; RemoveImage of one succeeds. A new runtime
//     holds NodeImages, the images the test node imports (WithImages names
//     others).
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
//     EXITED; all timestamps in nanoseconds; the image is named by its
//     first tag while the runtime holds it, ImageRef and ImageId are its
//     ID, the stop signal SIGTERM unless the config sets one.
//   - container_list.go, container_stream.go, sandbox_stream.go:
//     ListContainers filters by ID, sandbox (each by ID or unique prefix),
//     state and labels; StreamContainers and StreamPodSandboxes send the
//     List answer in batches of 5,000, nothing for an empty list.
//   - container_execsync.go: ExecSync of an unknown container is NotFound
//     "failed to exec in container: failed to find container %q in store:
//     not found", of one that is not RUNNING Unknown "failed to exec in
//     container: container is in %s state"; the command runs the Program a
//     test gave for its first word (AddProgram) and answers its exit code,
//     stdout and stderr; a command without one fails as runc fails for a
//     program missing from the image (Unknown "... failed to start exec %q:
//     OCI runtime exec failed: ... executable file not found in $PATH"); a
//     program that outlives the request's timeout is DeadlineExceeded
//     "failed to exec in container: timeout %v exceeded: context deadline
//     exceeded".
//   - helpers.go generateAndSendContainerEvent, container_events.go and
//     internal/eventq: every event carries the sandbox's status (nil once
//     the sandbox is gone) and the status of every container of the
//     sandbox at the time it is sent; events sent while nobody subscribes
//     are held for the next subscriber; a subscriber has a 100-event
//     buffer and a slow one slows every sender down, as in containerd.
//
// Errors leave as containerd's instrumentation layer turns them into gRPC
// statuses (errgrpc.ToGRPC): NotFound for a missing object,
// FailedPrecondition for a conflict, DeadlineExceeded for a timeout,
// Unknown for the rest.
//
// Calls the shim does not depend on (stats, exec and attach streams) are
// Unimplemented.
//
// Tests steer it with hooks: Exit, OOMKill, ExitOnStart and SandboxExit
// play processes ending; AddProgram plays the programs ExecSync runs; OnCall
// and FailNext run code or inject an error before any method; Rewrite
// changes a method's answers (AddUnknown gives a message a field this build
// does not know); NextIDs names the next objects; EndEventStreams ends event
// streams; Calls and Requests count and record the calls it served.
package fakeruntime
