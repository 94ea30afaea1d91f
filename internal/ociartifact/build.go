package ociartifact

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// Built is a pod checkpoint laid out as an image index, ready to push.
type Built struct {
	Index    v1.ImageIndex
	Manifest *layout.Manifest
	// Bytes is the size of every blob the index references.
	Bytes int64
}

// Build lays out the complete pod checkpoint in dir as an image index. The
// archives are hashed (streamed; hashed reports each chunk read) but not
// copied. The container images are for platform linux/<GOARCH of this node>.
func Build(dir string, hashed func(n int64)) (*Built, error) {
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(filepath.Join(dir, layout.IncompleteFile)); err == nil {
		return nil, fmt.Errorf("%s is an incomplete checkpoint", dir)
	}
	rawManifest, err := readSmall(filepath.Join(dir, layout.ManifestFile), layout.MaxManifestBytes)
	if err != nil {
		return nil, err
	}
	m, err := layout.ParseManifest(rawManifest)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	rawSandbox, err := readSmall(filepath.Join(dir, layout.SandboxFile), maxSandboxBytes)
	if err != nil {
		return nil, err
	}
	b := &Built{Manifest: m}
	images := map[v1.Hash]v1.Image{}
	var descs []v1.Descriptor

	pod, err := podArtifact(rawManifest, rawSandbox)
	if err != nil {
		return nil, err
	}
	d, err := describe(pod, map[string]string{AnnotationRole: RolePod})
	if err != nil {
		return nil, err
	}
	d.ArtifactType = MediaTypePodArtifact
	descs = append(descs, d)
	images[d.Digest] = pod
	b.Bytes += int64(len(rawManifest) + len(rawSandbox) + len(emptyJSON))

	for _, e := range m.Containers {
		path, err := layout.ArchivePath(dir, e)
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", e.Name, err)
		}
		l, err := newFileLayer(path, MediaTypeLayerTar, hashed)
		if err != nil {
			return nil, err
		}
		img, err := containerImage(m, e, l)
		if err != nil {
			return nil, err
		}
		d, err := describe(img, map[string]string{AnnotationRole: RoleContainer, AnnotationContainer: e.Name})
		if err != nil {
			return nil, err
		}
		d.Platform = &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
		descs = append(descs, d)
		images[d.Digest] = img
		cfg, _ := img.RawConfigFile()
		b.Bytes += l.size + int64(len(cfg))
	}

	names := make([]string, len(m.Containers))
	for i, e := range m.Containers {
		names[i] = e.Name
	}
	raw, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests:     descs,
		Annotations: map[string]string{
			AnnotationFormat:         FormatName,
			AnnotationFormatVersion:  strconv.Itoa(m.FormatVersion),
			AnnotationPodName:        m.Pod.Name,
			AnnotationPodNamespace:   m.Pod.Namespace,
			AnnotationPodUID:         m.Pod.UID,
			AnnotationCheckpointedAt: m.CheckpointedAt.UTC().Format(time.RFC3339Nano),
			AnnotationContainers:     strings.Join(names, ","),
		},
	})
	if err != nil {
		return nil, err
	}
	b.Index = &rawIndex{manifest: raw, images: images}
	return b, nil
}

// maxSandboxBytes bounds sandbox.json (a real one is a few KiB).
const maxSandboxBytes = 4 << 20

var emptyJSON = []byte("{}")

// podArtifact is the manifest holding manifest.json and sandbox.json as they
// are on disk (image-spec's artifact guidance: empty config, artifactType).
func podArtifact(rawManifest, rawSandbox []byte) (v1.Image, error) {
	mf := static.NewLayer(rawManifest, MediaTypePodManifest)
	sb := static.NewLayer(rawSandbox, MediaTypeSandbox)
	var layers []v1.Descriptor
	lm := map[v1.Hash]partial.CompressedLayer{}
	for _, x := range []struct {
		l     v1.Layer
		title string
	}{{mf, layout.ManifestFile}, {sb, layout.SandboxFile}} {
		d, err := partial.Descriptor(x.l)
		if err != nil {
			return nil, err
		}
		d.Annotations = map[string]string{AnnotationTitle: x.title}
		layers = append(layers, *d)
		lm[d.Digest] = x.l
	}
	cfg, err := partial.Descriptor(static.NewLayer(emptyJSON, MediaTypeEmpty))
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(v1.Manifest{
		SchemaVersion: 2, MediaType: types.OCIManifestSchema1, ArtifactType: MediaTypePodArtifact,
		Config: *cfg, Layers: layers,
	})
	if err != nil {
		return nil, err
	}
	return partial.CompressedToImage(&rawImage{manifest: raw, config: emptyJSON, layers: lm})
}

// containerImage is one container's checkpoint image: its archive as the
// only layer, an image config for the node's platform (containerd's CRI
// restore unpacks the image for the sandbox's platform) and checkpointctl's
// annotations on the manifest.
func containerImage(m *layout.Manifest, e layout.ContainerEntry, l *fileLayer) (v1.Image, error) {
	cfg, err := json.Marshal(v1.ConfigFile{
		Architecture: runtime.GOARCH, OS: "linux",
		Created: v1.Time{Time: m.CheckpointedAt.UTC()},
		RootFS:  v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{l.digest}},
	})
	if err != nil {
		return nil, err
	}
	cfgDesc, err := partial.Descriptor(static.NewLayer(cfg, types.OCIConfigJSON))
	if err != nil {
		return nil, err
	}
	ann := map[string]string{
		AnnotationCRIOCheckpointName:       e.Name,
		AnnotationCRIUContainerName:        e.Name,
		AnnotationCRIUEngine:               "containerd",
		AnnotationCRIUEngineVersion:        m.Runtime,
		AnnotationCRIURootfsImageName:      e.Image,
		AnnotationCRIURootfsImageRequested: e.Image,
		AnnotationCRIURootfsImageID:        e.ImageRef,
		AnnotationCRIUCriuVersion:          m.CRIUVersion,
		AnnotationCRIUHostArch:             runtime.GOARCH,
		AnnotationCRIUHostKernel:           m.Kernel,
	}
	for k, v := range ann {
		if v == "" {
			delete(ann, k)
		}
	}
	raw, err := json.Marshal(v1.Manifest{
		SchemaVersion: 2, MediaType: types.OCIManifestSchema1,
		Config:      *cfgDesc,
		Layers:      []v1.Descriptor{{MediaType: MediaTypeLayerTar, Size: l.size, Digest: l.digest, Annotations: map[string]string{AnnotationTitle: layout.ArchiveName(e.Name)}}},
		Annotations: ann,
	})
	if err != nil {
		return nil, err
	}
	return partial.CompressedToImage(&rawImage{manifest: raw, config: cfg, layers: map[v1.Hash]partial.CompressedLayer{l.digest: l}})
}

// describe is img's descriptor in the index.
func describe(img v1.Image, ann map[string]string) (v1.Descriptor, error) {
	d, err := partial.Descriptor(img)
	if err != nil {
		return v1.Descriptor{}, err
	}
	d.Annotations = ann
	return *d, nil
}

// readSmall reads a file of at most max bytes, not following a symlink.
func readSmall(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, max)
	}
	return b, nil
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

var errNotCheckpoint = errors.New("not a cri-shim pod checkpoint")
