package ociartifact

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// maxDockerConfigBytes bounds a secret's docker config (the API server
// bounds a secret to 1 MiB).
const maxDockerConfigBytes = 1 << 20

// ParseDockerConfigJSON reads the credentials of a kubernetes.io/dockerconfigjson
// secret (its ".dockerconfigjson"), which the pod's namespace controls: only
// "auths" and, of each entry, the credentials. "credsStore", "credHelpers"
// and everything else are ignored, so a secret never makes the shim run a
// credential helper. Keys are normalised to the registry host (RegistryKey).
func ParseDockerConfigJSON(b []byte) (map[string]authn.AuthConfig, error) {
	if len(b) > maxDockerConfigBytes {
		return nil, fmt.Errorf("docker config of %d bytes, at most %d", len(b), maxDockerConfigBytes)
	}
	var doc struct {
		Auths map[string]struct {
			Username      string `json:"username"`
			Password      string `json:"password"`
			Auth          string `json:"auth"`
			IdentityToken string `json:"identitytoken"`
			RegistryToken string `json:"registrytoken"`
		} `json:"auths"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("docker config: %w", err)
	}
	out := map[string]authn.AuthConfig{}
	for k, a := range doc.Auths {
		host := RegistryKey(k)
		if host == "" {
			continue
		}
		if _, dup := out[host]; dup {
			continue
		}
		out[host] = authn.AuthConfig{Username: a.Username, Password: a.Password, Auth: a.Auth,
			IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken}
	}
	return out, nil
}

// RegistryKey is the registry host a docker config key names: the scheme and
// any path are dropped ("https://index.docker.io/v1/" is "index.docker.io"),
// and Docker Hub's names are one. "" for a key that names no registry.
func RegistryKey(k string) string {
	k = strings.TrimSpace(k)
	if i := strings.Index(k, "://"); i >= 0 {
		k = k[i+3:]
	}
	k, _, _ = strings.Cut(k, "/")
	if k == "" {
		return ""
	}
	r, err := name.NewRegistry(strings.ToLower(k), name.StrictValidation)
	if err != nil {
		return ""
	}
	if h := r.RegistryStr(); h == name.DefaultRegistry || h == "registry-1.docker.io" {
		return name.DefaultRegistry
	}
	return r.RegistryStr()
}

// authsKeychain resolves a registry's credentials from parsed docker configs.
type authsKeychain map[string]authn.AuthConfig

func (k authsKeychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	if a, ok := k[RegistryKey(target.RegistryStr())]; ok {
		return authn.FromConfig(a), nil
	}
	return authn.Anonymous, nil
}
