package layout

import "strings"

// RootfsImageRef is what an archive's config.dump names as the container's
// base image: the image ID (sha256:<64 hex>, the image config's digest) when
// it is known, else the runtime's image reference. containerd's restore looks
// the base image up by this name and pulls it when the node lacks it
// (containerd v2.2 internal/cri/server/container_checkpoint_linux.go,
// CRImportCheckpoint: GetImage, then Pull of RootfsImageRef). The runtime's
// image reference is a repository digest as soon as the image was ever
// pulled from a registry (host/repo@sha256:<manifest>), and another node
// holding the same image under another name (imported, another mirror) would
// not find it and pull from the source node's registry; the ID is the same
// on every node that has the image, and names no host.
func RootfsImageRef(imageID, imageRef string) string {
	if IsImageID(imageID) {
		return imageID
	}
	return imageRef
}

// IsImageID reports whether s is an image ID: sha256:<64 lowercase hex>.
func IsImageID(s string) bool {
	hex, ok := strings.CutPrefix(s, "sha256:")
	return ok && len(hex) == 64 && strings.Trim(hex, "0123456789abcdef") == ""
}
