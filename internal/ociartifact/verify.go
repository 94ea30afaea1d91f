package ociartifact

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// Parsers of what a registry returns. Everything here is hostile input: each
// parser checks shapes, media types, names and size caps before anything is
// fetched or written on the strength of it.

// Limits of a pulled checkpoint.
const (
	maxIndexBytes     = 1 << 20
	maxImageManifest  = 256 << 10
	maxImageConfig    = 256 << 10
	maxContainers     = 64
	maxArchiveEntries = 100000 // a container archive: CRIU images (a core per thread) and five files
)

// pulledIndex is a checked index: the pod artifact and the container images
// in index order.
type pulledIndex struct {
	raw        *v1.IndexManifest
	pod        v1.Descriptor
	containers []pulledContainer
}

type pulledContainer struct {
	name string
	desc v1.Descriptor
}

// parseIndex checks an index is a cri-shim pod checkpoint this build reads.
func parseIndex(raw []byte) (*pulledIndex, error) {
	if len(raw) > maxIndexBytes {
		return nil, fmt.Errorf("index is larger than %d bytes", maxIndexBytes)
	}
	var im v1.IndexManifest
	if err := json.Unmarshal(raw, &im); err != nil {
		return nil, fmt.Errorf("index: %w", err)
	}
	if im.SchemaVersion != 2 || im.MediaType != types.OCIImageIndex {
		return nil, fmt.Errorf("%w: schema %d, media type %q, want an OCI image index", errNotCheckpoint, im.SchemaVersion, im.MediaType)
	}
	if f := im.Annotations[AnnotationFormat]; f != FormatName {
		return nil, fmt.Errorf("%w: annotation %s is %q, want %q", errNotCheckpoint, AnnotationFormat, f, FormatName)
	}
	if v, want := im.Annotations[AnnotationFormatVersion], strconv.Itoa(layout.Version); v != want {
		return nil, fmt.Errorf("checkpoint format version %q, this build reads %s", v, want)
	}
	if n := len(im.Manifests); n < 2 || n > maxContainers+1 {
		return nil, fmt.Errorf("index lists %d manifests, want the pod manifest and 1 to %d containers", n, maxContainers)
	}
	p := &pulledIndex{raw: &im}
	seen := map[string]bool{}
	pods := 0
	for i, d := range im.Manifests {
		if err := checkDescriptor(d, types.OCIManifestSchema1, maxImageManifest); err != nil {
			return nil, fmt.Errorf("index manifest %d: %w", i, err)
		}
		switch role := d.Annotations[AnnotationRole]; role {
		case RolePod:
			if d.ArtifactType != MediaTypePodArtifact {
				return nil, fmt.Errorf("index manifest %d: pod artifact type %q, want %q", i, d.ArtifactType, MediaTypePodArtifact)
			}
			pods++
			p.pod = d
		case RoleContainer:
			n := d.Annotations[AnnotationContainer]
			if err := layout.CheckContainerName(n); err != nil {
				return nil, fmt.Errorf("index manifest %d: %w", i, err)
			}
			if seen[n] {
				return nil, fmt.Errorf("index lists container %q twice", n)
			}
			seen[n] = true
			p.containers = append(p.containers, pulledContainer{name: n, desc: d})
		default:
			return nil, fmt.Errorf("index manifest %d: role %q, want %q or %q", i, role, RolePod, RoleContainer)
		}
	}
	if pods != 1 {
		return nil, fmt.Errorf("index lists %d pod manifests, want 1", pods)
	}
	if len(p.containers) == 0 {
		return nil, fmt.Errorf("index lists no container")
	}
	return p, nil
}

// checkDescriptor checks a descriptor's media type and size and refuses the
// fields that would make a client fetch elsewhere (urls) or trust inline
// bytes (data).
func checkDescriptor(d v1.Descriptor, mt types.MediaType, max int64) error {
	if d.MediaType != mt {
		return fmt.Errorf("media type %q, want %q", d.MediaType, mt)
	}
	if d.Digest.Algorithm != "sha256" || len(d.Digest.Hex) != 64 {
		return fmt.Errorf("digest %q is not sha256", d.Digest)
	}
	if d.Size <= 0 || d.Size > max {
		return fmt.Errorf("size %d out of range 1-%d", d.Size, max)
	}
	if len(d.URLs) > 0 || len(d.Data) > 0 {
		return fmt.Errorf("descriptor %s carries urls or inline data", d.Digest)
	}
	return nil
}

