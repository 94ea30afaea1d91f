package ckptstore

// Scheduled checkpoints: a pod annotated with an interval is checkpointed
// that often, so that its warm restarts (internal/warm) find a fresh
// checkpoint. The schedule keeps no state of its own: every scheduleTick the
// store lists the ready sandboxes (their annotations come with the list)
// and checkpoints those whose newest checkpoint under the root is older than
// their interval. A restarted shim, or one that was down for a while, picks
// up where the checkpoints on disk say it is.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/podtable"
)

const (
	// ScheduledPrefix begins the directory name of a scheduled checkpoint:
	// sched-<pod UID>-<UTC time>.
	ScheduledPrefix = "sched-"

	scheduleTick = 10 * time.Second
	// scheduleTimeout bounds one scheduled checkpoint.
	scheduleTimeout = 5 * time.Minute
)

// RunSchedule checkpoints the pods that ask for it with ckpt until ctx ends. It
// wakes when the next pod is due, and at least every scheduleTick to find
// new pods and annotations: a fixed tick alone made each interval the
// configured one plus up to a tick (a checkpoint taken just after a tick is
// not yet an interval old at the tick an interval later).
func (s *Store) RunSchedule(ctx context.Context, ckpt *capture.Service) {
	t := time.NewTimer(scheduleTick)
	defer t.Stop()
	bad := map[string]string{} // sandbox -> the annotation error logged for it
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			t.Reset(untilNext(s.now(), s.scheduleOnce(ctx, ckpt, bad)))
		}
	}
}

// minScheduleWait keeps the schedule from spinning on a pod that is due but
// cannot be checkpointed yet (a container not running).
const minScheduleWait = time.Second

// untilNext is how long the schedule waits after a pass: until next (the
// earliest time a pod is due; zero for none), at most scheduleTick, at
// least minScheduleWait.
func untilNext(now, next time.Time) time.Duration {
	d := scheduleTick
	if !next.IsZero() {
		d = min(d, next.Sub(now))
	}
	return max(d, minScheduleWait)
}

