// Package layout is the on-disk layout of a pod checkpoint (docs/checkpoint.md,
// "Layout"): the manifest, the names inside a checkpoint directory, the
// confinement of paths to the checkpoint root, and the bounds on what is read
// of an archive from outside. It is a leaf: the capture and restores
// (internal/capture, internal/restore, internal/warm), the registry artifacts (internal/ociartifact), the
// PodCheckpoint reconciler and the CLI all read checkpoints through it.
package layout

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Version is the version of the pod checkpoint layout this build writes and
// the only one it restores. Bump it on any incompatible change.
const Version = 1

// File names inside a pod checkpoint directory (docs/checkpoint.md).
const (
	ManifestFile   = "manifest.json"
	SandboxFile    = "sandbox.json"
	ContainersDir  = "containers"
	IncompleteFile = ".cri-shim-incomplete"
)

// Manifest describes one pod checkpoint. It is written last, so a directory
// without one is not a checkpoint.
type Manifest struct {
	FormatVersion  int       `json:"formatVersion"`
	CheckpointedAt time.Time `json:"checkpointedAt"`
	Pod            PodInfo   `json:"pod"`
	// Containers are the captured containers in creation order, which is the
	// order RestorePod creates them in.
	Containers []ContainerEntry `json:"containers"`
	// Exited are the pod's containers that had already exited when it was
	// captured (completed init containers): not captured, but a warm start
	// shows them completed instead of running them again.
	Exited []ExitedEntry `json:"exited,omitempty"`
	// Managed marks a checkpoint made by 'cri-shim checkpoint'; only those are
	// subject to retention.
	Managed bool `json:"managed,omitempty"`

	Runtime     string `json:"runtime"`
	CRIUVersion string `json:"criuVersion"`
	Kernel      string `json:"kernel"`
	// CgroupMode is the node's cgroup mode at the capture (CgroupV1 or
	// CgroupV2); empty in checkpoints of builds that did not record it.
	CgroupMode    string  `json:"cgroupMode,omitempty"`
	FrozenSeconds float64 `json:"frozenSeconds"`
	// Freeze is where FrozenSeconds went; nil in checkpoints of builds
	// that did not record it. Informational: nothing acts on it.
	Freeze       *FreezeTimes `json:"freeze,omitempty"`
	TotalSeconds float64      `json:"totalSeconds"`
	SizeBytes    int64        `json:"sizeBytes"`
}

// FreezeTimes divides the pod's freeze into its three spans, in seconds.
type FreezeTimes struct {
	// PauseSeconds runs from the first pause asked until every container
	// is paused (containerd's pause of each, in parallel).
	PauseSeconds float64 `json:"pauseSeconds"`
	// CaptureSeconds runs from then until every container's capture has
	// ended (ContainerEntry.Capture).
	CaptureSeconds float64 `json:"captureSeconds"`
	// ResumeSeconds runs from then until every container is resumed
	// (containerd's resume of each, in parallel).
	ResumeSeconds float64 `json:"resumeSeconds"`
}

// PodInfo identifies the pod the checkpoint was taken from.
type PodInfo struct {
	Name           string `json:"name"`
	Namespace      string `json:"namespace"`
	UID            string `json:"uid"`
	SandboxID      string `json:"sandboxId"`
	RuntimeHandler string `json:"runtimeHandler,omitempty"`
}

// ContainerEntry is one captured container.
type ContainerEntry struct {
	Name string `json:"name"`
	ID   string `json:"id"`
	// Archive is the containerd checkpoint archive, relative to the checkpoint
	// directory: CRIU images, the writable-layer diff, config and spec.
	Archive      string  `json:"archive"`
	Image        string  `json:"image"`
	ImageRef     string  `json:"imageRef"`
	ImageID      string  `json:"imageId,omitempty"`
	RestartCount int     `json:"restartCount"`
	Attempt      uint32  `json:"attempt"`
	SizeBytes    int64   `json:"sizeBytes"`
	DumpSeconds  float64 `json:"dumpSeconds"`
	// Capture is where DumpSeconds went; nil in checkpoints of builds that
	// did not record it. Informational: nothing acts on it.
	Capture *CaptureTimes `json:"capture,omitempty"`
}

// CaptureTimes divides one container's capture (the pod paused), in seconds.
type CaptureTimes struct {
	// CheckpointSeconds is containerd's task checkpoint: the round trip
	// through containerd and its runc shim, runc, and CRIU under it.
	CheckpointSeconds float64 `json:"checkpointSeconds"`
	// DiffSeconds is the writable layer's diff by containerd's diff service.
	DiffSeconds float64 `json:"diffSeconds"`
	// CRIU's own dump statistics (its stats-dump image; zero when it wrote
	// none): how long it kept the tasks frozen, of which collecting the
	// memory pages (memdump) and writing them to the images (memwrite),
	// and the pages it wrote.
	CRIUFrozenSeconds   float64 `json:"criuFrozenSeconds,omitempty"`
	CRIUMemdumpSeconds  float64 `json:"criuMemdumpSeconds,omitempty"`
	CRIUMemwriteSeconds float64 `json:"criuMemwriteSeconds,omitempty"`
	CRIUPagesWritten    uint64  `json:"criuPagesWritten,omitempty"`
}

