package podstate

// The pod records on disk: two checksummed slot files per pod, written in
// place and fsynced.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cri-shim/cri-shim/internal/statefile"
)

// store persists each pod in two slot files, <sandbox>.0 and <sandbox>.1,
// written alternately and in place. A slot is a header line,
// "cri-shim-pod 1 <seq> <length> <crc32c>", then the pod as JSON. A kill -9
// or a power loss in the middle of a write tears at most the slot being
// written, whose length or checksum then fails; the other slot still holds
// the state before: the guarantee of statefile's rule (temp file, fsync,
// rename, fsync of the directory) at a fraction of its cost on ext4, since
// no file is created or renamed per save (a rename over an existing file makes
// ext4 allocate and write out the new file's blocks at once, auto_da_alloc;
// creating the temp file is a journal transaction of its own). A crash-looping
// pod pays a save three times per restart (docs/backoff.md).
// Each write is made durable before save returns (fdatasync of the slot, and
// an fsync of the directory when the slot file was created), and its outcome
// is reported to statefile's health (statefile.Record): a step whose save
// failed is not carried out (docs/operations.md, "Readiness on write failure").
// Saves of one pod are serialised by the manager's lock.
type store struct {
	dir string
	seq map[string]uint64 // sandbox -> sequence number of its newest slot
	// write writes one slot durably (writeSlot; tests make it fail).
	write func(path string, b []byte) error
}

const slotMagic = "cri-shim-pod 1"

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func newStore(stateDir string) (*store, error) {
	dir := filepath.Join(stateDir, "pods")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("podstate: %w", err)
	}
	// Temp files of saves a kill -9 cut short (state written by earlier versions).
	if tmps, err := filepath.Glob(filepath.Join(dir, ".*.tmp")); err == nil {
		for _, t := range tmps {
			_ = os.Remove(t)
		}
	}
	s := &store{dir: dir, seq: map[string]uint64{}}
	s.write = s.writeSlot
	return s, nil
}

func (s *store) slot(sandboxID string, i uint64) string {
	return filepath.Join(s.dir, sandboxID+"."+strconv.FormatUint(i%2, 10))
}

// legacy is the single JSON file earlier versions kept per pod.
func (s *store) legacy(sandboxID string) string {
	return filepath.Join(s.dir, sandboxID+".json")
}

func (s *store) save(p *Pod) error {
	if err := fileName(p.SandboxID); err != nil {
		return err
	}
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	seq := s.seq[p.SandboxID] + 1
	b := make([]byte, 0, len(body)+64)
	b = fmt.Appendf(b, "%s %d %d %08x\n", slotMagic, seq, len(body), crc32.Checksum(body, crcTable))
	b = append(b, body...)
	path := s.slot(p.SandboxID, seq)
	if err := statefile.Record(path, s.write(path, b)); err != nil {
		return err
	}
	s.seq[p.SandboxID] = seq
	if seq == 1 {
		_ = os.Remove(s.legacy(p.SandboxID))
	}
	return nil
}

// fileName refuses a sandbox ID that cannot be used as a file name as is.
func fileName(sandboxID string) error {
	if strings.ContainsAny(sandboxID, "/\\.") || sandboxID == "" {
		return fmt.Errorf("podstate: refusing sandbox id %q as a file name", sandboxID)
	}
	return nil
}

