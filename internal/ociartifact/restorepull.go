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
	"github.com/google/go-containerregistry/pkg/name"

	"github.com/cri-shim/cri-shim/internal/layout"
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
	// restore a checkpoint of namespace from (internal/restore's Allowed).
	RestoreAllowed func(from, to string) bool
	// PodKeychain, if set, reads the pod's image pull secrets (PodKeychain
	// with the node's API connection); nil: the node's credentials only.
	PodKeychain func(ctx context.Context, ns, pod, uid string) (authn.Keychain, error)
	// Provenance, if set, is asked, before anything is fetched, whether
	// a pod of namespace ns may restore the checkpoint whose image index
	// is in repository repo (the reference's, name.Repository.Name():
	// registry and path) at digest (podcheckpoint.Provenance: one this
	// cluster exported there); its error (errdefs class) answers the
	// restore.
	Provenance func(ctx context.Context, ns, repo, digest string) error
	// Transport replaces the HTTP transport (tests).
	Transport http.RoundTripper
	Log       *slog.Logger
}

// maxPullJobs bounds the pulls in progress, maxNSPullJobs those for the
// pods of one namespace (a pull holds its slot for up to [checkpoint]
// pull_timeout: one tenant must not hold them all); more are answered
// Unavailable, and the kubelet retries.
const (
	maxPullJobs   = 4
	maxNSPullJobs = maxPullJobs / 2
)

// failedFor is how long a failed pull's error answers the same request
// before a new pull is tried.
const failedFor = 10 * time.Second

// refusedFor is how long a pull whose checkpoint's content was refused
// (layout.ErrCheckpointRefused) answers the same request: a digest's content
// does not change, so the kubelet's retries are answered without pulling
// it again. At most maxRefusedJobs are kept that long; others go after
// failedFor.
const refusedFor = 30 * time.Minute

// maxRefusedJobs bounds the refused pulls remembered for refusedFor.
const maxRefusedJobs = 1024

// RestorePuller pulls the checkpoints restores name by image reference
// (criu Config.PullRestore). A pull runs in the background, bounded by
// Timeout; the RunPodSandbox that asked waits for it at most Wait (and never
// past its own deadline), then is answered Unavailable while it goes on.
type RestorePuller struct {
	cfg RestorePullConfig

	mu   sync.Mutex
	jobs map[string]*pullJob // "<kind>/<dir>/<namespace>" (pulls), "<kind>/<dir>/<uid>" (checks)

	// accessMu serialises the access records' reads and writes (access.go).
	accessMu sync.Mutex
}

