package podcheckpoint

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/statefile"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// TemplateFile is the source pod's sanitised template (Template) in an
// object's data directory, beside internal/capture's manifest.json. It is kept
// on the node that took the checkpoint and nowhere else: the status carries
// only its spec's digest (status.podSpecDigest), since every node may read
// every PodCheckpoint and the template holds the pod's whole spec, env
// values included. It is data a restore compares a pod with, never used to
// create anything, and not part of an export (internal/ociartifact pushes
// manifest.json, sandbox.json and the archives only).
const TemplateFile = "pod-template.json"

// maxTemplateBytes bounds the read of a TemplateFile: a pod is at most the
// API server's request limit (3 MiB by default) and etcd's value limit
// (1.5 MiB by default); more is not a template this node wrote.
const maxTemplateBytes = 4 << 20

// writeTemplate records t in dir, the data directory capture made afresh
// (mode 0600, created exclusively, fsynced with its directory entry), and
// returns its spec's digest. A crash before the Ready status leaves the
// object in progress, and the next shim removes the directory
// (reconciler.go), so no torn file is ever read. Not internal/statefile:
// a full checkpoint volume fails this checkpoint, not the shim's health.
func writeTemplate(dir string, t *corev1.PodTemplateSpec) (string, error) {
	digest, err := SpecDigest(t)
	if err != nil {
		return "", fmt.Errorf("the pod's template: %w", err)
	}
	b, err := json.Marshal(t)
	if err != nil {
		return "", fmt.Errorf("the pod's template: %w", err)
	}
	path := filepath.Join(dir, TemplateFile)
	err = layout.CreateFileSync(path, b)
	if err == nil {
		err = statefile.SyncDir(dir)
	}
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return digest, nil
}

// template reads the TemplateFile of pc's data directory under the node's
// checkpoint root.
func (r *Reconciler) template(pc *cpv1.PodCheckpoint) (*corev1.PodTemplateSpec, error) {
	return readTemplate(filepath.Join(r.cfg.Root, DataDir(pc)))
}

// readTemplate reads dir's TemplateFile: a regular file (no symlink
// followed), at most maxTemplateBytes.
func readTemplate(dir string) (*corev1.PodTemplateSpec, error) {
	f, err := os.OpenFile(filepath.Join(dir, TemplateFile), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return nil, err
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s/%s is not a regular file", dir, TemplateFile)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxTemplateBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxTemplateBytes {
		return nil, fmt.Errorf("%s/%s is larger than %d bytes", dir, TemplateFile, maxTemplateBytes)
	}
	t := &corev1.PodTemplateSpec{}
	if err := json.Unmarshal(b, t); err != nil {
		return nil, fmt.Errorf("%s/%s: %w", dir, TemplateFile, err)
	}
	return t, nil
}