// writeSlot overwrites the slot holding the older state from offset 0 and
// makes it durable; bytes of a longer earlier record past the new length are
// ignored when reading.
func (s *store) writeSlot(path string, b []byte) error {
	created := true
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		created = false
		f, err = os.OpenFile(path, os.O_WRONLY, 0)
	}
	if err != nil {
		return err
	}
	_, err = f.WriteAt(b, 0)
	if err == nil {
		// Data and the size: the mtime is not needed to read the slot.
		err = ignoringEINTR(func() error { return unix.Fdatasync(int(f.Fd())) })
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && created {
		err = statefile.SyncDir(s.dir)
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

// decodeSlot checks one slot's header and checksum and returns its sequence
// number and JSON body.
func decodeSlot(b []byte) (seq uint64, body []byte, err error) {
	line, rest, ok := bytes.Cut(b, []byte("\n"))
	if !ok {
		return 0, nil, errors.New("no header line")
	}
	f := strings.Fields(string(line))
	if len(f) != 5 || f[0]+" "+f[1] != slotMagic {
		return 0, nil, fmt.Errorf("header %q: want %q <seq> <length> <crc32c>", line, slotMagic)
	}
	seq, err = strconv.ParseUint(f[2], 10, 64)
	if err != nil || seq == 0 {
		return 0, nil, fmt.Errorf("header %q: bad sequence number", line)
	}
	n, err := strconv.ParseUint(f[3], 10, 32)
	if err != nil || n > uint64(len(rest)) {
		return 0, nil, fmt.Errorf("header %q: length past the end of the file (torn write)", line)
	}
	sum, err := strconv.ParseUint(f[4], 16, 32)
	if err != nil {
		return 0, nil, fmt.Errorf("header %q: bad checksum", line)
	}
	body = rest[:n]
	if crc32.Checksum(body, crcTable) != uint32(sum) {
		return 0, nil, fmt.Errorf("checksum mismatch (torn write)")
	}
	return seq, body, nil
}

// readPod reads a pod's newest intact slot, or its legacy JSON file when it
// has no slots. found is false when there is neither.
func readPod(dir, sandboxID string) (p *Pod, seq uint64, found bool, err error) {
	var best []byte
	var errs []error
	for i := range 2 {
		b, rerr := os.ReadFile(filepath.Join(dir, sandboxID+"."+strconv.Itoa(i)))
		if errors.Is(rerr, os.ErrNotExist) {
			continue
		}
		found = true
		if rerr != nil {
			errs = append(errs, rerr)
			continue
		}
		sq, body, derr := decodeSlot(b)
		if derr != nil {
			errs = append(errs, fmt.Errorf("%s.%d: %w", sandboxID, i, derr))
			continue
		}
		if sq > seq {
			seq, best = sq, body
		}
	}
	if !found {
		b, rerr := os.ReadFile(filepath.Join(dir, sandboxID+".json"))
		if errors.Is(rerr, os.ErrNotExist) {
			return nil, 0, false, nil
		}
		if rerr != nil {
			return nil, 0, true, rerr
		}
		found, best = true, b
	}
	if best == nil {
		return nil, 0, true, errors.Join(errs...)
	}
	p = &Pod{}
	if err := json.Unmarshal(best, p); err != nil {
		return nil, 0, true, fmt.Errorf("%s: %w", sandboxID, err)
	}
	return p, seq, true, nil
}

// sandboxes lists the pods that have state files in dir.
func sandboxes(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, e := range entries {
		name := e.Name()
		id := ""
		for _, suf := range []string{".0", ".1", ".json"} {
			if v, ok := strings.CutSuffix(name, suf); ok {
				id = v
			}
		}
		if id == "" || strings.HasPrefix(id, ".") || seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, id)
	}
	return out, nil
}

func (s *store) remove(sandboxID string) error {
	_ = os.Remove(filepath.Join(filepath.Dir(s.dir), "problems", sandboxID+".json"))
	delete(s.seq, sandboxID)
	var errs []error
	for _, f := range []string{s.slot(sandboxID, 0), s.slot(sandboxID, 1), s.legacy(sandboxID)} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// saveProblems records a pod whose rules could not be used at all, so
// `cri-shim pods` can show why it runs with plain kubelet behaviour. Such pods
// are not tracked: their calls stay on the raw path.
func (s *store) saveProblems(p *Pod) error {
	if err := fileName(p.SandboxID); err != nil {
		return err
	}
	dir := filepath.Join(filepath.Dir(s.dir), "problems")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return statefile.Record(dir, err)
	}
	return statefile.WriteJSON(filepath.Join(dir, p.SandboxID+".json"), p, 0o600)
}

// ReadPods reads every pod the shim has state for (tracked or only with
// problems) from stateDir, for `cri-shim pods`; it never modifies anything.
func ReadPods(stateDir string) ([]Pod, error) {
	var out []Pod
	ids, err := sandboxes(filepath.Join(stateDir, "pods"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, id := range ids {
		p, _, found, err := readPod(filepath.Join(stateDir, "pods"), id)
		if err != nil {
			return nil, err
		}
		if found {
			out = append(out, *p)
		}
	}
	entries, err := os.ReadDir(filepath.Join(stateDir, "problems"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(stateDir, "problems", e.Name()))
		if err != nil {
			return nil, err
		}
		var p Pod
		if err := json.Unmarshal(b, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		out = append(out, p)
	}
	return out, nil
}

// load reads every saved pod; unreadable ones are reported and skipped.
func (s *store) load() ([]*Pod, []error) {
	ids, err := sandboxes(s.dir)
	if err != nil {
		return nil, []error{err}
	}
	var pods []*Pod
	var errs []error
	for _, id := range ids {
		p, seq, found, err := readPod(s.dir, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if found {
			s.seq[id] = seq
			pods = append(pods, p)
		}
	}
	return pods, errs
}

// pruneProblems drops problems-only records of sandboxes that are gone.
func (s *store) pruneProblems(live map[string]bool) {
	dir := filepath.Join(filepath.Dir(s.dir), "problems")
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if id := strings.TrimSuffix(e.Name(), ".json"); !live[id] {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
