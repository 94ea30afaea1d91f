package config

// The [checkpoint] section: where checkpoints may live, how many are kept,
// who may restore them, and the registries restores may pull from.

import (
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
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
	// MaxConcurrentCaptures bounds the captures that run at once on the
	// node (every checkpoint freezes a pod and writes its memory): a call
	// over it waits for a slot within its deadline (criu's admission.go).
	MaxConcurrentCaptures int `toml:"max_concurrent_captures" comment:"Checkpoints captured at once on the node (1 to 64); a further CheckpointPod waits its turn within its deadline, else is refused (ResourceExhausted), nothing paused."`
	// PodMinGap is the shortest time between the starts of two checkpoints
	// of one pod, whatever asks for them (schedule, PodCheckpoint, the CRI
	// call); 0 turns it off.
	PodMinGap Duration `toml:"pod_min_gap" comment:"Shortest time between the starts of two checkpoints of one pod (0 to 1h; 0: no gap); one asked sooner is refused (ResourceExhausted) with the time left, nothing paused."`
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
	// Registries are where a restore from an image reference may pull
	// from and a PodCheckpoint's export may push to, by repository prefix
	// and namespace (docs/checkpoint-oci.md); a pod or an object names the
	// reference, so the node connects only to these.
	Registries []RegistryConfig `toml:"registries,omitempty" comment:"Registry repositories restores from image references pull from and exports push to, each for the namespaces it names (default none: image references are refused); host: host[:port] or host[:port]/repository/prefix; namespaces: the namespaces allowed there, or ['*']; anonymous_push: exports naming no secret may push there anonymously; plain_http only for a loopback host, ca_file: a PEM bundle trusted besides the system roots." example:"[{ host = 'registry.example.com/team-a', namespaces = ['team-a'], ca_file = '/etc/cri-shim/registry-ca.pem' }, { host = '127.0.0.1:5000', namespaces = ['*'], plain_http = true, anonymous_push = true }]"`
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
	// Host is the registry as image references spell it, host or
	// host:port, optionally followed by a repository prefix
	// (host/team-a/checkpoints): the entry then covers that repository and
	// those below it only.
	Host string `toml:"host"`
	// Namespaces are the namespaces whose pods may restore from, and whose
	// PodCheckpoints may export to, the entry's repositories; "*" alone is
	// every namespace. Required: an entry without it is refused at load.
	Namespaces []string `toml:"namespaces"`
	// AnonymousPush lets an export that names no secret push to the
	// entry's repositories anonymously (from the node's address); without
	// it such an export is refused.
	AnonymousPush bool `toml:"anonymous_push,omitempty"`
	// PlainHTTP allows plain HTTP; only for a loopback host.
	PlainHTTP bool `toml:"plain_http,omitempty"`
	// CAFile is a PEM bundle trusted for this registry besides the system roots.
	CAFile string `toml:"ca_file,omitempty"`
}

// AllNamespaces in a registry entry's namespaces allows every namespace.
const AllNamespaces = "*"

// Registry is the entry's registry host (host or host:port).
func (r RegistryConfig) Registry() string {
	h, _, _ := strings.Cut(r.Host, "/")
	return h
}

// Prefix is the entry's repository prefix ("" for the whole registry).
func (r RegistryConfig) Prefix() string {
	_, p, _ := strings.Cut(r.Host, "/")
	return p
}

// Covers reports whether repository repo (without its registry) is the
// entry's prefix or below it, component by component.
func (r RegistryConfig) Covers(repo string) bool {
	p := r.Prefix()
	return p == "" || repo == p || strings.HasPrefix(repo, p+"/")
}

// Allows reports whether namespace ns may use the entry's repositories.
func (r RegistryConfig) Allows(ns string) bool {
	return slices.Contains(r.Namespaces, AllNamespaces) || slices.Contains(r.Namespaces, ns)
}

// repoComponent is a path component of a repository name (OCI distribution
// spec, "Pulling manifests").
var repoComponent = regexp.MustCompile(`^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*$`)

