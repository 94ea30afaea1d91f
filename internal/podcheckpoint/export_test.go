package podcheckpoint

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// fakeExporter answers pushes with errs in turn, then success.
type fakeExporter struct {
	mu    sync.Mutex
	calls []string
	at    []time.Time
	errs  []error
}

func (f *fakeExporter) Export(_ context.Context, ns, pod, uid, secret, image, dir string) (string, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, ns+" "+pod+" "+uid+" "+secret+" "+image+" "+dir)
	f.at = append(f.at, time.Now())
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		return "", "", err
	}
	return "reg.example/cp/web@sha256:abc", "sha256:abc", nil
}

func (f *fakeExporter) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func (e *env) waitExported(t *testing.T, ns, name, reason string) *cpv1.PodCheckpoint {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		pc, err := e.api.Get(context.Background(), ns, name)
		if err == nil {
			if c := meta.FindStatusCondition(pc.Status.Conditions, cpv1.ConditionExported); c != nil && c.Reason == reason {
				return pc
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/%s never Exported %s: %+v", ns, name, reason, pc)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An object with spec.export is pushed once Ready, with its secret and the
// node's data directory; status.export records the reference and digest. A
// failed push is ExportFailed and tried again after exportRetry, then twice
// that; a retry writes the status once (its outcome); an object without
// spec.export is never pushed.
func TestExportOnceReady(t *testing.T) {
	old, oldMax := exportRetry, exportRetryMax
	exportRetry, exportRetryMax = 200*time.Millisecond, time.Second
	t.Cleanup(func() { exportRetry, exportRetryMax = old, oldMax })
	e := newEnv(t)
	x := &fakeExporter{errs: []error{errors.New("registry said 503"), errors.New("registry said 503")}}
	e.r.exporter = x
	e.run(t)
	e.pod("ns", "web", "uid-1")
	e.create(object("ns", "plain", "web"))
	e.waitReason(t, "ns", "plain", cpv1.ReasonCompleted)
	pc := object("ns", "cp", "web")
	pc.Spec.Export = &cpv1.PodCheckpointExport{Image: "reg.example/cp/web:v1", SecretName: "regcred"}
	e.create(pc)
	failed := e.waitExported(t, "ns", "cp", cpv1.ReasonExportFailed)
	if c := meta.FindStatusCondition(failed.Status.Conditions, cpv1.ConditionExported); !strings.HasPrefix(c.Message, "push 1 failed: registry said 503; next push in ") || failed.Status.Export != nil {
		t.Errorf("failed export: %+v, %+v", c, failed.Status.Export)
	}
	done := e.waitExported(t, "ns", "cp", cpv1.ReasonExported)
	if s := done.Status.Export; s == nil || s.Image != "reg.example/cp/web@sha256:abc" || s.Digest != "sha256:abc" || s.CompletionTime == nil {
		t.Fatalf("status.export %+v", s)
	}
	if c := ready(done); c.Status != metav1.ConditionTrue {
		t.Errorf("Ready changed by the export: %+v", c)
	}
	// A push retried after the success would come exportRetry after it.
	// Another object whose first push fails, made now, is pushed again
	// exportRetry after that failure: once it is Exported, such a retry of
	// cp would have come.
	x.mu.Lock()
	x.errs = append(x.errs, errors.New("registry said 503"))
	x.mu.Unlock()
	later := object("ns", "later", "web")
	later.Spec.Export = &cpv1.PodCheckpointExport{Image: "reg.example/cp/web:v2", SecretName: "regcred"}
	e.create(later)
	e.waitExported(t, "ns", "later", cpv1.ReasonExported)
	x.mu.Lock()
	calls, at := slices.Clone(x.calls), slices.Clone(x.at)
	x.mu.Unlock()
	var ofCP []string
	for i, c := range calls {
		switch {
		case strings.HasSuffix(c, "/pcp-obj-cp"):
			ofCP = append(ofCP, c)
		case strings.HasSuffix(c, "/pcp-obj-later"):
		default:
			t.Errorf("push %d %q: of neither object with spec.export", i, c)
		}
	}
	if len(ofCP) != 3 {
		t.Fatalf("%d pushes of cp, want 3 (two failed, each retried after exportRetry): %v", len(ofCP), calls)
	}
	if want := "ns web uid-1 regcred reg.example/cp/web:v1 " + e.root + "/pcp-obj-cp"; ofCP[2] != want {
		t.Errorf("push %q, want %q", ofCP[2], want)
	}
	at = at[:3] // cp's
	for i := 1; i < len(at); i++ {
		// exportDelay(i), jittered down by up to a quarter.
		if gap, min := at[i].Sub(at[i-1]), exportRetry*time.Duration(1<<(i-1))*3/4; gap < min {
			t.Errorf("push %d came %s after the failed one, before its backoff's least %s", i, gap, min)
		}
	}
	e.api.mu.Lock()
	var writes []string
	for _, w := range e.api.statusWrites {
		if name, exp, _ := strings.Cut(w, " "); name == "cp" && exp != "" {
			writes = append(writes, exp)
		}
	}
	e.api.mu.Unlock()
	want := []string{cpv1.ReasonExportInProgress, cpv1.ReasonExportFailed, cpv1.ReasonExportFailed, cpv1.ReasonExported}
	if !slices.Equal(writes, want) {
		t.Errorf("cp's status writes with Exported: %v, want %v (one per retry)", writes, want)
	}
}

// The wait after each failed push doubles from exportRetry up to
// exportRetryMax, less a jitter of at most a quarter.
func TestExportBackoffSchedule(t *testing.T) {
	want := []time.Duration{1, 2, 4, 8, 16, 32, 60, 60, 60}
	for i, m := range want {
		d := m * time.Minute
		for range 50 {
			if got := exportDelay(i + 1); got > d || got < d*3/4 {
				t.Fatalf("wait after failure %d: %s, want within [%s, %s]", i+1, got, d*3/4, d)
			}
		}
	}
	seen := map[time.Duration]bool{}
	for range 50 {
		seen[exportDelay(3)] = true
	}
	if len(seen) < 2 {
		t.Error("the waits are not jittered")
	}
}

// A copy read before a push's outcome was written (the worker read it, then
// the push ended and its outcome was observed) does not start the push
// again: the node decides on the newest copy it holds.
func TestNoPushAgainFromAStaleCopy(t *testing.T) {
	e := newEnv(t)
	e.r.exporter = &fakeExporter{}
	pc := object("ns", "cp", "web")
	pc.Spec.Export = &cpv1.PodCheckpointExport{Image: "reg.example/cp/web:v1"}
	pc.Status.NodeName = "node-a"
	setReady(&pc.Status, metav1.ConditionTrue, cpv1.ReasonCompleted, "", 1, time.Now())
	setCondition(&pc.Status, cpv1.ConditionExported, metav1.ConditionFalse, cpv1.ReasonExportFailed, "registry said 503", 1, time.Now())
	stale := e.create(pc)
	done := stale.DeepCopy()
	setCondition(&done.Status, cpv1.ConditionExported, metav1.ConditionTrue, cpv1.ReasonExported, "pushed", 1, time.Now())
	e.r.Observe(e.api.put(done))
	if ok, _ := e.r.needsExport(stale); ok {
		t.Fatal("a copy read before the push's outcome starts the push again")
	}
}

// Without an exporter (no registries configured) the export fails with why.
func TestExportWithoutRegistries(t *testing.T) {
	e := newEnv(t)
	e.run(t)
	e.pod("ns", "web", "uid-1")
	pc := object("ns", "cp", "web")
	pc.Spec.Export = &cpv1.PodCheckpointExport{Image: "reg.example/cp/web:v1"}
	e.create(pc)
	got := e.waitExported(t, "ns", "cp", cpv1.ReasonExportFailed)
	if c := meta.FindStatusCondition(got.Status.Conditions, cpv1.ConditionExported); !strings.Contains(c.Message, "this node's cri-shim exports to no registry (no [checkpoint] registries)") {
		t.Errorf("Exported %+v", c)
	}
}
