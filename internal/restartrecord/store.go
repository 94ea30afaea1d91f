package restartrecord

// The records on disk, in the shim's one state store (internal/store):
// the restart state in the slot bucket "podstate" (two checksummed slots per
// sandbox, rewritten in place: a crash-looping pod saves three times per
// restart), the pods whose rules could not be used in the plain bucket
// "podstate-problems".

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	statestore "github.com/cri-shim/cri-shim/internal/store"
)

const (
	// slotMagic heads every slot of a pod's record: the format and its version.
	slotMagic      = "cri-shim-pod 1"
	podsBucket     = "podstate"
	problemsBucket = "podstate-problems"
)

// Store keeps each tracked pod's record (Pod as JSON) in a slot bucket, so
// a kill -9 or a power loss during a save leaves the record before it
// (statestore.Slots). Each save is durable before it returns and reported to
// statefile's health: a step whose save failed is not carried out
// (docs/operations.md, "Readiness on write failure"). Saves go through
// Records, under podstate's lock.
type Store struct {
	slots    *statestore.Slots
	problems *statestore.Bucket
	// Write writes one slot durably (statestore.WriteSlot; tests make it fail).
	Write func(path string, b []byte) error
}

// Open opens the pod records in the state store under stateDir.
func Open(stateDir string) (*Store, error) {
	st, err := statestore.Open(statestore.RootIn(stateDir))
	if err != nil {
		return nil, fmt.Errorf("restartrecord: %w", err)
	}
	slots, err := st.Slots(podsBucket, slotMagic)
	if err != nil {
		return nil, fmt.Errorf("restartrecord: %w", err)
	}
	problems, err := st.Bucket(problemsBucket)
	if err != nil {
		return nil, fmt.Errorf("restartrecord: %w", err)
	}
	s := &Store{slots: slots, problems: problems, Write: statestore.WriteSlot}
	slots.Write = func(path string, b []byte) error { return s.Write(path, b) }
	return s, nil
}

// Slot is the file of a pod's slot i.
func (s *Store) Slot(sandboxID string, i uint64) string { return s.slots.Path(sandboxID, i) }

// Save writes p's record durably.
func (s *Store) Save(p *Pod) error {
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return s.slots.Put(p.SandboxID, body)
}

// Remove removes the records of sandboxID.
func (s *Store) Remove(sandboxID string) error {
	return errors.Join(s.slots.Remove(sandboxID), s.problems.Remove(sandboxID))
}

// SaveProblems records a pod whose rules could not be used at all, so
// `cri-shim pods` can show why it runs with plain kubelet behaviour. Such pods
// are not tracked: their calls stay on the raw path.
func (s *Store) SaveProblems(p *Pod) error {
	return s.problems.PutJSON(p.SandboxID, p)
}

// Load reads every saved pod; unreadable ones are reported and skipped.
func (s *Store) Load() ([]*Pod, []error) { return readAll(s.slots) }

func readAll(slots *statestore.Slots) ([]*Pod, []error) {
	ids, err := slots.List()
	if err != nil {
		return nil, []error{err}
	}
	var pods []*Pod
	var errs []error
	for _, id := range ids {
		b, err := slots.Get(id)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the listing
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p := &Pod{}
		if err := json.Unmarshal(b, p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
			continue
		}
		pods = append(pods, p)
	}
	return pods, errs
}

// ReadPods reads every pod the shim has state for (tracked or only with
// problems) from stateDir, for `cri-shim pods`; it never modifies anything.
func ReadPods(stateDir string) ([]Pod, error) {
	root := statestore.RootIn(stateDir)
	pods, errs := readAll(statestore.ReadSlots(root, podsBucket, slotMagic))
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var out []Pod
	for _, p := range pods {
		out = append(out, *p)
	}
	problems := statestore.ReadBucket(root, problemsBucket)
	ids, err := problems.List()
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		var p Pod
		if err := problems.GetJSON(id, &p); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}
