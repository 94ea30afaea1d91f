package podstate

// The pod records on disk, in the shim's one state store (internal/store):
// the restart state in the slot bucket "podstate" (two checksummed slots per
// sandbox, rewritten in place: a crash-looping pod saves three times per
// restart), the pods whose rules could not be used in the plain bucket
// "podstate-problems".

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/cri-shim/cri-shim/internal/statefile"
	statestore "github.com/cri-shim/cri-shim/internal/store"
)

const (
	// slotMagic heads every slot of a pod's record: the format and its version.
	slotMagic      = "cri-shim-pod 1"
	podsBucket     = "podstate"
	problemsBucket = "podstate-problems"
)

// store keeps each tracked pod's record (Pod as JSON) in a slot bucket, so
// a kill -9 or a power loss during a save leaves the record before it
// (statestore.Slots). Each save is durable before it returns and reported to
// statefile's health: a step whose save failed is not carried out
// (docs/operations.md, "Readiness on write failure"). Saves of one pod are
// serialised by the manager's lock.
type store struct {
	slots    *statestore.Slots
	problems *statestore.Bucket
	// write writes one slot durably (statestore.WriteSlot; tests make it fail).
	write func(path string, b []byte) error
}

// newStore opens the pod records in the state store under stateDir, moving
// in those an earlier version kept in stateDir/pods and stateDir/problems.
func newStore(stateDir string) (*store, error) {
	st, err := statestore.Open(statestore.RootIn(stateDir))
	if err != nil {
		return nil, fmt.Errorf("podstate: %w", err)
	}
	slots, err := st.Slots(podsBucket, slotMagic)
	if err != nil {
		return nil, fmt.Errorf("podstate: %w", err)
	}
	problems, err := st.Bucket(problemsBucket)
	if err != nil {
		return nil, fmt.Errorf("podstate: %w", err)
	}
	s := &store{slots: slots, problems: problems, write: statestore.WriteSlot}
	slots.Write = func(path string, b []byte) error { return s.write(path, b) }
	if err := s.adoptEarlier(stateDir); err != nil {
		return nil, fmt.Errorf("podstate: moving records into the state store: %w", err)
	}
	return s, nil
}

// slot is the file of a pod's slot i.
func (s *store) slot(sandboxID string, i uint64) string { return s.slots.Path(sandboxID, i) }

func (s *store) save(p *Pod) error {
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return s.slots.Put(p.SandboxID, body)
}

func (s *store) remove(sandboxID string) error {
	return errors.Join(s.slots.Remove(sandboxID), s.problems.Remove(sandboxID))
}

// saveProblems records a pod whose rules could not be used at all, so
// `cri-shim pods` can show why it runs with plain kubelet behaviour. Such pods
// are not tracked: their calls stay on the raw path.
func (s *store) saveProblems(p *Pod) error {
	return s.problems.PutJSON(p.SandboxID, p)
}

// load reads every saved pod; unreadable ones are reported and skipped.
func (s *store) load() ([]*Pod, []error) {
	pods, errs := readAll(s.slots)
	return pods, errs
}

// pruneProblems drops problems-only records of sandboxes that are gone.
func (s *store) pruneProblems(live map[string]bool) {
	ids, _ := s.problems.List()
	for _, id := range ids {
		if !live[id] {
			_ = s.problems.Remove(id)
		}
	}
}

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

// adoptEarlier moves the records an earlier version kept outside the store
// into it: slots (<sandbox>.0, .1) are renamed into the slot bucket, a
// single-file record (<sandbox>.json, older still) becomes a slot, and a
// problems record is adopted into its bucket. A kill -9 part way leaves
// the rest where it was, moved on the next start; a record found in both
// places is the earlier version's (it can only be newer after a
// downgrade).
func (s *store) adoptEarlier(stateDir string) error {
	old := filepath.Join(stateDir, "pods")
	ents, err := os.ReadDir(old)
	if errors.Is(err, fs.ErrNotExist) {
		ents = nil
	} else if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		name := e.Name()
		from := filepath.Join(old, name)
		if strings.HasPrefix(name, ".") && strings.HasSuffix(name, ".tmp") {
			_ = os.Remove(from) // a save of the single-file record cut short
			continue
		}
		if id, ok := strings.CutSuffix(name, ".json"); ok && statestore.CheckKey(id) == nil {
			b, err := os.ReadFile(from)
			if err == nil {
				err = s.slots.Put(id, b)
			}
			if err == nil {
				err = os.Remove(from)
			}
			errs = append(errs, err)
			continue
		}
		id, i, ok := strings.Cut(name, ".")
		if !ok || (i != "0" && i != "1") || statestore.CheckKey(id) != nil {
			continue
		}
		errs = append(errs, os.Rename(from, filepath.Join(s.slots.Dir(), name)))
	}
	if len(ents) > 0 {
		errs = append(errs, statefile.SyncDir(s.slots.Dir()), statefile.SyncDir(old))
	}
	if probs, err := os.ReadDir(filepath.Join(stateDir, "problems")); err == nil {
		for _, e := range probs {
			if id, ok := strings.CutSuffix(e.Name(), ".json"); ok && statestore.CheckKey(id) == nil {
				errs = append(errs, s.problems.Adopt(id, filepath.Join(stateDir, "problems", e.Name())))
			}
		}
		_ = os.Remove(filepath.Join(stateDir, "problems")) // only when empty
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	_ = os.Remove(old) // only when empty
	return nil
}
