package ociartifact

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/cri-shim/cri-shim/internal/layout"
)

// Pushed is what Push wrote.
type Pushed struct {
	// Ref is the pushed index by digest: repository@sha256:...
	Ref      string
	Digest   v1.Hash
	Bytes    int64
	Manifest *layout.Manifest
}

// Push lays out the pod checkpoint in dir (Build) and pushes it to ref.
// Blobs and manifests the registry already holds are not uploaded again.
func Push(ctx context.Context, dir, ref string, reg Registry, hashed func(n int64)) (*Pushed, error) {
	r, opts, err := reg.connect(ctx, ref)
	if err != nil {
		return nil, err
	}
	b, err := Build(dir, hashed)
	if err != nil {
		return nil, err
	}
	if err := remote.WriteIndex(r, b.Index, opts...); err != nil {
		return nil, fmt.Errorf("push %s: %w", r, err)
	}
	d, err := b.Index.Digest()
	if err != nil {
		return nil, err
	}
	return &Pushed{Ref: digestRef(r.Context(), d), Digest: d, Bytes: b.Bytes, Manifest: b.Manifest}, nil
}

func digestRef(repo name.Repository, d v1.Hash) string { return repo.Digest(d.String()).String() }
