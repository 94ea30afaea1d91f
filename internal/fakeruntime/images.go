package fakeruntime

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/distribution/reference"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// NodeImages are the images a test node's containerd holds without a pull
// (test/stack/install.sh builds them, test/stack/up.sh imports them): a new
// Runtime holds them too, unless WithImages names others.
var NodeImages = []string{"localhost/cri-shim/pause:1", "docker.io/library/busybox:cri-shim"}

// WithImages makes the runtime hold these images from the start instead of
// NodeImages (none: an empty image store).
func WithImages(names ...string) Option {
	return func(o *options) { o.images = append([]string{}, names...) }
}

// errAmbiguous is go-digest's digestset.ErrDigestAmbiguous, which
// containerd's image store returns as is (not an errdefs error: Unknown).
var errAmbiguous = errors.New("ambiguous digest string")

// normalize is the reference containerd files an image under
// (pkg/reference/docker.ParseDockerRef): "busybox" is
// "docker.io/library/busybox:latest".
func normalize(name string) (string, bool) {
	n, err := reference.ParseDockerRef(name)
	if err != nil {
		return "", false
	}
	return n.String(), true
}

// imageID is a stable image ID for a name, as containerd's is the digest of
// the image's config.
func imageID(name string) string {
	if n, ok := normalize(name); ok {
		name = n
	}
	sum := sha256.Sum256([]byte(name))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// addImageLocked records the image name as present (a pull or an import).
func (r *Runtime) addImageLocked(name string) *runtimeapi.Image {
	id := imageID(name)
	img := r.images[id]
	if img == nil {
		img = &runtimeapi.Image{Id: id, Size: 1 << 20}
		r.images[id] = img
	}
	tag := name
	if n, ok := normalize(name); ok {
		tag = n
	}
	if !slices.Contains(img.RepoTags, tag) {
		img.RepoTags = append(img.RepoTags, tag)
	}
	img.Spec = &runtimeapi.ImageSpec{Image: img.RepoTags[0]}
	return img
}

// resolveLocked finds an image as containerd 2.4.2's CRI does before it
// creates a container or answers ImageStatus
// (internal/cri/server/images/service.go, LocalResolve): a reference by its
// normalized name, anything else as an image ID or a unique prefix of one's
// hex digits (internal/cri/store/image/image.go: go-digest's digestset).
// An unknown image is errNotFound; a prefix of several (the empty one too)
// errAmbiguous.
func (r *Runtime) resolveLocked(ref string) (*runtimeapi.Image, error) {
	if n, ok := normalize(ref); ok {
		for _, img := range r.images {
			if slices.Contains(img.RepoTags, n) {
				return img, nil
			}
		}
	}
	if img := r.images[ref]; img != nil {
		return img, nil
	}
	var found *runtimeapi.Image
	prefix := strings.TrimPrefix(ref, "sha256:")
	for id, img := range r.images {
		if strings.HasPrefix(strings.TrimPrefix(id, "sha256:"), prefix) {
			if found != nil {
				return nil, errAmbiguous
			}
			found = img
		}
	}
	if found == nil {
		return nil, errNotFound
	}
	return found, nil
}

var errNotFound = errors.New("not found")

// imageError is CreateContainer's answer for an image it cannot resolve
// (container_create.go: "failed to resolve image %q: %w"), with the code
// containerd's errgrpc gives the cause: NotFound, or Unknown.
func imageError(ref string, err error) error {
	code := codes.Unknown
	if errors.Is(err, errNotFound) {
		code = codes.NotFound
	}
	return status.Error(code, fmt.Sprintf("failed to resolve image %q: %v", ref, err))
}
