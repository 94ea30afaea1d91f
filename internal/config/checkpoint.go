package config

// The [checkpoint] section: where checkpoints may live, how many are kept,
// who may restore them, and the registries restores may pull from.

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"k8s.io/apimachinery/pkg/util/validation"
)

// CheckpointConfig confines and retains pod checkpoints.
type CheckpointConfig struct {
	Root                 string `toml:"root" comment:"Every checkpoint path must resolve inside this directory; created if missing."`
	MaxPerPod            int    `toml:"max_per_pod" comment:"Checkpoints kept per pod (those made by 'cri-shim checkpoint'), oldest removed first; 0 keeps all."`
	MaxTotalBytes        int64  `toml:"max_total_bytes" comment:"Total bytes of checkpoints on the node (pulled ones apart): scheduled ones are removed oldest first from the namespace furthest over its share, a PodCheckpoint beyond it fails; 0 means no bound."`
	MaxBytesPerNamespace int64  `toml:"max_bytes_per_namespace" comment:"Each namespace's share of the checkpoint root (its scheduled checkpoints, PodCheckpoint data and named checkpoints): scheduled ones beyond it are removed oldest first, a PodCheckpoint beyond it fails; 0 means no bound."`
	// MinInterval is the shortest checkpoint schedule a pod's
	// checkpoint.cri-shim.io/interval annotation gets (a pod asking more
	// often is checkpointed at this interval): each checkpoint freezes the pod
	// and writes its memory to disk.
	MinInterval Duration `toml:"min_interval" comment:"Shortest schedule of a pod's checkpoint.cri-shim.io/interval annotation (10s to 24h); shorter requests get this."`
	// StreamArchives copies CRIU's memory pages into each container's
	// archive while CRIU writes them, so the capture and the archive's
	// disk write overlap: a shorter call, a longer freeze
	// (docs/checkpoint.md, "Writing the archives"); false
	// (default) copies them once the pod runs again.
	StreamArchives bool `toml:"stream_archives" comment:"Copy memory pages into the checkpoint archives while CRIU writes them: the whole call is shorter, the pod's freeze longer; false (default): copy them once the pod runs again."`
	// RestoreNamespaceAllow widens the namespace binding of restores: by
	// default a pod may warm-start (or be restored by RestorePod) only from a
	// checkpoint of a pod in its own namespace, because a checkpoint holds
	// that pod's memory (docs/checkpoint.md). Each pair lets pods of To
	// restore checkpoints taken in From; one direction only.
	RestoreNamespaceAllow []NamespacePair `toml:"restore_namespace_allow,omitempty" comment:"Pairs {from, to}: pods of namespace 'to' may restore checkpoints of pods of namespace 'from' (default none: same namespace only)." example:"[{ from = 'staging', to = 'ci' }]"`
	// Registries are the registries a restore from an image reference may
	// pull from (docs/checkpoint-oci.md); a pod names the reference, so the
	// node connects only to these.
	Registries []RegistryConfig `toml:"registries,omitempty" comment:"Registries restores from image references may pull from (default none: image references are refused); plain_http only for a loopback host, ca_file: a PEM bundle trusted besides the system roots." example:"[{ host = 'registry.example.com', ca_file = '/etc/cri-shim/registry-ca.pem' }, { host = '127.0.0.1:5000', plain_http = true }]"`
	// RestoreProvenance decides which checkpoints a restore from an image
	// reference may pull: "cluster" (default) only those a node of this
	// cluster exported, recorded in a PodCheckpoint's status in the pod's
	// namespace (or one it may restore from), which needs [kubernetes];
	// "any": whatever the allowed registries serve (docs/security.md).
	RestoreProvenance string `toml:"restore_provenance" comment:"Which checkpoints a restore from an image reference pulls: cluster (default: only those a node of this cluster exported, as a PodCheckpoint's status.export.digest in the pod's namespace or one it may restore from; needs [kubernetes]) or any (whatever the allowed registries serve)."`
	// RegistryAuthFile is the node's docker config.json, used after a pod's
	// image pull secrets; empty: the default keychain ($DOCKER_CONFIG or
	// ~/.docker/config.json of the shim's user).
	RegistryAuthFile  string `toml:"registry_auth_file" comment:"The node's docker config.json for registry credentials after the pod's image pull secrets (e.g. /var/lib/kubelet/config.json); empty: ~/.docker/config.json."`
	PullMaxBytes      int64  `toml:"pull_max_bytes" comment:"Largest checkpoint (archive bytes) a restore from an image reference pulls."`
	PullMaxTotalBytes int64  `toml:"pull_max_total_bytes" comment:"Total bytes of checkpoints pulled for restores on this node, pulls in progress included; unused ones are removed oldest first to make room, then a pull is refused (ResourceExhausted, retried). 0: no bound; else at least pull_max_bytes."`
	// PullTimeout bounds one such pull (it runs in the background), and one
	// PodCheckpoint export's push.
	PullTimeout Duration `toml:"pull_timeout" comment:"How long one pull for a restore may take (it runs in the background)."`
	PullWait    Duration `toml:"pull_wait" comment:"How long RunPodSandbox waits for its pull before answering Unavailable (the kubelet retries; at most 3m, under the kubelet's 4m sandbox timeout)."`
	// ObjectWait is how long the kubelet's RunPodSandbox of a pod whose
	// restore-from names a PodCheckpoint the node does not watch (one held
	// by another node) waits for the object's read from the API server
	// before it is answered Unavailable and retried; the read goes on.
	ObjectWait Duration `toml:"object_wait" comment:"How long RunPodSandbox waits for the API server's answer about a PodCheckpoint held by another node before answering Unavailable (the read goes on, the kubelet retries; 0 to 15s)."`
}

