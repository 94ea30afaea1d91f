package podcheckpoint

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/cri-shim/cri-shim/internal/kubeapi"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

type restConn struct {
	ready chan struct{}
	cfg   *rest.Config
}

func (c restConn) Ready() <-chan struct{}       { return c.ready }
func (c restConn) Resources() kubeapi.Resources { return nil }
func (c restConn) REST() *rest.Config           { return c.cfg }

const provRepo = "reg.example:5000/team/web"

func provDigest(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }

// exportRecordOf is the record node writes of an export of ns/name to
// provRepo at digest, routed to node by the router.
func exportRecordOf(ns, name, node, digest string) cpv1.PodCheckpoint {
	pc := cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Labels: map[string]string{cpv1.NodeLabel: cpv1.NodeLabelValue(node)}}}
	pc.Spec.SourcePodName = "web-0"
	pc.Spec.Export = &cpv1.PodCheckpointExport{Image: provRepo + ":v1"}
	pc.Status.NodeName = node
	pc.Status.Export = &cpv1.PodCheckpointExportStatus{Image: provRepo + "@" + digest, Digest: digest}
	setCondition(&pc.Status, cpv1.ConditionExported, metav1.ConditionTrue, cpv1.ReasonExported, "", 1, time.Now())
	return pc
}

// recordServer serves LISTs of PodCheckpoints filtered by
// status.export.digest from records (by namespace), as the API server
// does, counting them; while hold is set, each LIST waits for it.
type recordServer struct {
	mu      sync.Mutex
	records map[string][]cpv1.PodCheckpoint
	lists   atomic.Int32
	fail    atomic.Bool
	hold    chan struct{}
	srv     *httptest.Server
}

func newRecordServer(t *testing.T) *recordServer {
	rs := &recordServer{records: map[string][]cpv1.PodCheckpoint{}}
	rs.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rs.lists.Add(1)
		rs.mu.Lock()
		hold := rs.hold
		rs.mu.Unlock()
		if hold != nil {
			<-hold
		}
		if rs.fail.Load() {
			http.Error(w, "etcd is down", http.StatusInternalServerError)
			return
		}
		sel, _ := strings.CutPrefix(r.URL.Query().Get("fieldSelector"), "status.export.digest=")
		ns, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/apis/checkpoint.cri-shim.io/v1alpha1/namespaces/"), "/")
		l := cpv1.PodCheckpointList{}
		l.APIVersion, l.Kind = cpv1.SchemeGroupVersion.String(), "PodCheckpointList"
		rs.mu.Lock()
		for _, pc := range rs.records[ns] {
			if pc.Status.Export != nil && pc.Status.Export.Digest == sel {
				l.Items = append(l.Items, pc)
			}
		}
		rs.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(l)
	}))
	t.Cleanup(rs.srv.Close)
	return rs
}

func (rs *recordServer) add(pcs ...cpv1.PodCheckpoint) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, pc := range pcs {
		rs.records[pc.Namespace] = append(rs.records[pc.Namespace], pc)
	}
}

func (rs *recordServer) provenance() *provenance {
	ready := make(chan struct{})
	close(ready)
	return newProvenance(restConn{ready: ready, cfg: &rest.Config{Host: rs.srv.URL}}, func(ns string) []string {
		if ns == "team-b" {
			return []string{"team-b", "team-a"} // restore_namespace_allow {team-a, team-b}
		}
		return []string{ns}
	})
}