type pullJob struct {
	kind             int    // jobPull or jobVerify
	ns               string // the namespace of the pod it runs for
	uid              string // the pod it runs for, with its credentials
	done             chan struct{}
	err              error
	ended            time.Time
	planned, written atomic.Int64
	// refused: the registry refused the pull to the pod's credentials
	// (refusal): a pod that joined it is not answered by it.
	refused atomic.Bool
	// contentRefused: the checkpoint's content was refused; its error is
	// kept for refusedFor.
	contentRefused atomic.Bool
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
// ns/pod (sandbox UID uid): pulled already, or pulled now. A checkpoint
// already on the node is answered only once pod may read ref (verify,
// access.go). Errors are of an errdefs class: InvalidArgument (malformed
// reference), PermissionDenied (registry not allowed, or the registry does
// not let the pod's credentials read ref), Unavailable (pull or check in
// progress, API server or registry not answering: retry), ResourceExhausted
// (no room under the node's cap on pulled checkpoints: retry),
// FailedPrecondition (verification), and layout.ErrForeignCheckpoint for a
// checkpoint of a namespace the pod may not restore (refused before an
// archive is fetched).
//
// reserve, if not nil, is asked for room for the pull's archive bytes
// before they are fetched (the caller's cap on pulled checkpoints: the
// checkpoint store's ReservePulled); see PullOptions.Reserve.
func (p *RestorePuller) Pull(ctx context.Context, ns, pod, uid, ref string, reserve func(total int64) (release func(), err error)) (string, error) {
	d, allowed, err := ParseRestoreRef(ref, ns, p.cfg.Registries)
	if err != nil {
		return "", err
	}
	if p.cfg.Provenance != nil {
		if err := p.cfg.Provenance(ctx, ns, d.Context().Name(), d.DigestStr()); err != nil {
			return "", err
		}
	}
	dirName := layout.PulledDir(strings.TrimPrefix(d.DigestStr(), "sha256:"))
	dir := filepath.Join(p.cfg.Root, dirName)
	m, err := p.onDisk(dir)
	if err != nil {
		return "", err
	}
	if m == nil {
		// The pull in progress for the namespace is joined. One that the
		// registry refused to another pod's credentials is not this pod's
		// answer: its own pull is tried then (job starts it: a failure
		// answers only its own pod), while the wait lasts.
		until := time.Now().Add(p.cfg.Wait)
		var j *pullJob
		for {
			j, err = p.job(jobPull, dirName+"/"+ns, ns, uid, func(j *pullJob) error {
				return p.pull(j, d, allowed, dirName, ns, pod, uid, reserve)
			})
			if err != nil {
				return "", err
			}
			err = p.await(ctx, until, j, func() string {
				return fmt.Sprintf("pulling %s: %d of %d bytes fetched", ref, j.written.Load(), j.planned.Load())
			})
			if err == nil || j.uid == uid || !j.refused.Load() || !time.Now().Before(until) {
				break
			}
		}
		if err != nil {
			return "", err
		}
		if j.uid == uid {
			// Pulled with this pod's credentials, recorded by the pull.
			return dirName, nil
		}
		if m, err = p.onDisk(dir); err != nil {
			return "", err
		}
		if m == nil {
			return "", fmt.Errorf("%w: %s was pulled and removed again meanwhile; the pod stays pending and the kubelet retries", errdefs.ErrUnavailable, ref)
		}
	}
	// On the node already. The namespace binding first, as a pull judges it
	// before anything else: a pod it refuses learns nothing more here.
	if !p.cfg.RestoreAllowed(m.Pod.Namespace, ns) {
		return "", fmt.Errorf("%w: taken of pod %s/%s", layout.ErrForeignCheckpoint, m.Pod.Namespace, m.Pod.Name)
	}
	// Then the pod must be let read it: at once when every pod of the node
	// may (read with the node's credentials or anonymously), else checked
	// with the pod's credentials in the background.
	if !p.allowsAccess(dir, d.Context().Name(), podCredential{}) {
		j, err := p.job(jobVerify, dirName+"/"+uid, ns, uid, func(*pullJob) error {
			return p.verify(d, allowed, dirName, ns, pod, uid)
		})
		if err != nil {
			return "", err
		}
		if err := p.await(ctx, time.Now().Add(p.cfg.Wait), j, func() string {
			return fmt.Sprintf("checking with the registry that pod %s/%s may read %s", ns, pod, ref)
		}); err != nil {
			return "", err
		}
	}
	// Still there (the cap or the sweep may have removed it while it was
	// checked): only then touched, so that neither the sweep of unused
	// pulls nor the cap takes it before the warm start's record names it.
	// A directory that is gone or incomplete is never touched: it is pulled
	// again at the kubelet's retry.
	if m, err := p.onDisk(dir); err != nil {
		return "", err
	} else if m == nil {
		return "", fmt.Errorf("%w: %s was removed from this node while pod %s/%s's access was checked; the pod stays pending and the kubelet retries, which pulls it again", errdefs.ErrUnavailable, ref, ns, pod)
	}
	now := time.Now()
	os.Chtimes(dir, now, now)
	return dirName, nil
}

// onDisk reads the pulled checkpoint dir (layout.ReadPulled): nil when there
// is none. A directory there that is not a complete checkpoint (a removal an
// older shim's kill interrupted, a record written into a directory as it was
// deleted) is removed, as the shim removes pulled checkpoints, and answered
// as none, so that it is pulled again. An I/O error that leaves it unknown
// is Unavailable, and nothing is removed.
func (p *RestorePuller) onDisk(dir string) (*layout.Manifest, error) {
	m, err := layout.ReadPulled(dir)
	switch {
	case err == nil:
		return m, nil
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case !errors.Is(err, layout.ErrPulledIncomplete):
		return nil, fmt.Errorf("%w: reading the pulled checkpoint %s: %v; the pod stays pending and the kubelet retries", errdefs.ErrUnavailable, dir, err)
	}
	removed, rerr := layout.RemoveIncompletePulled(dir)
	switch {
	case rerr != nil:
		p.cfg.Log.Warn("checkpoint: removing an incomplete pulled checkpoint; the sweep finishes it", "dir", dir, "why", err, "err", rerr)
	case removed:
		p.cfg.Log.Warn("checkpoint: removed an incomplete pulled checkpoint; pulling it again", "dir", dir, "why", err)
	}
	if !removed && rerr == nil {
		// Put back complete: pulled again meanwhile.
		return p.onDisk(dir)
	}
	return nil, nil
}

// await waits for j until until (Wait from the request), and never past
// 2 s before ctx's deadline; a job still running then is answered
// Unavailable with busy's account of it (it goes on; the kubelet's retry
// finds it).
func (p *RestorePuller) await(ctx context.Context, until time.Time, j *pullJob, busy func() string) error {
	wait := time.Until(until)
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
		return j.err
	default:
		return fmt.Errorf("%w: %s; the pod stays pending and the kubelet retries", errdefs.ErrUnavailable, busy())
	}
}