// RegistryConfig is one entry of checkpoint.registries.
type RegistryConfig struct {
	// Host is the registry as image references spell it: host or host:port.
	Host string `toml:"host"`
	// PlainHTTP allows plain HTTP; only for a loopback host.
	PlainHTTP bool `toml:"plain_http,omitempty"`
	// CAFile is a PEM bundle trusted for this registry besides the system roots.
	CAFile string `toml:"ca_file,omitempty"`
}

// NamespacePair is one entry of checkpoint.restore_namespace_allow.
type NamespacePair struct {
	// From is the namespace of the checkpointed pod.
	From string `toml:"from"`
	// To is the namespace of the pod that may start from it.
	To string `toml:"to"`
}

// Restore provenance values.
const (
	ProvenanceCluster = "cluster"
	ProvenanceAny     = "any"
)

// SourceNamespaces are the namespaces pods of to may restore checkpoints of:
// its own, then those restore_namespace_allow names.
func (c CheckpointConfig) SourceNamespaces(to string) []string {
	out := []string{to}
	for _, p := range c.RestoreNamespaceAllow {
		if p.To == to && p.From != to {
			out = append(out, p.From)
		}
	}
	return out
}

// RestoreAllowed reports whether restore_namespace_allow lets pods of
// namespace to restore checkpoints of pods of namespace from (the same
// namespace is always allowed by the restore itself, not by this list).
func (c CheckpointConfig) RestoreAllowed(from, to string) bool {
	for _, p := range c.RestoreNamespaceAllow {
		if p.From == from && p.To == to {
			return true
		}
	}
	return false
}