// ExitedEntry is a container of the pod that had exited when it was captured.
type ExitedEntry struct {
	Name         string `json:"name"`
	ExitCode     int32  `json:"exitCode"`
	RestartCount int    `json:"restartCount"`
	Image        string `json:"image"`
}

// Validate checks a manifest read from disk before anything acts on it: the
// file is not trusted more than the path it came from. Every name is a
// container name as the API allows it (CheckContainerName), so every path
// built from one stays one element under containers/.
func (m *Manifest) Validate() error {
	if m.FormatVersion != Version {
		return fmt.Errorf("checkpoint format version %d, this build restores version %d", m.FormatVersion, Version)
	}
	if len(m.Containers) == 0 {
		return errors.New("checkpoint lists no containers")
	}
	if m.CgroupMode != "" && m.CgroupMode != CgroupV1 && m.CgroupMode != CgroupV2 {
		return fmt.Errorf("cgroup mode %q, want %q or %q", m.CgroupMode, CgroupV1, CgroupV2)
	}
	seen := make(map[string]bool, len(m.Containers))
	for i, c := range m.Containers {
		if err := CheckContainerName(c.Name); err != nil {
			return fmt.Errorf("container %d: %w", i, err)
		}
		if seen[c.Name] {
			return fmt.Errorf("container %q listed twice", c.Name)
		}
		seen[c.Name] = true
		if want := ArchiveName(c.Name); c.Archive != want {
			return fmt.Errorf("container %q: archive %q, want %q", c.Name, c.Archive, want)
		}
		if c.RestartCount < 0 {
			return fmt.Errorf("container %q: negative restart count", c.Name)
		}
	}
	for i, e := range m.Exited {
		if err := CheckContainerName(e.Name); err != nil {
			return fmt.Errorf("exited container %d: %w", i, err)
		}
		if seen[e.Name] {
			return fmt.Errorf("exited container %q is also listed as captured or exited", e.Name)
		}
		seen[e.Name] = true
	}
	return nil
}

// CheckContainerName refuses a container name the Kubernetes API would not
// allow (a DNS-1123 label: at most 63 lower-case letters, digits and '-',
// starting and ending with a letter or digit). Names become archive paths,
// so nothing else (no '/', no dot) may appear in a checkpoint.
func CheckContainerName(name string) error {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return fmt.Errorf("container name %q is not a DNS-1123 label: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

// Container returns the captured container called name.
func (m *Manifest) Container(name string) (ContainerEntry, bool) {
	for _, c := range m.Containers {
		if c.Name == name {
			return c, true
		}
	}
	return ContainerEntry{}, false
}

// ExitedContainer is the entry of a container that had exited when the pod
// was captured, nil if name is not one.
func (m *Manifest) ExitedContainer(name string) *ExitedEntry {
	for i := range m.Exited {
		if m.Exited[i].Name == name {
			return &m.Exited[i]
		}
	}
	return nil
}

// ArchiveName is where a container's archive lives inside the checkpoint,
// relative to it: containers/<name>.tar. The name is a DNS-1123 label
// (CheckContainerName, at checkpoint time and in Validate), so it is one safe
// path element; ArchivePath still confines the result when it is used,
// against symlinks.
func ArchiveName(container string) string {
	return ContainersDir + "/" + container + ".tar"
}

// ParseManifest decodes and validates a manifest.
func ParseManifest(b []byte) (*Manifest, error) {
	m, err := decodeManifest(b)
	if err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	return m, nil
}

func decodeManifest(b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	return &m, nil
}

// ReadManifest reads and validates dir/manifest.json.
func ReadManifest(dir string) (*Manifest, error) {
	m, err := ReadManifestUnvalidated(dir)
	if err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("%s: manifest: %w", dir, err)
	}
	return m, nil
}

// ReadManifestUnvalidated decodes dir/manifest.json without validating it,
// for the namespace check that must come before any detail is reported. It
// does not follow a symlinked manifest.
func ReadManifestUnvalidated(dir string) (*Manifest, error) {
	f, err := os.OpenFile(filepath.Join(dir, ManifestFile), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s has no %s: not a complete pod checkpoint", dir, ManifestFile)
		}
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxManifestBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxManifestBytes {
		return nil, fmt.Errorf("%s/%s is larger than %d bytes", dir, ManifestFile, MaxManifestBytes)
	}
	m, err := decodeManifest(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return m, nil
}

// MaxManifestBytes bounds what is read of a manifest (a real one is a few KiB).
const MaxManifestBytes = 4 << 20
