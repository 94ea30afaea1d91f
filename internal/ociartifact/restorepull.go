package ociartifact

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/cri-shim/cri-shim/internal/criu"
)

// RestorePullConfig is what restores from image references need.
type RestorePullConfig struct {
	// Root is the checkpoint root; a pull writes Root/oci-<digest hex>.
	Root string
	// Registries is the allow-list; empty refuses every image reference.
	Registries []Allowed
	// NodeAuthFile is the node's docker config.json (LoadKeychain), asked
	// after the pod's image pull secrets.
	NodeAuthFile string
	// MaxBytes caps a pulled checkpoint's archives.
	MaxBytes int64
	// Timeout bounds one pull, in the background.
	Timeout time.Duration
	// Wait is how long a RunPodSandbox waits for its pull before it is
	// answered Unavailable (the pull goes on; the kubelet's retry finds it).
	Wait time.Duration
	// RestoreAllowed is the namespace binding: may pods of namespace to
	// restore a checkpoint of namespace from (criu's restoreAllowed).
	RestoreAllowed func(from, to string) bool
	// PodKeychain, if set, reads the pod's image pull secrets (PodKeychain
	// with the node's API connection); nil: the node's credentials only.
	PodKeychain func(ctx context.Context, ns, pod, uid string) (authn.Keychain, error)
	// Reserve, if set, is asked for room for a pull's archive bytes before
	// they are fetched (criu's ReservePulled: the node-wide cap on pulled
	// checkpoints); see PullOptions.Reserve.
	Reserve func(total int64) (release func(), err error)
	// Transport replaces the HTTP transport (tests).
	Transport http.RoundTripper
	Log       *slog.Logger
}

// maxPullJobs bounds the pulls in progress; more are answered Unavailable.
const maxPullJobs = 4

// failedFor is how long a failed pull's error answers the same request
// before a new pull is tried.
const failedFor = 10 * time.Second

// RestorePuller pulls the checkpoints restores name by image reference
// (criu Config.PullRestore). A pull runs in the background, bounded by
// Timeout; the RunPodSandbox that asked waits for it at most Wait (and never
// past its own deadline), then is answered Unavailable while it goes on.
type RestorePuller struct {
	cfg RestorePullConfig

	mu   sync.Mutex
	jobs map[string]*pullJob // "<dir>/<namespace>"
}

type pullJob struct {
	done             chan struct{}
	err              error
	ended            time.Time
	planned, written atomic.Int64
}

// NewRestorePuller makes the puller.
func NewRestorePuller(cfg RestorePullConfig) *RestorePuller {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	return &RestorePuller{cfg: cfg, jobs: map[string]*pullJob{}}
}

// Pull returns the name under Root of the checkpoint at ref, for pod
// ns/pod (sandbox UID uid): pulled already, or pulled now. Errors are of an
// errdefs class: InvalidArgument (malformed reference), PermissionDenied
// (registry not allowed), Unavailable (pull in progress, API server or
// registry not answering: retry), ResourceExhausted (no room under the
// node's cap on pulled checkpoints: retry), FailedPrecondition
// (verification), and
// criu.ErrForeignCheckpoint for a checkpoint of a namespace the pod may not
// restore (refused before an archive is fetched).
func (p *RestorePuller) Pull(ctx context.Context, ns, pod, uid, ref string) (string, error) {
	d, allowed, err := ParseRestoreRef(ref, p.cfg.Registries)
	if err != nil {
		return "", err
	}
	dirName := criu.PulledDir(strings.TrimPrefix(d.DigestStr(), "sha256:"))
	if isDir(filepath.Join(p.cfg.Root, dirName)) {
		return dirName, nil
	}
	j, err := p.job(dirName, ns, func(j *pullJob) error {
		return p.pull(j, d.String(), d.DigestStr(), dirName, allowed, ns, pod, uid)
	})
	if err != nil {
		return "", err
	}
	wait := p.cfg.Wait
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl)-2*time.Second)
	}
	t := time.NewTimer(max(wait, 0))
	defer t.Stop()
	select {
	case <-j.done:
	case <-t.C:
	case <-ctx.Done():
	}
	select {
	case <-j.done:
		if j.err != nil {
			return "", j.err
		}
		return dirName, nil
	default:
		return "", fmt.Errorf("%w: pulling %s: %d of %d bytes fetched; the pod stays pending and the kubelet retries", errdefs.ErrUnavailable, ref, j.written.Load(), j.planned.Load())
	}
}

