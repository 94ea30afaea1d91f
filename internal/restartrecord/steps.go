package restartrecord

// The edits of a restart's steps (Match starts it, Swap ends it, Abandon
// gives it up) and of the kubelet's creates that the next one replays; the
// phase is the caller's (Enter).

import (
	"slices"
	"time"

	"github.com/cri-shim/cri-shim/internal/restartapi"
)

// Match records the restart a rule (or a command) started at the exit t:
// of the one container scope, or of the whole pod (""), its backoff
// waited out at notBefore. Its old instances are the pod's (or the
// container's). Shown running until the swap are the trigger and every old
// instance that may still run; instances of containers that ran to
// completion (regular init containers, by the recorded start order) or
// were seen exited are shown as they are: a terminated init container
// shown running again is a transition the kubelet refuses. The restart's
// first step checks the others against the runtime before it stops
// anything; with none, the set is final now (Refined).
func (p *Pod) Match(t restartapi.Trigger, scope string, now, notBefore time.Time) {
	p.PhaseSince, p.Scope, p.Trigger = now, scope, &t
	completed := map[string]bool{}
	for _, e := range p.Seq {
		if e.WaitExit {
			completed[e.Name] = true
		}
	}
	p.EndRestartParts()
	shown := 0
	for id, in := range p.Instances {
		if scope != "" && in.Name != scope {
			continue
		}
		in.Part, in.Settled = PartOld, true
		if id == t.ContainerID || (!in.Dead && !completed[in.Name]) {
			in.Shown = true
			shown++
		}
	}
	p.Retried, p.Backlog = nil, Backlog{}
	p.Refined = shown == 1
	p.NotBefore, p.LastError = notBefore, ""
}

// Swap records the end of the restart in progress: each new instance is
// its container's latest, shown to the kubelet, and the restart is counted.
// A container started again shows its older instances as they are; a
// whole-pod restart handed back to the kubelet (handBack) hides those of
// the containers it did not start again until the kubelet creates them
// (KubeletCreated). The instance a new one replaces stays shown running
// until holdUntil if a list showed it running (Instance.HeldUntil). Older
// instances keep the hold their own swap gave them: renewing it at every
// swap would, in a crash loop (one kubelet read per swap), keep every
// replaced instance shown running, so the kubelet would never see one exit
// and never remove it.
func (p *Pod) Swap(handBack bool, holdUntil time.Time) {
	replaced := map[string]string{} // container name: the instance this swap replaces
	for id, name := range p.PartOf(PartNew) {
		replaced[name] = p.Latest[name]
		p.Latest[name] = id
	}
	for _, in := range p.Instances {
		if _, renewed := replaced[in.Name]; renewed {
			in.Hidden = false
		} else if handBack && p.Scope == "" {
			in.Hidden = true
		}
	}
	if p.Scope != "" {
		if p.ContainerRestarts == nil {
			p.ContainerRestarts = map[string]int{}
		}
		p.ContainerRestarts[p.Scope]++
	} else {
		p.Restarts++
	}
	p.Scope = ""
	for id, in := range p.Instances {
		prev, ok := replaced[in.Name]
		if !in.Listed || in.Part == PartNew || !ok {
			continue
		}
		if id == prev {
			in.HeldUntil, in.HeldAt = holdUntil, p.Reads.N.Load()
		}
		in.Listed = false
	}
	p.EndRestartParts()
	p.LastError, p.Creating, p.WarmFailed = "", "", nil
}

// Abandon ends the restart in progress for good (the sandbox is stopped or
// gone): the pod is shown as it really is, holds end, and no rule restarts
// anything in it any more.
func (p *Pod) Abandon() {
	p.Scope = ""
	p.EndRestartParts()
	for _, in := range p.Instances {
		in.Listed = false
		in.EndHold()
	}
	p.Stopped = true
}

// KubeletCreated records the kubelet's create of instance id of container
// name, with its request (req, encoded; nil keeps the one recorded), which
// a restart replays. A container a handed-back restart left hidden shows
// its older instances again, as the new one's previous runs. The first
// create of each name records the pod's start order, and completed marks
// the container before it as one to wait for (a regular init container).
func (r *Records) KubeletCreated(p *Pod, id, name string, req []byte, completed string) {
	if req != nil {
		p.Creates[name] = req
	}
	delete(p.CreateReq, name)
	for _, in := range p.Instances {
		if in.Name == name {
			in.Hidden = false
		}
	}
	r.AddInstance(p, id, name, PartNone)
	if !slices.ContainsFunc(p.Seq, func(e SeqEntry) bool { return e.Name == name }) {
		for i := range p.Seq {
			if p.Seq[i].Name == completed {
				p.Seq[i].WaitExit = true
			}
		}
		p.Seq = append(p.Seq, SeqEntry{Name: name})
	}
	p.Latest[name] = id
}