// Jobs are pulls (at most maxPullJobs at once, maxNSPullJobs of one
// namespace) and checks that a pod may read a checkpoint already pulled
// (at most maxVerifyJobs, each bounded by verifyTimeout).
const (
	jobPull = iota
	jobVerify
)

// maxVerifyJobs bounds the access checks in progress.
const maxVerifyJobs = 16

// verifyTimeout bounds one access check: the pod's secrets, one index GET.
const verifyTimeout = time.Minute

// job returns the job of kind under key, starting run in the background
// for pod uid of namespace ns when there is none, or only a failure older
// than failedFor.
func (p *RestorePuller) job(kind int, key, ns, uid string, run func(*pullJob) error) (*pullJob, error) {
	k := fmt.Sprintf("%d/%s", kind, key)
	p.mu.Lock()
	defer p.mu.Unlock()
	running, ofNS, kept := 0, 0, 0
	for key, j := range p.jobs {
		select {
		case <-j.done:
			keep := failedFor
			if j.contentRefused.Load() && kept < maxRefusedJobs {
				keep = refusedFor
				kept++
			}
			if time.Since(j.ended) > keep || j.err == nil {
				delete(p.jobs, key)
			}
		default:
			if j.kind == kind {
				running++
				if j.ns == ns {
					ofNS++
				}
			}
		}
	}
	if j, ok := p.jobs[k]; ok && !failedForAnother(j, uid) {
		return j, nil
	}
	switch {
	case kind == jobPull && running >= maxPullJobs:
		return nil, fmt.Errorf("%w: %d checkpoint pulls in progress on this node; the kubelet retries", errdefs.ErrUnavailable, running)
	case kind == jobPull && ofNS >= maxNSPullJobs:
		return nil, fmt.Errorf("%w: %d checkpoint pulls for pods of namespace %s in progress on this node, its share; the kubelet retries", errdefs.ErrUnavailable, ofNS, ns)
	case kind == jobVerify && running >= maxVerifyJobs:
		return nil, fmt.Errorf("%w: %d checks of pods' access to pulled checkpoints in progress on this node; the kubelet retries", errdefs.ErrUnavailable, running)
	}
	j := &pullJob{kind: kind, ns: ns, uid: uid, done: make(chan struct{})}
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

func (p *RestorePuller) pull(j *pullJob, d name.Digest, allowed Allowed, dirName, ns, pod, uid string, reserve func(int64) (func(), error)) error {
	ref, digest := d.String(), d.DigestStr()
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.Timeout)
	defer cancel()
	start := time.Now()
	podKC, kc, err := p.keychains(ctx, ns, pod, uid)
	if err != nil {
		return err
	}
	cred, err := credentialOf(podKC, d.Context())
	if err != nil {
		return fmt.Errorf("%w: pod %s/%s's credentials for %s: %v", errdefs.ErrFailedPrecondition, ns, pod, d.Context().RegistryStr(), err)
	}
	reg := Registry{Keychain: kc, CAFile: allowed.CAFile, PlainHTTP: allowed.PlainHTTP, Transport: p.cfg.Transport}
	res, err := Pull(ctx, ref, reg, PullOptions{
		Root: p.cfg.Root, Name: dirName, reserved: true, MaxBytes: p.cfg.MaxBytes,
		Check: func(m *layout.Manifest) error {
			if !p.cfg.RestoreAllowed(m.Pod.Namespace, ns) {
				return fmt.Errorf("%w: taken of pod %s/%s", layout.ErrForeignCheckpoint, m.Pod.Namespace, m.Pod.Name)
			}
			return nil
		},
		Planned: func(n int64) { j.planned.Store(n) },
		Written: func(n int64) { j.written.Add(n) },
		Reserve: reserve,
	})
	switch {
	case err == nil:
	case complete(filepath.Join(p.cfg.Root, dirName)):
		// Pulled meanwhile for a pod of another namespace, and verified;
		// this pod's credentials are not known to read it yet.
		return p.verify(d, allowed, dirName, ns, pod, uid)
	case errors.Is(err, layout.ErrForeignCheckpoint):
		return err
	case errdefs.IsResourceExhausted(err):
		return fmt.Errorf("pulling %s: %w", ref, err)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: pulling %s: not done within [checkpoint] pull_timeout %s: %v", errdefs.ErrUnavailable, ref, p.cfg.Timeout, err)
	case errors.Is(err, layout.ErrCheckpointRefused):
		j.contentRefused.Store(true)
		return fmt.Errorf("%w: pulling %s: %w", errdefs.ErrFailedPrecondition, ref, err)
	case errors.Is(err, errDigest) || errors.Is(err, errNotCheckpoint):
		return fmt.Errorf("%w: pulling %s: %v", errdefs.ErrFailedPrecondition, ref, err)
	default:
		// Registry errors, refused credentials, archive checks: retried at
		// the kubelet's next try after failedFor.
		j.refused.Store(refusal(err))
		return fmt.Errorf("%w: pulling %s: %v", errdefs.ErrUnavailable, ref, err)
	}
	if res.Digest.String() != digest {
		os.RemoveAll(res.Dir)
		return fmt.Errorf("%w: pulling %s: got index %s: %v", errdefs.ErrFailedPrecondition, ref, res.Digest, errDigest)
	}
	p.recordAccess(res.Dir, d.Context().Name(), cred)
	p.cfg.Log.Info("checkpoint: pulled for a restore", "ref", ref, "dir", res.Dir, "bytes", res.Bytes,
		"seconds", time.Since(start).Seconds(), "pod", ns+"/"+pod)
	return nil
}

// failedForAnother reports whether j failed for another pod: its failure
// (refused credentials, say) answers only its own pod, so that another
// pod's pull is not held back by it. A refusal of the checkpoint's content
// answers every pod.
func failedForAnother(j *pullJob, uid string) bool {
	select {
	case <-j.done:
		return j.err != nil && j.uid != uid && !j.contentRefused.Load()
	default:
		return false
	}
}

// complete reports whether dir is a complete pulled checkpoint.
func complete(dir string) bool {
	_, err := layout.ReadPulled(dir)
	return err == nil
}
