package podcheckpoint

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// Provenance of a checkpoint pulled for a restore from an image reference
// ([checkpoint] restore_provenance = "cluster", the default): the pulled
// repository at the image index's digest must be what a PodCheckpoint of
// this cluster records as its export (exportRecord: spec.export, Exported
// True, written by the node the object is routed to, status.export.image
// spec.export.image's repository at status.export.digest), in the restoring
// pod's namespace or one it may restore from. Tenants cannot write status
// (deploy/rbac), and a node only that of objects routed to it
// (deploy/admission). Bytes anyone could push to an allowed registry are
// then never restored: only what this cluster checkpointed and pushed, to
// the repository its namespace named. The API server filters by the CRD's
// selectable field status.export.digest before any byte is fetched; the
// answers are kept a short while, so a kubelet retrying a refused pod
// does not LIST each time.

// provenanceTimeout bounds one look-up.
const provenanceTimeout = 10 * time.Second

// provenanceTTL is how long an answer (accepted or refused) is reused: an
// export recorded just after a refusal is seen this much later at most,
// and a record deleted after an acceptance is still accepted this long.
const provenanceTTL = 10 * time.Second

// maxProvenanceAnswers bounds the answers kept (their keys come from pods'
// references).
const maxProvenanceAnswers = 4096

// provenancePage and provenancePages bound the records read per namespace
// and digest: a few objects share a digest (unchanged content pushed
// twice); forged ones may be among them, so not only the first is read.
const (
	provenancePage  = 100
	provenancePages = 5
)

// provenance is the check and its answers.
type provenance struct {
	conn       Conn
	namespaces func(ns string) []string
	now        func() time.Time

	once      sync.Once
	client    *Client
	clientErr error

	mu      sync.Mutex
	answers map[string]provenanceAnswer
	pending map[string]*provenanceLookup
}

type provenanceAnswer struct {
	err error
	at  time.Time
}

// provenanceLookup is one look-up that concurrent checks of one key share.
type provenanceLookup struct {
	done chan struct{}
	err  error
}

// Provenance returns the check, over conn: nil error when a namespace of
// namespaces(ns) (the restoring pod's, then those it may restore from)
// holds a PodCheckpoint whose record (exportRecord) is an export of repo
// (the pulled reference's repository, name.Repository.Name()) at digest.
// PermissionDenied when none does; Unavailable while the API connection is
// not ready or the API server does not answer (the pod stays pending, the
// kubelet retries). Answers but Unavailable are kept provenanceTTL;
// concurrent checks of one namespace, repository and digest share one
// look-up.
func Provenance(conn Conn, namespaces func(ns string) []string) func(ctx context.Context, ns, repo, digest string) error {
	return newProvenance(conn, namespaces).check
}

func newProvenance(conn Conn, namespaces func(ns string) []string) *provenance {
	return &provenance{conn: conn, namespaces: namespaces, now: time.Now,
		answers: map[string]provenanceAnswer{}, pending: map[string]*provenanceLookup{}}
}

func (p *provenance) check(ctx context.Context, ns, repo, digest string) error {
	select {
	case <-p.conn.Ready():
	default:
		return fmt.Errorf("%w: restore_provenance = \"cluster\": the API server connection is not ready to check that a node of this cluster exported %s", errdefs.ErrUnavailable, digest)
	}
	k := ns + "\x00" + repo + "\x00" + digest
	p.mu.Lock()
	if a, ok := p.answers[k]; ok && p.now().Sub(a.at) < provenanceTTL {
		p.mu.Unlock()
		return a.err
	}
	l := p.pending[k]
	if l == nil {
		l = &provenanceLookup{done: make(chan struct{})}
		p.pending[k] = l
		go p.lookUp(k, l, ns, repo, digest)
	}
	p.mu.Unlock()
	select {
	case <-l.done:
		return l.err
	case <-ctx.Done():
		return fmt.Errorf("%w: restore_provenance: looking for the PodCheckpoint that exported %s: %v", errdefs.ErrUnavailable, digest, ctx.Err())
	}
}

// lookUp makes the look-up l of key k, keeps its answer unless it is
// Unavailable, and ends l.
func (p *provenance) lookUp(k string, l *provenanceLookup, ns, repo, digest string) {
	ctx, cancel := context.WithTimeout(context.Background(), provenanceTimeout)
	defer cancel()
	l.err = p.find(ctx, ns, repo, digest)
	p.mu.Lock()
	delete(p.pending, k)
	if !errdefs.IsUnavailable(l.err) {
		if len(p.answers) >= maxProvenanceAnswers {
			for old, a := range p.answers {
				if p.now().Sub(a.at) >= provenanceTTL || len(p.answers) >= maxProvenanceAnswers {
					delete(p.answers, old)
				}
			}
		}
		p.answers[k] = provenanceAnswer{err: l.err, at: p.now()}
	}
	p.mu.Unlock()
	close(l.done)
}

// find lists the records of digest in the namespaces ns may restore from
// and accepts the first that is an export of repo. A refusal names a
// record it turned down only of those namespaces, and says nothing of any
// other.
func (p *provenance) find(ctx context.Context, ns, repo, digest string) error {
	p.once.Do(func() { p.client, p.clientErr = NewClient(p.conn.REST()) })
	if p.clientErr != nil {
		return fmt.Errorf("%w: restore_provenance: %v", errdefs.ErrUnavailable, p.clientErr)
	}
	sel := fields.OneTermEqualSelector("status.export.digest", digest).String()
	var turnedDown string
	for _, n := range p.namespaces(ns) {
		opts := metav1.ListOptions{FieldSelector: sel, Limit: provenancePage}
		for range provenancePages {
			l, err := p.client.List(ctx, n, opts)
			if err != nil {
				return fmt.Errorf("%w: restore_provenance: looking for the PodCheckpoint that exported %s in namespace %s: %v", errdefs.ErrUnavailable, digest, n, err)
			}
			for i := range l.Items {
				pc := &l.Items[i]
				if pc.Status.Export == nil || pc.Status.Export.Digest != digest {
					continue
				}
				r, err := exportRecord(pc)
				if err == nil && r.Name() == repo {
					return nil
				}
				if err == nil {
					err = fmt.Errorf("it exported to repository %s, not %s", r.Name(), repo)
				}
				if turnedDown == "" {
					turnedDown = fmt.Sprintf("; PodCheckpoint %s/%s records the digest, but %v", pc.Namespace, pc.Name, err)
				}
			}
			if opts.Continue = l.Continue; opts.Continue == "" {
				break
			}
		}
	}
	return fmt.Errorf("%w: no PodCheckpoint of namespace %s records exporting %s to %s (spec.export, Exported True, status.export written by the node the object is routed to)%s: with [checkpoint] restore_provenance = \"cluster\" a pod restores only checkpoints a node of this cluster exported; an operator widens it with restore_provenance = \"any\"",
		errdefs.ErrPermissionDenied, ns, digest, repo, turnedDown)
}
