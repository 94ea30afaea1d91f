package store

import (
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
// statefile; a later Gone of the same id, or the pod table's next relist,
// tries again).
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
