package ociartifact

import (
	"fmt"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/name"

	"github.com/cri-shim/cri-shim/internal/config"
)

// Allowed is one entry of the operator's allow-list ([checkpoint]
// registries): a registry, or a repository prefix of one, and the namespaces
// that may use it. A restore from an image reference, which a pod names, and
// an export, which an object names, make the node connect only there.
type Allowed = config.RegistryConfig

// maxRefLen bounds a reference a pod names (a registry host, a repository of
// up to 255 characters, a digest).
const maxRefLen = 512

// ParseRestoreRef parses a restore's image reference, which a pod controls:
// it must spell out its registry host, name the image index by sha256
// digest (a tag may move; the digest is what is verified and what names
// the pulled directory), and its repository must be one allow lets
// namespace ns use. The error is of errdefs' InvalidArgument (malformed) or
// PermissionDenied (not allowed).
func ParseRestoreRef(s, ns string, allow []Allowed) (name.Digest, Allowed, error) {
	if len(s) > maxRefLen {
		return name.Digest{}, Allowed{}, fmt.Errorf("%w: image reference of %d characters, at most %d", errdefs.ErrInvalidArgument, len(s), maxRefLen)
	}
	host, _, ok := strings.Cut(s, "/")
	if !ok || !(strings.ContainsAny(host, ".:") || host == "localhost") {
		return name.Digest{}, Allowed{}, fmt.Errorf("%w: image reference %q must begin with its registry host (host[:port]/repository@sha256:<digest>)", errdefs.ErrInvalidArgument, s)
	}
	d, err := name.NewDigest(s, name.StrictValidation)
	if err != nil {
		return name.Digest{}, Allowed{}, fmt.Errorf("%w: image reference %q must name the image by digest (host[:port]/repository@sha256:<64 hex digits>): %v", errdefs.ErrInvalidArgument, s, err)
	}
	hex, ok := strings.CutPrefix(d.DigestStr(), "sha256:")
	if !ok || len(hex) != 64 || strings.Trim(hex, "0123456789abcdef") != "" {
		return name.Digest{}, Allowed{}, fmt.Errorf("%w: image reference %q: the digest must be sha256:<64 lowercase hex digits>", errdefs.ErrInvalidArgument, s)
	}
	if err := checkRepository(s, d.Context()); err != nil {
		return name.Digest{}, Allowed{}, err
	}
	a, err := allowed(s, host, d.Context(), ns, allow)
	return d, a, err
}

// checkRepository refuses repository components outside the distribution
// spec's form (no "..", no empty component).
func checkRepository(s string, repo name.Repository) error {
	for _, c := range strings.Split(repo.RepositoryStr(), "/") {
		if !config.RepositoryComponent(c) {
			return fmt.Errorf("%w: image reference %q: repository component %q is not of the distribution spec's form [a-z0-9]+((.|_|__|-+)[a-z0-9]+)*", errdefs.ErrInvalidArgument, s, c)
		}
	}
	return nil
}

// allowed is the allow-list's entry for repository repo, which s spells
// with host, for namespace ns: of the entries of its registry that cover the
// repository and allow ns, the one of the longest prefix.
func allowed(s, host string, repo name.Repository, ns string, allow []Allowed) (Allowed, error) {
	reg := repo.RegistryStr()
	if !strings.EqualFold(reg, host) {
		return Allowed{}, fmt.Errorf("%w: image reference %q: registry %q is spelt %q (use the registry's own name)", errdefs.ErrInvalidArgument, s, reg, host)
	}
	var best Allowed
	found, listed := false, false
	for _, a := range allow {
		if !strings.EqualFold(a.Registry(), reg) {
			continue
		}
		listed = true
		if a.Covers(repo.RepositoryStr()) && a.Allows(ns) && (!found || len(a.Prefix()) > len(best.Prefix())) {
			best, found = a, true
		}
	}
	switch {
	case found:
		return best, nil
	case len(allow) == 0:
		return Allowed{}, fmt.Errorf("%w: image reference %q: this node restores from and exports to no registry (its [checkpoint] registries allow-list is empty)", errdefs.ErrPermissionDenied, s)
	case listed:
		return Allowed{}, fmt.Errorf("%w: image reference %q: repository %s is not in this node's [checkpoint] registries allow-list for namespace %s", errdefs.ErrPermissionDenied, s, repo, ns)
	}
	return Allowed{}, fmt.Errorf("%w: image reference %q: registry %q is not in this node's [checkpoint] registries allow-list", errdefs.ErrPermissionDenied, s, reg)
}
