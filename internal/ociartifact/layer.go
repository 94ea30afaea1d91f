package ociartifact

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// fileLayer is a layer read from a file each time it is uploaded: never held
// in memory. Its blob is the file as it is (uncompressed), so its digest is
// also its diff ID. The digest is computed once, by streaming the file; a
// file changed after that fails the registry's digest check at upload.
type fileLayer struct {
	path   string
	digest v1.Hash
	size   int64
	mt     types.MediaType
}

// newFileLayer hashes path. read, if not nil, is told of each chunk read.
func newFileLayer(path string, mt types.MediaType, read func(n int64)) (*fileLayer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, &countingReader{r: f, add: read}, make([]byte, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("hashing %s: %w", path, err)
	}
	return &fileLayer{path: path, size: n, mt: mt,
		digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}}, nil
}

func (l *fileLayer) Digest() (v1.Hash, error)             { return l.digest, nil }
func (l *fileLayer) DiffID() (v1.Hash, error)             { return l.digest, nil }
func (l *fileLayer) Size() (int64, error)                 { return l.size, nil }
func (l *fileLayer) MediaType() (types.MediaType, error)  { return l.mt, nil }
func (l *fileLayer) Uncompressed() (io.ReadCloser, error) { return l.Compressed() }

// Compressed opens the file; at most the hashed size is read from it.
func (l *fileLayer) Compressed() (io.ReadCloser, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, l.size), f}, nil
}

// countingReader tells add of every chunk read through it.
type countingReader struct {
	r   io.Reader
	add func(int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 && c.add != nil {
		c.add(int64(n))
	}
	return n, err
}
