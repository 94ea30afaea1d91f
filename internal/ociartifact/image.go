package ociartifact

import (
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// rawImage is an image whose manifest and config bytes are built here, so
// that the same checkpoint always gives the same digests (a second push of
// it finds everything in the registry).
type rawImage struct {
	manifest []byte
	config   []byte
	layers   map[v1.Hash]partial.CompressedLayer
}

func (i *rawImage) RawManifest() ([]byte, error)        { return i.manifest, nil }
func (i *rawImage) RawConfigFile() ([]byte, error)      { return i.config, nil }
func (i *rawImage) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

func (i *rawImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	if l, ok := i.layers[h]; ok {
		return l, nil
	}
	return nil, fmt.Errorf("no layer %s in this image", h)
}

// rawIndex is an image index whose manifest bytes are built here.
type rawIndex struct {
	manifest []byte
	images   map[v1.Hash]v1.Image
}

func (x *rawIndex) MediaType() (types.MediaType, error) { return types.OCIImageIndex, nil }
func (x *rawIndex) Digest() (v1.Hash, error)            { return partial.Digest(x) }
func (x *rawIndex) Size() (int64, error)                { return partial.Size(x) }
func (x *rawIndex) RawManifest() ([]byte, error)        { return x.manifest, nil }

func (x *rawIndex) IndexManifest() (*v1.IndexManifest, error) {
	return v1.ParseIndexManifest(bytesReader(x.manifest))
}

func (x *rawIndex) Image(h v1.Hash) (v1.Image, error) {
	if img, ok := x.images[h]; ok {
		return img, nil
	}
	return nil, fmt.Errorf("no image %s in this index", h)
}

func (x *rawIndex) ImageIndex(h v1.Hash) (v1.ImageIndex, error) {
	return nil, fmt.Errorf("no index %s in this index", h)
}