// job returns the pull of dirName for namespace ns, starting run in the
// background when there is none, or only a failure older than failedFor.
func (p *RestorePuller) job(dirName, ns string, run func(*pullJob) error) (*pullJob, error) {
	k := dirName + "/" + ns
	p.mu.Lock()
	defer p.mu.Unlock()
	running := 0
	for key, j := range p.jobs {
		select {
		case <-j.done:
			if time.Since(j.ended) > failedFor || j.err == nil {
				delete(p.jobs, key)
			}
		default:
			running++
		}
	}
	if j, ok := p.jobs[k]; ok {
		return j, nil
	}
	if running >= maxPullJobs {
		return nil, fmt.Errorf("%w: %d checkpoint pulls in progress on this node; the kubelet retries", errdefs.ErrUnavailable, running)
	}
	j := &pullJob{done: make(chan struct{})}
	p.jobs[k] = j
	go func() {
		err := run(j)
		p.mu.Lock()
		j.err, j.ended = err, time.Now()
		p.mu.Unlock()
		close(j.done)
	}()
	return j, nil
}

func (p *RestorePuller) pull(j *pullJob, ref, digest, dirName string, allowed Allowed, ns, pod, uid string) error {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeout)
	defer cancel()
	start := time.Now()
	node, err := LoadKeychain(p.cfg.NodeAuthFile)
	if err != nil {
		return fmt.Errorf("%w: the node's registry credentials: %v", errdefs.ErrFailedPrecondition, err)
	}
	kc := node
	if p.cfg.PodKeychain != nil {
		podKC, err := p.cfg.PodKeychain(ctx, ns, pod, uid)
		if err != nil {
			return err
		}
		kc = authn.NewMultiKeychain(podKC, node)
	}
	reg := Registry{Keychain: kc, CAFile: allowed.CAFile, PlainHTTP: allowed.PlainHTTP, Transport: p.cfg.Transport}
	res, err := Pull(ctx, ref, reg, PullOptions{
		Root: p.cfg.Root, Name: dirName, reserved: true, MaxBytes: p.cfg.MaxBytes,
		Check: func(m *criu.Manifest) error {
			if !p.cfg.RestoreAllowed(m.Pod.Namespace, ns) {
				return fmt.Errorf("%w: taken of pod %s/%s", criu.ErrForeignCheckpoint, m.Pod.Namespace, m.Pod.Name)
			}
			return nil
		},
		Planned: func(n int64) { j.planned.Store(n) },
		Written: func(n int64) { j.written.Add(n) },
		Reserve: p.cfg.Reserve,
	})
	switch {
	case err == nil:
	case isDir(filepath.Join(p.cfg.Root, dirName)):
		// Pulled meanwhile for a pod of another namespace, and verified.
		return nil
	case errors.Is(err, criu.ErrForeignCheckpoint):
		return err
	case errdefs.IsResourceExhausted(err):
		return fmt.Errorf("pulling %s: %w", ref, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: pulling %s: not done within [checkpoint] pull_timeout %s: %v", errdefs.ErrUnavailable, ref, p.cfg.Timeout, err)
	case errors.Is(err, errDigest) || errors.Is(err, errNotCheckpoint):
		return fmt.Errorf("%w: pulling %s: %v", errdefs.ErrFailedPrecondition, ref, err)
	default:
		// Registry errors, refused credentials, archive checks: retried at
		// the kubelet's next try after failedFor.
		return fmt.Errorf("%w: pulling %s: %v", errdefs.ErrUnavailable, ref, err)
	}
	if res.Digest.String() != digest {
		os.RemoveAll(res.Dir)
		return fmt.Errorf("%w: pulling %s: got index %s: %v", errdefs.ErrFailedPrecondition, ref, res.Digest, errDigest)
	}
	p.cfg.Log.Info("checkpoint: pulled for a restore", "ref", ref, "dir", res.Dir, "bytes", res.Bytes,
		"seconds", time.Since(start).Seconds(), "pod", ns+"/"+pod)
	return nil
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
