// Package store is the one place where the shim's features keep their
// per-sandbox records on disk, and the one lifecycle that tells every
// feature when a sandbox goes away.
//
// A Store is rooted in a directory the shim owns (state_dir/store). Each
// feature has a bucket, a directory under the root ("podmgmt", "warm", ...),
// and each sandbox at most one record in it, named by its key (the sandbox
// ID). A Bucket writes a record as one file by statefile's rule (temporary
// file, fsync, rename, fsync of the directory); Slots, for records rewritten
// several times a second, as two checksummed slots written alternately in
// place (slots.go). Either way a crash leaves the old record or the new one,
// every failure is reported to statefile's health and metrics and wraps
// statefile.ErrNotDurable, and files are created 0600 in directories 0700.
//
// The lifecycle (Subscribe, Gone) replaces a tracker per feature: whoever
// learns that a sandbox is gone (RemovePodSandbox answered, or the runtime
// no longer lists it) calls Gone once; every subscriber drops what it keeps
// of the sandbox, then the sandbox's file in every bucket is removed.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/cri-shim/cri-shim/internal/statefile"
)

// MaxKeyLen bounds a key (a sandbox ID from containerd is 64 hex digits).
const MaxKeyLen = 128

// ErrBadKey marks a key that cannot name a record.
var ErrBadKey = errors.New("not usable as a record key")

// CheckKey refuses a key that is not a plain file name of letters, digits,
// '-' and '_' of at most MaxKeyLen bytes. Keys come from the runtime and pods
// and are treated as hostile: no path separator, no dot (so neither "." nor
// ".." nor a hidden or temporary file), no NUL, nothing empty.
func CheckKey(key string) error {
	if key == "" || len(key) > MaxKeyLen {
		return fmt.Errorf("key %.*q: %w (1-%d characters)", MaxKeyLen, key, ErrBadKey, MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("key %q: %w (letters, digits, '-' and '_' only)", key, ErrBadKey)
		}
	}
	return nil
}

// Store is the root of the shim's per-sandbox records and their lifecycle.
type Store struct {
	root string

	mu   sync.Mutex
	subs []func(id string)
}

// RootIn is the store's directory in the shim's state directory (the
// state_dir configuration key).
func RootIn(stateDir string) string { return filepath.Join(stateDir, "store") }

// Open returns the store rooted at root, creating it (0700) if missing.
//
// Open removes the temporary files a crash left in the buckets: the daemon
// opens its store at start, before anything writes. Nothing later removes
// them, since a temporary file may be a write in flight.
func Open(root string) (*Store, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("state store %s: %w", root, err)
	}
	s := &Store{root: root}
	buckets, err := s.buckets()
	if err != nil {
		return nil, fmt.Errorf("state store %s: %w", root, err)
	}
	for _, b := range buckets {
		ents, _ := os.ReadDir(b.dir)
		for _, e := range ents {
			if isTemp(e.Name()) {
				_ = os.Remove(filepath.Join(b.dir, e.Name()))
			}
		}
	}
	return s, nil
}

// Root is the store's directory.
func (s *Store) Root() string { return s.root }

// Bucket returns the feature's bucket, creating its directory (0700) if
// missing. Bucket names follow the rules of keys.
func (s *Store) Bucket(name string) (*Bucket, error) {
	if err := CheckKey(name); err != nil {
		return nil, fmt.Errorf("bucket: %w", err)
	}
	b := &Bucket{dir: filepath.Join(s.root, name)}
	if err := os.Mkdir(b.dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("%w: %s: %w", statefile.ErrNotDurable, b.dir, err)
	} else if err == nil {
		if err := statefile.SyncDir(s.root); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", statefile.ErrNotDurable, s.root, err)
		}
	}
	return b, nil
}

// ReadBucket is a bucket of the store rooted at root for reading only (the
// CLI's view of a running shim's records): nothing is created, and a missing
// bucket lists empty.
func ReadBucket(root, name string) *Bucket {
	return &Bucket{dir: filepath.Join(root, name)}
}

// Bucket holds one feature's records, one file per key.
type Bucket struct {
	dir string
}

// Dir is the bucket's directory.
func (b *Bucket) Dir() string { return b.dir }

func (b *Bucket) path(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	return filepath.Join(b.dir, key), nil
}

// Put replaces key's record with data, durably. An error wraps
// statefile.ErrNotDurable (or ErrBadKey): the step the record stands for must
// not be carried out.
func (b *Bucket) Put(key string, data []byte) error {
	p, err := b.path(key)
	if err != nil {
		return err
	}
	return statefile.WriteFile(p, data, 0o600)
}

// PutJSON is Put of v encoded as JSON.
func (b *Bucket) PutJSON(key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("record %s: %w", key, err)
	}
	return b.Put(key, data)
}

// Get returns key's record; a missing one is an error wrapping
// fs.ErrNotExist.
func (b *Bucket) Get(key string) ([]byte, error) {
	p, err := b.path(key)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(p)
}

// GetJSON is Get decoded from JSON into v.
func (b *Bucket) GetJSON(key string, v any) error {
	data, err := b.Get(key)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("record %s: %w", key, err)
	}
	return nil
}

// List returns the bucket's keys, sorted; names that are not keys
// (temporary files among them) are skipped. A missing bucket lists empty.
func (b *Bucket) List() ([]string, error) {
	return keysIn(b.dir)
}

// keysIn lists the keys that have a record in dir, of either kind (a file
// named by the key, or a slot <key>.0 or <key>.1), sorted.
func keysIn(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var keys []string
	seen := map[string]bool{}
	for _, e := range ents {
		name := e.Name()
		if isTemp(name) || !e.Type().IsRegular() {
			continue
		}
		key := name
		if k, ok := strings.CutSuffix(name, ".0"); ok {
			key = k
		} else if k, ok := strings.CutSuffix(name, ".1"); ok {
			key = k
		}
		if CheckKey(key) != nil || seen[key] {
			continue
		}
		seen[key] = true
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return keys, nil
}

// isTemp reports whether name is a temporary file of statefile's rule
// (".<target>.<random>.tmp"): a write in flight, or one a crash left.
func isTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.HasSuffix(name, statefile.TempSuffix)
}

// Remove deletes key's record durably; a missing record is not an error.
func (b *Bucket) Remove(key string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	return removeKey(b.dir, key)
}