// parsePodArtifact checks the pod manifest and returns the descriptors of
// manifest.json and sandbox.json.
func parsePodArtifact(raw []byte) (manifest, sandbox v1.Descriptor, err error) {
	m, err := parseManifest(raw)
	if err != nil {
		return manifest, sandbox, fmt.Errorf("pod manifest: %w", err)
	}
	if m.ArtifactType != MediaTypePodArtifact {
		return manifest, sandbox, fmt.Errorf("pod manifest: artifact type %q, want %q", m.ArtifactType, MediaTypePodArtifact)
	}
	if err := checkDescriptor(m.Config, MediaTypeEmpty, int64(len(emptyJSON))); err != nil {
		return manifest, sandbox, fmt.Errorf("pod manifest config: %w", err)
	}
	if len(m.Layers) != 2 {
		return manifest, sandbox, fmt.Errorf("pod manifest has %d blobs, want 2", len(m.Layers))
	}
	if err := checkDescriptor(m.Layers[0], MediaTypePodManifest, layout.MaxManifestBytes); err != nil {
		return manifest, sandbox, fmt.Errorf("pod manifest, %s: %w", layout.ManifestFile, err)
	}
	if err := checkDescriptor(m.Layers[1], MediaTypeSandbox, maxSandboxBytes); err != nil {
		return manifest, sandbox, fmt.Errorf("pod manifest, %s: %w", layout.SandboxFile, err)
	}
	return m.Layers[0], m.Layers[1], nil
}

// parseContainerManifest checks one container's image manifest and returns
// its config and archive descriptors.
func parseContainerManifest(raw []byte, name string) (config, archive v1.Descriptor, err error) {
	m, err := parseManifest(raw)
	if err != nil {
		return config, archive, fmt.Errorf("container %s: %w", name, err)
	}
	if got := m.Annotations[AnnotationCRIUContainerName]; got != name {
		return config, archive, fmt.Errorf("container %s: image annotation %s is %q", name, AnnotationCRIUContainerName, got)
	}
	if err := checkDescriptor(m.Config, types.OCIConfigJSON, maxImageConfig); err != nil {
		return config, archive, fmt.Errorf("container %s: config: %w", name, err)
	}
	if len(m.Layers) != 1 {
		return config, archive, fmt.Errorf("container %s: image has %d layers, want 1 (the checkpoint archive)", name, len(m.Layers))
	}
	if err := checkDescriptor(m.Layers[0], MediaTypeLayerTar, 1<<62); err != nil {
		return config, archive, fmt.Errorf("container %s: archive: %w", name, err)
	}
	return m.Config, m.Layers[0], nil
}

// checkImageConfig checks a container image's config names its archive as
// its only layer.
func checkImageConfig(raw []byte, name string, archive v1.Hash) error {
	var c v1.ConfigFile
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("container %s: config: %w", name, err)
	}
	if c.OS != "linux" {
		return fmt.Errorf("container %s: config os %q, want linux", name, c.OS)
	}
	if !slices.Equal(c.RootFS.DiffIDs, []v1.Hash{archive}) {
		return fmt.Errorf("container %s: config diff_ids %v, want [%s]", name, c.RootFS.DiffIDs, archive)
	}
	return nil
}

func parseManifest(raw []byte) (*v1.Manifest, error) {
	if len(raw) > maxImageManifest {
		return nil, fmt.Errorf("manifest is larger than %d bytes", maxImageManifest)
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	if m.SchemaVersion != 2 || m.MediaType != types.OCIManifestSchema1 {
		return nil, fmt.Errorf("schema %d, media type %q, want an OCI image manifest", m.SchemaVersion, m.MediaType)
	}
	return m, nil
}

// checkAgrees checks that the index and the pod's manifest.json describe the
// same pod and the same containers, in the same order.
func checkAgrees(p *pulledIndex, m *layout.Manifest) error {
	var fromIndex, fromManifest []string
	for _, c := range p.containers {
		fromIndex = append(fromIndex, c.name)
	}
	for _, c := range m.Containers {
		fromManifest = append(fromManifest, c.Name)
	}
	if !slices.Equal(fromIndex, fromManifest) {
		return fmt.Errorf("index lists containers [%s], %s [%s]", strings.Join(fromIndex, ","), layout.ManifestFile, strings.Join(fromManifest, ","))
	}
	a := p.raw.Annotations
	for _, x := range []struct{ key, want string }{
		{AnnotationPodName, m.Pod.Name}, {AnnotationPodNamespace, m.Pod.Namespace}, {AnnotationPodUID, m.Pod.UID},
		{AnnotationContainers, strings.Join(fromManifest, ",")},
	} {
		if a[x.key] != x.want {
			return fmt.Errorf("index annotation %s is %q, %s says %q", x.key, a[x.key], layout.ManifestFile, x.want)
		}
	}
	return nil
}
