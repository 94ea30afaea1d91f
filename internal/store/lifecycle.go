package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
)

// Subscribe registers f to be told, by Gone, that a sandbox is gone. f drops
// what its feature keeps of the sandbox in memory; once f returns, the
// feature writes no record of the sandbox any more (its records are removed
// right after). f must be quick and must not call Gone.
func (s *Store) Subscribe(f func(id string)) {
	s.mu.Lock()
	s.subs = append(s.subs, f)
	s.mu.Unlock()
}

// Gone announces that sandbox id no longer exists: every subscriber is told,
// in the order they subscribed, then id's record in every bucket (of this
// run or left by an earlier one) is removed durably. It is idempotent; an
// id that is not a key has no records, but subscribers are still told. An
// error means a record could not be removed (logged and counted by
// statefile; a later Gone of the same id, or a sweep, tries again).
func (s *Store) Gone(id string) error {
	s.mu.Lock()
	subs := append([]func(string){}, s.subs...)
	s.mu.Unlock()
	for _, f := range subs {
		f(id)
	}
	if CheckKey(id) != nil {
		return nil
	}
	buckets, err := s.buckets()
	if err != nil {
		return err
	}
	var errs []error
	for _, b := range buckets {
		errs = append(errs, b.Remove(id))
	}
	return errors.Join(errs...)
}

// Known returns the sandboxes that have a record in some bucket.
func (s *Store) Known() (map[string]bool, error) {
	buckets, err := s.buckets()
	if err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	for _, b := range buckets {
		keys, err := b.List()
		if err != nil {
			return nil, err
		}
		for _, k := range keys {
			ids[k] = true
		}
	}
	return ids, nil
}

// Sweep announces Gone for every sandbox that has a record but that list (the
// runtime's sandboxes) does not return: those removed while the shim was down
// or behind its back. Only records that existed before list was called are
// candidates, since a sandbox created meanwhile may be missing from its
// answer. It returns the sandboxes it announced gone.
func (s *Store) Sweep(ctx context.Context, list func(context.Context) ([]string, error)) ([]string, error) {
	known, err := s.Known()
	if err != nil || len(known) == 0 {
		return nil, err
	}
	live, err := list(ctx)
	if err != nil {
		return nil, err
	}
	for _, id := range live {
		delete(known, id)
	}
	var gone []string
	var errs []error
	for id := range known {
		gone = append(gone, id)
		errs = append(errs, s.Gone(id))
	}
	return gone, errors.Join(errs...)
}

// buckets are the bucket directories under the root.
func (s *Store) buckets() ([]*Bucket, error) {
	ents, err := os.ReadDir(s.root)
	if err != nil {
		return nil, err
	}
	var out []*Bucket
	for _, e := range ents {
		if e.IsDir() && CheckKey(e.Name()) == nil {
			out = append(out, &Bucket{dir: filepath.Join(s.root, e.Name())})
		}
	}
	return out, nil
}