// validate refuses checkpoint values the shim cannot run with, naming the field.
func (c CheckpointConfig) validate(bad func(field, format string, a ...any)) {
	if !filepath.IsAbs(c.Root) || filepath.Clean(c.Root) == "/" {
		bad("checkpoint.root", "must be an absolute directory other than /, got %q", c.Root)
	}
	if c.MaxPerPod < 0 {
		bad("checkpoint.max_per_pod", "must be 0 (keep all) or more, got %d", c.MaxPerPod)
	}
	if c.MaxTotalBytes < 0 {
		bad("checkpoint.max_total_bytes", "must be 0 (no bound) or more, got %d", c.MaxTotalBytes)
	}
	if c.MaxBytesPerNamespace < 0 {
		bad("checkpoint.max_bytes_per_namespace", "must be 0 (no bound) or more, got %d", c.MaxBytesPerNamespace)
	}
	if d := c.MinInterval.Duration; d < 10*time.Second || d > 24*time.Hour {
		bad("checkpoint.min_interval", "must be from 10s to 24h, got %s", d)
	}
	seen := map[NamespacePair]bool{}
	for i, p := range c.RestoreNamespaceAllow {
		field := fmt.Sprintf("checkpoint.restore_namespace_allow[%d]", i)
		for _, v := range []struct{ key, ns string }{{"from", p.From}, {"to", p.To}} {
			if errs := validation.IsDNS1123Label(v.ns); len(errs) > 0 {
				bad(field+"."+v.key, "must be a namespace name (a DNS-1123 label), got %q: %s", v.ns, strings.Join(errs, "; "))
			}
		}
		switch {
		case p.From == p.To:
			bad(field, "from and to are both %q: a pod may always restore from its own namespace; remove the entry", p.From)
		case seen[p]:
			bad(field, "{from = %q, to = %q} is listed twice", p.From, p.To)
		}
		seen[p] = true
	}
	hosts := map[string]bool{}
	for i, r := range c.Registries {
		field := fmt.Sprintf("checkpoint.registries[%d]", i)
		if err := checkRegistry(r); err != nil {
			bad(field, "%v", err)
		}
		if r.CAFile != "" && !filepath.IsAbs(r.CAFile) {
			bad(field+".ca_file", "must be an absolute path, got %q", r.CAFile)
		}
		if hosts[strings.ToLower(r.Host)] {
			bad(field, "host %q is listed twice", r.Host)
		}
		hosts[strings.ToLower(r.Host)] = true
	}
	if f := c.RegistryAuthFile; f != "" && !filepath.IsAbs(f) {
		bad("checkpoint.registry_auth_file", "must be an absolute path or empty, got %q", f)
	}
	if c.RestoreProvenance != ProvenanceCluster && c.RestoreProvenance != ProvenanceAny {
		bad("checkpoint.restore_provenance", "must be %q or %q, got %q", ProvenanceCluster, ProvenanceAny, c.RestoreProvenance)
	}
	if c.PullMaxBytes <= 0 {
		bad("checkpoint.pull_max_bytes", "must be above 0, got %d", c.PullMaxBytes)
	}
	if c.PullMaxTotalBytes < 0 || (c.PullMaxTotalBytes > 0 && c.PullMaxTotalBytes < c.PullMaxBytes) {
		bad("checkpoint.pull_max_total_bytes", "must be 0 (no bound) or at least checkpoint.pull_max_bytes (%d), so that every pull may fit, got %d", c.PullMaxBytes, c.PullMaxTotalBytes)
	}
	if d := c.PullTimeout.Duration; d < time.Second || d > 6*time.Hour {
		bad("checkpoint.pull_timeout", "must be from 1s to 6h (an older unfinished pull is taken for a leftover), got %s", d)
	}
	if d := c.PullWait.Duration; d < 0 || d > 3*time.Minute {
		bad("checkpoint.pull_wait", "must be from 0 to 3m (the kubelet gives RunPodSandbox 4m), got %s", d)
	}
	// 15 s is the read's own bound (podcheckpoint's fetchTimeout): waiting
	// longer gains nothing, and an API server that does not answer holds a
	// CRI call at most this long.
	if d := c.ObjectWait.Duration; d < 0 || d > 15*time.Second {
		bad("checkpoint.object_wait", "must be from 0 to 15s (one read of the object is given 15s), got %s", d)
	}
}

// checkRegistry checks an entry of checkpoint.registries: a registry host as
// image references spell it, plain HTTP only for a loopback one.
func checkRegistry(r RegistryConfig) error {
	if r.Host == "" || strings.ContainsAny(r.Host, "/@ ") {
		return fmt.Errorf("host %q must be a registry host or host:port", r.Host)
	}
	reg, err := name.NewRegistry(r.Host, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("host %q: %v", r.Host, err)
	}
	if reg.RegistryStr() != r.Host {
		return fmt.Errorf("host %q is known to image references as %q; list that", r.Host, reg.RegistryStr())
	}
	host, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		host = r.Host
	}
	if host == "" {
		return fmt.Errorf("host %q has no host name", r.Host)
	}
	if r.PlainHTTP && !Loopback(host) {
		return fmt.Errorf("plain_http is allowed only for a loopback registry (localhost, 127.0.0.0/8, ::1), not %q", r.Host)
	}
	return nil
}
