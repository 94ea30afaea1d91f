// Package statefile is the one durability rule for every record the shim
// keeps on disk: write a temporary file beside the target, fsync it, rename it
// over the target, fsync the directory. A crash leaves the old record or the
// new one, never a torn one, and a write that returned nil survives a power
// loss.
//
// It also keeps the node-wide health of state writes: a failed write (disk
// full, read-only file system) marks the shim not ready until a later write
// succeeds, and is counted. Callers must not act on state they could not
// record: they return the error, which wraps ErrNotDurable, and the proxy
// answers it with codes.Unavailable so the kubelet retries.
package statefile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrNotDurable wraps every write error this package returns.
var ErrNotDurable = errors.New("state could not be made durable")

// WriteFile replaces path with data durably. The temporary file is created
// with perm (never wider for a moment) in path's directory, so the rename is
// atomic.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return Record(path, writeFile(path, data, perm))
}

// Record reports the outcome of a state write a package makes durable in its
// own way (podstate's checksummed slots, written in place and fsynced) to
// the health and metrics kept here, and returns err wrapped in ErrNotDurable
// (nil when err is nil).
func Record(path string, err error) error {
	record(path, err)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrNotDurable, path, err)
	}
	return nil
}

// WriteJSON is WriteFile of v encoded as JSON.
func WriteJSON(path string, v any, perm os.FileMode) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return WriteFile(path, b, perm)
}

// Remove deletes path and makes the removal durable. A missing file is not an
// error.
func Remove(path string) error {
	err := os.Remove(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = SyncDir(filepath.Dir(path))
	}
	record(path, err)
	if err != nil {
		return fmt.Errorf("%w: removing %s: %w", ErrNotDurable, path, err)
	}
	return nil
}

// TempSuffix ends the name of a temporary file this package writes; a reader
// listing a directory skips (and may remove) such files, which only a crash
// leaves behind.
const TempSuffix = ".tmp"

func writeFile(path string, data []byte, perm os.FileMode) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".*"+TempSuffix)
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	// CreateTemp makes the file 0600; only widen it when asked, before any
	// byte is written.
	if perm != 0o600 {
		if err = f.Chmod(perm); err != nil {
			return err
		}
	}
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir makes the entries of dir (creations, renames, removals) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

var (
	failing   atomic.Bool
	lastErrMu sync.Mutex
	lastErr   error

	writeErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cri_shim_state_write_errors_total",
		Help: "Writes of the shim's state records that failed (the step they recorded was not carried out).",
	})
	writable = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cri_shim_state_writable",
		Help: "1 while the last state write succeeded, 0 after a failed one until a write succeeds again.",
	}, func() float64 {
		if failing.Load() {
			return 0
		}
		return 1
	})
)

func record(path string, err error) {
	if err == nil {
		if failing.Load() {
			lastErrMu.Lock()
			lastErr = nil
			failing.Store(false)
			lastErrMu.Unlock()
		}
		return
	}
	writeErrors.Inc()
	lastErrMu.Lock()
	lastErr = fmt.Errorf("%s: %w", path, err)
	failing.Store(true)
	lastErrMu.Unlock()
}

// Healthy returns nil while state writes succeed, and the last failure after a
// write failed, until a later write succeeds. /readyz reports it.
func Healthy() error {
	if !failing.Load() {
		return nil
	}
	lastErrMu.Lock()
	defer lastErrMu.Unlock()
	if lastErr == nil {
		return nil
	}
	return fmt.Errorf("state writes failing: %w", lastErr)
}

// Collectors are the package's metrics, registered once by the server.
func Collectors() []prometheus.Collector { return []prometheus.Collector{writeErrors, writable} }