// Issue 28 item 2, issue 44 item 2: a digest restores when a PodCheckpoint
// of the pod's namespace (or one it may restore from) records exporting it
// to the pulled repository, in a record its holder wrote: spec.export set,
// Exported True, the holder the node the object is routed to,
// status.export.image spec.export.image's repository at the digest. Each
// kind of forged record is refused; a refusal says nothing of namespaces
// the pod may not restore from; an API server that does not answer is
// Unavailable.
func TestProvenance(t *testing.T) {
	rs := newRecordServer(t)
	ok := provDigest('a')
	rs.add(exportRecordOf("team-a", "web-ckpt", "node-1", ok))
	long := strings.Repeat("n", 70)
	longOK := exportRecordOf("team-a", "long", long, provDigest('l'))
	longOK.Annotations = map[string]string{cpv1.NodeNameAnnotation: long}
	rs.add(longOK)

	forged := map[string]func(*cpv1.PodCheckpoint){
		"holder is not the routed node": func(pc *cpv1.PodCheckpoint) { pc.Status.NodeName = "node-2" },
		"no node label":                 func(pc *cpv1.PodCheckpoint) { pc.Labels = nil },
		"no holder":                     func(pc *cpv1.PodCheckpoint) { pc.Status.NodeName = "" },
		"Exported False": func(pc *cpv1.PodCheckpoint) {
			setCondition(&pc.Status, cpv1.ConditionExported, metav1.ConditionFalse, cpv1.ReasonExportFailed, "", 1, time.Now())
		},
		"no Exported condition": func(pc *cpv1.PodCheckpoint) { pc.Status.Conditions = nil },
		"no spec.export":        func(pc *cpv1.PodCheckpoint) { pc.Spec.Export = nil },
		"status.export.image outside spec.export's repository": func(pc *cpv1.PodCheckpoint) {
			pc.Spec.Export.Image = "reg.example:5000/team/other:v1"
		},
		"a hashed label without the full name": func(pc *cpv1.PodCheckpoint) {
			pc.Status.NodeName = long
			pc.Labels[cpv1.NodeLabel] = cpv1.NodeLabelValue(long)
		},
	}
	c := byte('b')
	digests := map[string]string{}
	for what, edit := range forged {
		d := provDigest(c)
		c++
		pc := exportRecordOf("team-a", "forged", "node-1", d)
		edit(&pc)
		rs.add(pc)
		digests[what] = d
	}
	// A record of another repository, consistent in itself: not one of
	// the repository pulled.
	elsewhere := exportRecordOf("team-a", "elsewhere", "node-1", provDigest('z'))
	elsewhere.Spec.Export.Image = "reg.example:5000/team/other:v1"
	elsewhere.Status.Export.Image = "reg.example:5000/team/other@" + provDigest('z')
	rs.add(elsewhere)
	// A forged record listed before a true one of the same digest.
	both := provDigest('y')
	first := exportRecordOf("team-a", "a-forged", "node-1", both)
	first.Status.NodeName = "node-9"
	rs.add(first, exportRecordOf("team-a", "b-true", "node-1", both))

	check := rs.provenance().check
	ctx := context.Background()
	for _, tc := range []struct {
		ns, repo, digest string
		accept           bool
	}{
		{"team-a", provRepo, ok, true},
		{"team-b", provRepo, ok, true}, // may restore team-a's
		{"team-c", provRepo, ok, false},
		{"team-a", provRepo, provDigest('0'), false}, // no record
		{"team-a", "reg.example:5000/team/other", ok, false},
		{"team-a", provRepo, provDigest('l'), true},
		{"team-a", "reg.example:5000/team/other", provDigest('z'), true},
		{"team-a", provRepo, provDigest('z'), false},
		{"team-a", provRepo, both, true},
	} {
		err := check(ctx, tc.ns, tc.repo, tc.digest)
		if tc.accept && err != nil {
			t.Errorf("%s %s@%s: %v, want accepted", tc.ns, tc.repo, tc.digest, err)
		}
		if !tc.accept && !errdefs.IsPermissionDenied(err) {
			t.Errorf("%s %s@%s: %v, want PermissionDenied", tc.ns, tc.repo, tc.digest, err)
		}
	}
	for what, d := range digests {
		err := check(ctx, "team-a", provRepo, d)
		if !errdefs.IsPermissionDenied(err) {
			t.Errorf("forged record (%s): %v, want PermissionDenied", what, err)
		} else if !strings.Contains(err.Error(), "team-a/forged records the digest, but") {
			t.Errorf("forged record (%s): %v, want the reason it was turned down", what, err)
		}
		// The same record seen from a namespace that may not restore
		// team-a's: nothing of team-a in the answer.
		if err := check(ctx, "team-c", provRepo, d); !errdefs.IsPermissionDenied(err) || strings.Contains(err.Error(), "team-a") || strings.Contains(err.Error(), "forged") {
			t.Errorf("forged record (%s) from team-c: %v, want PermissionDenied naming nothing of team-a", what, err)
		}
	}
	if err := check(ctx, "team-c", provRepo, ok); strings.Contains(err.Error(), "team-a") || strings.Contains(err.Error(), "web-ckpt") {
		t.Errorf("refusal to team-c names team-a's record: %v", err)
	}

	rs.fail.Store(true)
	if err := check(ctx, "team-a", provRepo, provDigest('1')); !errdefs.IsUnavailable(err) {
		t.Fatalf("API server failing: want Unavailable, got %v", err)
	}
	notReady := newProvenance(restConn{ready: make(chan struct{}), cfg: &rest.Config{Host: rs.srv.URL}}, func(ns string) []string { return []string{ns} })
	if err := notReady.check(ctx, "team-a", provRepo, ok); !errdefs.IsUnavailable(err) {
		t.Fatalf("connection not ready: want Unavailable, got %v", err)
	}
}

