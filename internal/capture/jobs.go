package capture

import (
	"context"
	"time"

	"github.com/containerd/errdefs"
)

// A job owns what one CheckpointPod call acts on: its sandbox (the pause and
// resume of its containers, its frozen record) and its output directory. A
// call that returns at its deadline leaves work behind (containerd's capture
// goes on; the service then resumes the containers again and empties the
// directory): the job stays held by that leftover work until it ends, so
// nothing it does can touch what a later call owns. A later call of the same
// sandbox or directory waits for it, within its own deadline.
type job struct {
	sandbox, out string
	// returned is set when the call that owns the job has answered and only
	// its leftover work holds it.
	returned bool
	done     chan struct{}
	// rec is the call's frozen record, once written.
	rec frozenRecord
	// admitted is Config.Admit's done, called when the job ends.
	admitted func()
}

// claim takes the sandbox and output directory for a new call. A job still
// answering its own call refuses the new one; a job held only by leftover
// work is waited for, until margin before ctx's deadline.
func (s *Service) claim(ctx context.Context, sandbox, out string, margin time.Duration) (*job, error) {
	for {
		s.mu.Lock()
		j := s.jobs[sandbox]
		what := "sandbox " + short(sandbox)
		if j == nil {
			j, what = s.jobsByOut[out], "output_path "+out
		}
		if j == nil {
			j = &job{sandbox: sandbox, out: out, done: make(chan struct{})}
			s.jobs[sandbox] = j
			s.jobsByOut[out] = j
			s.mu.Unlock()
			return j, nil
		}
		returned := j.returned
		s.mu.Unlock()
		if !returned {
			return nil, errorf(errdefs.ErrFailedPrecondition, "CheckpointPod: a checkpoint of %s is already in progress", what)
		}
		wait := time.Duration(-1)
		if dl, ok := ctx.Deadline(); ok {
			wait = time.Until(dl) - margin
		}
		if wait <= 0 {
			return nil, s.leftoverBusy(what)
		}
		t := time.NewTimer(wait)
		select {
		case <-j.done:
			t.Stop()
		case <-t.C:
			return nil, s.leftoverBusy(what)
		case <-ctx.Done():
			t.Stop()
			return nil, s.leftoverBusy(what)
		}
	}
}

func (s *Service) leftoverBusy(what string) error {
	return errorf(errdefs.ErrUnavailable, "CheckpointPod: an earlier checkpoint of %s, abandoned at its deadline, is still finishing in containerd; "+
		"nothing was paused; retry once it ends", what)
}

// tryHold takes the sandbox (if not empty) and the output directory for
// recovery work, or returns nil at once if a call or other work holds either.
// A call that comes meanwhile waits for it, as for leftover work.
func (s *Service) tryHold(sandbox, out string) *job {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sandbox != "" && s.jobs[sandbox] != nil || out != "" && s.jobsByOut[out] != nil {
		return nil
	}
	j := &job{sandbox: sandbox, out: out, returned: true, done: make(chan struct{})}
	if sandbox != "" {
		s.jobs[sandbox] = j
	}
	if out != "" {
		s.jobsByOut[out] = j
	}
	return j
}

// release ends the job: the next call of its sandbox or directory may start.
func (s *Service) release(j *job) {
	s.mu.Lock()
	if j.sandbox != "" && s.jobs[j.sandbox] == j {
		delete(s.jobs, j.sandbox)
	}
	if s.jobsByOut[j.out] == j {
		delete(s.jobsByOut, j.out)
	}
	s.mu.Unlock()
	if j.admitted != nil {
		j.admitted()
	}
	close(j.done)
}

// handOver marks the job's call as answered while leftover work still holds
// it; that work calls release when it ends.
func (s *Service) handOver(j *job) {
	s.mu.Lock()
	j.returned = true
	s.mu.Unlock()
}
