package store

// Slot buckets: the store's second record kind, for records rewritten several
// times a second (podstate's restart state, three saves per restart of a
// crash-looping pod).

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cri-shim/cri-shim/internal/statefile"
)

// Slots holds a feature's records as two checksummed slot files per key,
// <key>.0 and <key>.1, written alternately and in place. A slot is a header
// line, "<magic> <seq> <length> <crc32c>", then the record. A kill -9 or a
// power loss in the middle of a write tears at most the slot being written,
// whose length or checksum then fails; the other slot still holds the record
// before. That is the guarantee of statefile's rule (temporary file, fsync,
// rename, fsync of the directory) at about a third of its cost on ext4
// (bench/results/podstate-save-20261123.md): no file is created or renamed
// per write, and a rename over an existing file makes ext4 write the new
// file's blocks at once (auto_da_alloc), while creating the temporary file
// is a journal transaction of its own.
//
// Each Put is durable before it returns (fdatasync of the slot, and an fsync
// of the directory when the slot file was created), and its outcome is
// reported to statefile's health; an error wraps statefile.ErrNotDurable.
// Puts of one key must be serialised by the caller; different keys may be
// written concurrently. Gone removes a key's slots like any other record.
type Slots struct {
	dir   string
	magic string

	mu  sync.Mutex
	seq map[string]uint64 // key -> sequence number of its newest slot

	// Write writes one slot's bytes durably at path; nil is WriteSlot.
	// Tests replace it to make writes fail as on a full disk.
	Write func(path string, b []byte) error
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Slots returns the feature's slot bucket, creating its directory (0700) if
// missing. magic starts every slot's header and names the record's format
// and version (letters, digits, spaces; checked on every read).
func (s *Store) Slots(name, magic string) (*Slots, error) {
	b, err := s.Bucket(name)
	if err != nil {
		return nil, err
	}
	return newSlots(b.dir, magic), nil
}

// ReadSlots is a slot bucket of the store rooted at root for reading only
// (the CLI's view of a running shim's records): nothing is created, and a
// missing bucket lists empty.
func ReadSlots(root, name, magic string) *Slots {
	return newSlots(filepath.Join(root, name), magic)
}

func newSlots(dir, magic string) *Slots {
	return &Slots{dir: dir, magic: magic, seq: map[string]uint64{}}
}

// Dir is the bucket's directory.
func (b *Slots) Dir() string { return b.dir }

// Path is the file of key's slot i (0 or 1; larger values wrap).
func (b *Slots) Path(key string, i uint64) string {
	return filepath.Join(b.dir, key+"."+strconv.FormatUint(i%2, 10))
}

// Put replaces key's record with data, durably, by overwriting the slot that
// holds the older record.
func (b *Slots) Put(key string, data []byte) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	b.mu.Lock()
	seq := b.seq[key] + 1
	b.mu.Unlock()
	slot := make([]byte, 0, len(data)+64)
	slot = fmt.Appendf(slot, "%s %d %d %08x\n", b.magic, seq, len(data), crc32.Checksum(data, crcTable))
	slot = append(slot, data...)
	path := b.Path(key, seq)
	write := b.Write
	if write == nil {
		write = WriteSlot
	}
	if err := statefile.Record(path, write(path, slot)); err != nil {
		return err
	}
	b.mu.Lock()
	b.seq[key] = seq
	b.mu.Unlock()
	return nil
}

// WriteSlot overwrites the file at path from offset 0 with b and makes it
// durable; the bytes of a longer earlier slot past the new length are ignored
// when reading.
func WriteSlot(path string, b []byte) error {
	created := true
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		created = false
		f, err = os.OpenFile(path, os.O_WRONLY, 0)
	}
	if err != nil {
		return err
	}
	_, err = f.WriteAt(b, 0)
	if err == nil {
		// Data and size: the mtime is not needed to read the slot.
		err = ignoringEINTR(func() error { return unix.Fdatasync(int(f.Fd())) })
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && created {
		err = statefile.SyncDir(filepath.Dir(path))
	}
	return err
}

func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// Get returns key's newest intact record. A key with no slot is an error
// wrapping fs.ErrNotExist; a key whose slots are all torn or unreadable is
// an error naming each. A later Put continues after the sequence read.
func (b *Slots) Get(key string) ([]byte, error) {
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	var best []byte
	var seq uint64
	var errs []error
	found := false
	for i := range uint64(2) {
		raw, err := os.ReadFile(b.Path(key, i))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		found = true
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sq, body, err := DecodeSlot(b.magic, raw)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.%d: %w", key, i, err))
			continue
		}
		if sq > seq {
			seq, best = sq, body
		}
	}
	if !found {
		return nil, fmt.Errorf("record %s: %w", key, fs.ErrNotExist)
	}
	if best == nil {
		return nil, errors.Join(errs...)
	}
	b.mu.Lock()
	b.seq[key] = max(b.seq[key], seq)
	b.mu.Unlock()
	return best, nil
}

// DecodeSlot checks one slot's header against magic and its checksum, and
// returns its sequence number and record.
func DecodeSlot(magic string, raw []byte) (seq uint64, body []byte, err error) {
	line, rest, ok := bytes.Cut(raw, []byte("\n"))
	if !ok {
		return 0, nil, errors.New("no header line")
	}
	head, ok := strings.CutPrefix(string(line), magic+" ")
	f := strings.Fields(head)
	if !ok || len(f) != 3 {
		return 0, nil, fmt.Errorf("header %.64q: want %q <seq> <length> <crc32c>", line, magic)
	}
	seq, err = strconv.ParseUint(f[0], 10, 64)
	if err != nil || seq == 0 {
		return 0, nil, fmt.Errorf("header %.64q: bad sequence number", line)
	}
	n, err := strconv.ParseUint(f[1], 10, 32)
	if err != nil || n > uint64(len(rest)) {
		return 0, nil, fmt.Errorf("header %.64q: length past the end of the file (torn write)", line)
	}
	sum, err := strconv.ParseUint(f[2], 16, 32)
	if err != nil {
		return 0, nil, fmt.Errorf("header %.64q: bad checksum", line)
	}
	body = rest[:n]
	if crc32.Checksum(body, crcTable) != uint32(sum) {
		return 0, nil, errors.New("checksum mismatch (torn write)")
	}
	return seq, body, nil
}

// List returns the keys that have a slot, sorted. A missing bucket lists
// empty.
func (b *Slots) List() ([]string, error) {
	return keysIn(b.dir)
}

// Remove deletes key's slots durably; a key with none is not an error.
func (b *Slots) Remove(key string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	b.mu.Lock()
	delete(b.seq, key)
	b.mu.Unlock()
	return removeKey(b.dir, key)
}

// removeKey deletes whatever record key has in dir, of either kind (a file
// named key, or its two slots), with one fsync of the directory.
func removeKey(dir, key string) error {
	removed := false
	var errs []error
	for _, name := range []string{key, key + ".0", key + ".1"} {
		err := os.Remove(filepath.Join(dir, name))
		switch {
		case err == nil:
			removed = true
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, err)
		}
	}
	if removed {
		errs = append(errs, statefile.SyncDir(dir))
	}
	return statefile.Record(filepath.Join(dir, key), errors.Join(errs...))
}