// Answers are kept provenanceTTL, refusals too, so a kubelet retrying a
// refused pod does not LIST each time; an Unavailable one is not kept;
// concurrent checks of one key share one LIST; the answers kept are bounded.
func TestProvenanceCache(t *testing.T) {
	rs := newRecordServer(t)
	ok := provDigest('a')
	rs.add(exportRecordOf("team-a", "web-ckpt", "node-1", ok))
	p := rs.provenance()
	now := time.Now()
	var clock sync.Mutex
	p.now = func() time.Time { clock.Lock(); defer clock.Unlock(); return now }
	advance := func(d time.Duration) { clock.Lock(); now = now.Add(d); clock.Unlock() }
	ctx := context.Background()

	for range 5 {
		if err := p.check(ctx, "team-a", provRepo, ok); err != nil {
			t.Fatal(err)
		}
		if err := p.check(ctx, "team-a", provRepo, provDigest('b')); !errdefs.IsPermissionDenied(err) {
			t.Fatal(err)
		}
	}
	if n := rs.lists.Load(); n != 2 {
		t.Errorf("%d LISTs for 5 checks each of an accepted and a refused digest, want 2", n)
	}
	advance(provenanceTTL)
	_ = p.check(ctx, "team-a", provRepo, ok)
	if n := rs.lists.Load(); n != 3 {
		t.Errorf("%d LISTs after the answer's TTL, want 3", n)
	}

	rs.fail.Store(true)
	for range 2 {
		if err := p.check(ctx, "team-a", provRepo, provDigest('c')); !errdefs.IsUnavailable(err) {
			t.Fatal(err)
		}
	}
	if n := rs.lists.Load(); n != 5 {
		t.Errorf("%d LISTs, want 5: an Unavailable answer is not kept", n)
	}
	rs.fail.Store(false)

	hold := make(chan struct{})
	rs.mu.Lock()
	rs.hold = hold
	rs.mu.Unlock()
	before := rs.lists.Load()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = p.check(ctx, "team-a", provRepo, provDigest('d')) }()
	}
	waitFor(t, "the shared LIST", func() bool { return rs.lists.Load() > before })
	waitFor(t, "the other checks joining it", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.pending) == 1
	})
	time.Sleep(50 * time.Millisecond) // the goroutines past the lock
	close(hold)
	wg.Wait()
	if n := rs.lists.Load() - before; n != 1 {
		t.Errorf("%d LISTs for 8 concurrent checks of one key, want 1", n)
	}
	for _, err := range errs {
		if !errdefs.IsPermissionDenied(err) {
			t.Errorf("a concurrent check: %v", err)
		}
	}

	// A caller that gives up does not end the shared look-up, whose
	// answer the next check gets.
	hold = make(chan struct{})
	rs.mu.Lock()
	rs.hold = hold
	rs.mu.Unlock()
	short, cancel := context.WithCancel(ctx)
	cancel()
	before = rs.lists.Load()
	if err := p.check(short, "team-a", provRepo, provDigest('e')); !errdefs.IsUnavailable(err) {
		t.Errorf("a cancelled caller: %v, want Unavailable", err)
	}
	waitFor(t, "the look-up's LIST", func() bool { return rs.lists.Load() > before })
	close(hold)
	rs.mu.Lock()
	rs.hold = nil
	rs.mu.Unlock()
	before = rs.lists.Load()
	if err := p.check(ctx, "team-a", provRepo, provDigest('e')); !errdefs.IsPermissionDenied(err) || rs.lists.Load() != before {
		t.Errorf("after a cancelled caller: %v, %d more LISTs, want the look-up's answer and none", err, rs.lists.Load()-before)
	}

	for i := range maxProvenanceAnswers + 10 {
		p.mu.Lock()
		p.answers[string(rune(i))] = provenanceAnswer{at: now}
		p.mu.Unlock()
	}
	_ = p.check(ctx, "team-a", provRepo, provDigest('f'))
	p.mu.Lock()
	n := len(p.answers)
	p.mu.Unlock()
	if n > maxProvenanceAnswers {
		t.Errorf("%d answers kept, at most %d", n, maxProvenanceAnswers)
	}
}
