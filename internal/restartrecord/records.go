package restartrecord

// The tracked pods' records in memory, and each change of one saved before
// anything acts on it or put back: a restarted shim finds on disk what this
// one acted on (docs/operations.md, "Readiness on write failure").

import (
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"

	"github.com/cri-shim/cri-shim/internal/wire"
)

// ErrRemoved refuses a save of a pod dropped while a step held it: the
// record of a sandbox that is gone is not brought back; the step stops.
var ErrRemoved = errors.New("restartrecord: the pod's sandbox was removed")

// Records are the tracked pods' records, by sandbox and by container
// instance, guarded by the caller's lock (podstate's) with every Pod in
// them, across each change and its save.
type Records struct {
	store      *Store
	log        *slog.Logger
	pods       map[string]*Pod   // by sandbox ID
	byID       map[string]string // container ID -> sandbox ID
	prefixes   map[uint64]int    // byID's IDs by their first 8 bytes
	heads      *wire.HeadSet     // prefixes' keys (Heads); nil: to be made again
	quiet      *wire.HeadSet     // Quiet and
	restarting []string          // Restarting,
	surveyed   bool              // unless false: to be made again
	saves      uint64            // saves that succeeded (Change.Saved)
	failing    bool              // the last save failed: its recovery is logged
}

// NewRecords are empty records saved to st; Add takes in what st.Load read.
func NewRecords(st *Store, log *slog.Logger) *Records {
	return &Records{store: st, log: log, pods: map[string]*Pod{}, byID: map[string]string{}, prefixes: map[uint64]int{}}
}

// Get is sandboxID's pod, nil when it is not tracked.
func (r *Records) Get(sandboxID string) *Pod { return r.pods[sandboxID] }

// Of is the pod of container instance id, nil when it is not tracked.
func (r *Records) Of(id string) *Pod { return r.pods[r.byID[id]] }

// Indexed is how many instances Of finds (each tracked pod's, once).
func (r *Records) Indexed() int { return len(r.byID) }

// Len is the number of tracked pods.
func (r *Records) Len() int { return len(r.pods) }

// All are the tracked pods by sandbox ID, in no order.
func (r *Records) All() iter.Seq2[string, *Pod] { return maps.All(r.pods) }

// Add tracks p (new, or loaded from disk) and its instances.
func (r *Records) Add(p *Pod) {
	if p.Instances == nil {
		p.Instances = map[string]*Instance{}
	}
	if p.Latest == nil {
		p.Latest = map[string]string{}
	}
	if p.Creates == nil {
		p.Creates = map[string][]byte{}
	}
	if p.Phase == "" {
		p.Phase = PhaseRunning
	}
	if p.Reads == nil {
		p.Reads = &Reads{}
	}
	r.pods[p.SandboxID] = p
	r.surveyed = false
	for id := range p.Instances {
		r.index(id, p.SandboxID)
	}
}

// Drop forgets sandboxID's pod (returned; nil when not tracked), which
// can no longer be saved, and its instances.
func (r *Records) Drop(sandboxID string) *Pod {
	p := r.pods[sandboxID]
	if p == nil {
		return nil
	}
	for id := range p.Instances {
		r.unindex(id)
	}
	delete(r.pods, sandboxID)
	r.surveyed = false
	return p
}

// AddInstance records a new instance id of p's container name with its
// part, which Of and Heads find.
func (r *Records) AddInstance(p *Pod, id, name string, part Part) {
	p.Instances[id] = &Instance{Name: name, Part: part}
	r.index(id, p.SandboxID)
}

// RemoveInstance forgets instance id of p.
func (r *Records) RemoveInstance(p *Pod, id string) {
	delete(p.Instances, id)
	r.unindex(id)
}

// Save writes p's record durably. On an error (statefile.ErrNotDurable)
// the change must not be acted on: Change.Commit puts it back, and the
// caller fails (a CRI call Unavailable) so that it is tried again.
func (r *Records) Save(p *Pod) error {
	if r.pods[p.SandboxID] != p {
		return ErrRemoved
	}
	r.surveyed = false // the change may have taken an instance out of it
	if err := r.store.Save(p); err != nil {
		if !r.failing {
			r.log.Error("restartrecord: state write failed; restart steps are not carried out until writes succeed again",
				"pod", p.Namespace+"/"+p.Name, "err", err)
		}
		r.failing = true
		return fmt.Errorf("restartrecord: recording pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	r.saves++
	if r.failing {
		r.failing = false
		r.log.Info("restartrecord: state writes succeed again")
	}
	return nil
}

// Change is a change of a pod's record in progress (Begin, edits, Commit).
type Change struct {
	r     *Records
	p     *Pod
	snap  Pod
	saves uint64
}

// Begin starts a change of p, which the caller then edits in place.
func (r *Records) Begin(p *Pod) Change { return Change{r: r, p: p, snap: p.Snapshot(), saves: r.saves} }

// Saved reports whether a nested change saved this one since Begin.
func (c Change) Saved() bool { return c.r.saves != c.saves }

// Commit saves the pod when err (the edits' own) is nil. When err is not
// nil or the save fails, the pod and its instances are put back as they
// were at Begin, on disk too if a nested change saved meanwhile (a failure
// is logged by Save; the next save carries it), and the error returned.
func (c Change) Commit(err error) error {
	if err == nil {
		err = c.r.Save(c.p)
	}
	if err == nil {
		return nil
	}
	tracked := c.r.pods[c.p.SandboxID] == c.p // not dropped meanwhile
	if tracked {
		c.r.Drop(c.p.SandboxID) // its instances now, tracked again as at Begin
	}
	*c.p = c.snap
	if tracked {
		c.r.Add(c.p)
	}
	if c.Saved() {
		_ = c.r.Save(c.p)
	}
	return err
}

// Update makes change of p and commits it (Begin, Commit).
func (r *Records) Update(p *Pod, change func(p *Pod) error) error {
	c := r.Begin(p)
	return c.Commit(change(p))
}