// RepositoryComponent reports whether c has the distribution spec's form of
// a repository path component.
func RepositoryComponent(c string) bool { return repoComponent.MatchString(c) }

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
	if n := c.MaxConcurrentCaptures; n < 1 || n > 64 {
		bad("checkpoint.max_concurrent_captures", "must be from 1 to 64, got %d", n)
	}
	if d := c.PodMinGap.Duration; d < 0 || d > time.Hour {
		bad("checkpoint.pod_min_gap", "must be from 0 (no gap) to 1h, got %s", d)
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
	entries := map[string]bool{}        // host/prefix, lower-cased host
	conn := map[string]RegistryConfig{} // the first entry of each host
	for i, r := range c.Registries {
		field := fmt.Sprintf("checkpoint.registries[%d]", i)
		if err := checkRegistry(r); err != nil {
			bad(field, "%v", err)
		}
		if r.CAFile != "" && !filepath.IsAbs(r.CAFile) {
			bad(field+".ca_file", "must be an absolute path, got %q", r.CAFile)
		}
		if err := checkNamespaces(r.Namespaces); err != nil {
			bad(field+".namespaces", "%v", err)
		}
		host := strings.ToLower(r.Registry())
		if k := host + "/" + r.Prefix(); entries[k] {
			bad(field, "host %q is listed twice", r.Host)
		} else {
			entries[k] = true
		}
		// The connection is the registry's: every entry of one host
		// must say the same of it.
		if first, ok := conn[host]; !ok {
			conn[host] = r
		} else if first.PlainHTTP != r.PlainHTTP || first.CAFile != r.CAFile {
			bad(field, "host %q: plain_http and ca_file must be the same in every entry of registry %s (the connection is the registry's)", r.Host, r.Registry())
		}
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
// image references spell it, then an optional repository prefix of the
// distribution spec's form; plain HTTP only for a loopback host.
func checkRegistry(r RegistryConfig) error {
	host := r.Registry()
	if host == "" || strings.ContainsAny(r.Host, "@ ") {
		return fmt.Errorf("host %q must be a registry host or host:port, optionally followed by /repository/prefix", r.Host)
	}
	if strings.Contains(r.Host, "/") {
		p := r.Prefix()
		if p == "" || strings.HasSuffix(p, "/") {
			return fmt.Errorf("host %q: the repository prefix after the registry is empty or ends in /", r.Host)
		}
		for _, c := range strings.Split(p, "/") {
			if !RepositoryComponent(c) {
				return fmt.Errorf("host %q: repository component %q is not of the distribution spec's form [a-z0-9]+((.|_|__|-+)[a-z0-9]+)*", r.Host, c)
			}
		}
	}
	reg, err := name.NewRegistry(host, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("host %q: %v", r.Host, err)
	}
	if reg.RegistryStr() != host {
		return fmt.Errorf("host %q is known to image references as %q; list that", host, reg.RegistryStr())
	}
	hostname, _, err := net.SplitHostPort(host)
	if err != nil {
		hostname = host
	}
	if hostname == "" {
		return fmt.Errorf("host %q has no host name", r.Host)
	}
	if r.PlainHTTP && !Loopback(hostname) {
		return fmt.Errorf("plain_http is allowed only for a loopback registry (localhost, 127.0.0.0/8, ::1), not %q", host)
	}
	return nil
}

// checkNamespaces checks an entry's namespaces: required, namespace names or
// "*" alone, none twice.
func checkNamespaces(ns []string) error {
	if len(ns) == 0 {
		return fmt.Errorf("is empty: list the namespaces whose pods may restore from and export to these repositories, or [%q] for every namespace (an entry without namespaces used to allow every namespace; name them now)", AllNamespaces)
	}
	seen := map[string]bool{}
	for _, n := range ns {
		switch {
		case n == AllNamespaces && len(ns) > 1:
			return fmt.Errorf("%q stands for every namespace and must be alone, got %q", AllNamespaces, ns)
		case n == AllNamespaces:
		case len(validation.IsDNS1123Label(n)) > 0:
			return fmt.Errorf("%q is not a namespace name (a DNS-1123 label): %s", n, strings.Join(validation.IsDNS1123Label(n), "; "))
		case seen[n]:
			return fmt.Errorf("%q is listed twice", n)
		}
		seen[n] = true
	}
	return nil
}