// scheduleOnce checkpoints, one at a time, every ready sandbox whose
// schedule is due, and returns when the next one is due (zero: no pod is
// known to be due before the next tick).
func (s *Store) scheduleOnce(ctx context.Context, ckpt *capture.Service, bad map[string]string) time.Time {
	var stored []Stored
	var next time.Time
	due := func(t time.Time) { // a time past is the next tick's
		if t.After(s.now()) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	listed := false
	for _, sb := range s.cfg.Sandboxes.List(func(p *podtable.Sandbox) bool { return p.Ready }) {
		sched, err := podspec.ParseSchedule(sb.Annotations, s.cfg.MinInterval)
		if err != nil {
			if bad[sb.ID] != err.Error() {
				bad[sb.ID] = err.Error()
				s.log.Warn("checkpoint: schedule annotation refused; the pod is not checkpointed on a schedule", "pod", podName(sb), "err", err)
			}
			continue
		}
		if sched == nil || sb.Metadata.GetUid() == "" {
			continue
		}
		if !listed {
			stored, _ = List(s.cfg.Root)
			listed = true
		}
		if newest := newestOf(stored, sb.Metadata); !newest.IsZero() && s.now().Sub(newest) < sched.Interval {
			due(newest.Add(sched.Interval))
			continue
		}
		if err := s.checkpointScheduled(ctx, ckpt, &sb, sched); err != nil {
			s.scheduled.WithLabelValues("failed").Inc()
			s.log.Warn("checkpoint: scheduled checkpoint failed; tried again at the next tick", "pod", podName(sb), "err", err)
			continue
		}
		s.scheduled.WithLabelValues("success").Inc()
		stored, _ = List(s.cfg.Root)
		if newest := newestOf(stored, sb.Metadata); !newest.IsZero() {
			due(newest.Add(sched.Interval))
		}
	}
	return next
}

func podName(sb podtable.Sandbox) string {
	return sb.Metadata.GetNamespace() + "/" + sb.Metadata.GetName()
}

// newestOf is when the newest checkpoint of the sandbox's pod (by UID and
// namespace) was taken; zero if it has none.
func newestOf(stored []Stored, md *runtimeapi.PodSandboxMetadata) time.Time {
	var t time.Time
	for _, c := range stored {
		if c.Manifest.Pod.UID == md.GetUid() && c.Manifest.Pod.Namespace == md.GetNamespace() && c.Manifest.CheckpointedAt.After(t) {
			t = c.Manifest.CheckpointedAt
		}
	}
	return t
}

// checkpointScheduled checkpoints every running container of the sandbox
// into a new sched-<uid>-<time> directory (a managed checkpoint, under the
// node's retention), then keeps only the pod's newest sched.Keep scheduled
// checkpoints. A pod with a container not running (a restart in progress)
// is left for the next tick: its checkpoint would not be the pod's state.
func (s *Store) checkpointScheduled(ctx context.Context, ckpt *capture.Service, sb *podtable.Sandbox, sched *podspec.Schedule) error {
	ctx, cancel := context.WithTimeout(ctx, scheduleTimeout)
	defer cancel()
	cs, err := s.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: sb.ID}})
	if err != nil {
		return err
	}
	newest := map[string]*runtimeapi.Container{}
	for _, c := range cs.GetContainers() {
		n := c.GetMetadata().GetName()
		if o := newest[n]; o == nil || c.GetCreatedAt() > o.GetCreatedAt() {
			newest[n] = c
		}
	}
	var ids []string
	for _, c := range newest {
		switch c.GetState() {
		case runtimeapi.ContainerState_CONTAINER_RUNNING:
			ids = append(ids, c.GetId())
		case runtimeapi.ContainerState_CONTAINER_EXITED:
			// A completed init container: recorded as exited by the checkpoint.
		default:
			return fmt.Errorf("container %s is %s; not checkpointed until every container runs", c.GetMetadata().GetName(), c.GetState())
		}
	}
	if len(ids) == 0 {
		return fmt.Errorf("no running container")
	}
	uid := sb.Metadata.GetUid()
	if err := layout.CheckName(ScheduledPrefix + uid); err != nil {
		return fmt.Errorf("pod UID %q cannot name a checkpoint: %v", truncate(uid, 32), err)
	}
	dir := filepath.Join(s.cfg.Root, ScheduledPrefix+uid+"-"+s.now().UTC().Format("20060102T150405Z"))
	if err := os.MkdirAll(s.cfg.Root, 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	_, err = ckpt.CheckpointPod(ctx, &runtimeapi.CheckpointPodRequest{PodSandboxId: sb.ID, OutputPath: dir, ContainerIds: ids,
		Options: map[string]string{capture.OptionManaged: "true"}})
	if err != nil {
		os.Remove(dir) // emptied by the failed call; the directory is ours
		return err
	}
	s.keepScheduled(ScheduledPrefix+uid+"-", sched.Keep)
	return nil
}

// keepScheduled removes a pod's scheduled checkpoints (names beginning with
// prefix) beyond the newest keep, leaving any a restore still reads.
func (s *Store) keepScheduled(prefix string, keep int) {
	all, _ := List(s.cfg.Root)
	var mine []Stored
	for _, c := range all {
		if strings.HasPrefix(c.Name, prefix) {
			mine = append(mine, c)
		}
	}
	inUse := s.inUseNow()
	for i := 0; i < len(mine)-keep; i++ { // oldest first
		if inUse[mine[i].Dir] > 0 {
			continue
		}
		if err := os.RemoveAll(mine[i].Dir); err != nil {
			s.log.Warn("checkpoint: could not remove an old scheduled checkpoint", "path", mine[i].Dir, "err", err)
			continue
		}
		s.retentionRemove.Inc()
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
