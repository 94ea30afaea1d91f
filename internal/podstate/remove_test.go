package podstate

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
	statestore "github.com/cri-shim/cri-shim/internal/store"
)

// A step that still holds a pod when its sandbox is removed cannot write the
// pod's record again (it would bring back the state of a sandbox that is
// gone), and removals run alongside saves of other pods without a data race
// on the store (run with -race).
func TestRemovedPodIsNotSavedAgain(t *testing.T) {
	dir := t.TempDir()
	k := newKubelet(t, dir)
	ann := map[string]string{podspec.RestartRulesPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`}
	k.runSandbox("sb-gone", ann)
	p := k.m.pods.Get("sb-gone")
	k.removeSandbox("sb-gone")
	k.m.mu.Lock()
	err := k.m.pods.Save(p)
	k.m.mu.Unlock()
	if !errors.Is(err, restartrecord.ErrRemoved) {
		t.Fatalf("save of a removed pod: %v, want restartrecord.ErrRemoved", err)
	}
	if left, _ := filepath.Glob(filepath.Join(recordsDir(dir), "sb-gone*")); len(left) > 0 {
		t.Fatalf("record of the removed sandbox written again: %v", left)
	}

	k.runSandbox("sb-live", ann)
	live := k.m.pods.Get("sb-live")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 200 {
			k.m.mu.Lock()
			_ = k.m.pods.Save(live)
			k.m.mu.Unlock()
		}
	}()
	for i := range 50 {
		sb := "sb-churn-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		k.runSandbox(sb, ann)
		k.removeSandbox(sb)
	}
	wg.Wait()
	if _, err := os.Stat(recordsDir(dir)); err != nil {
		t.Fatal(err)
	}
}

// A sandbox the state store announces gone (a feature's sweep found it
// missing from the runtime) is forgotten by podstate, as the server wires
// it, and its record goes with the store's removal.
func TestStoreGoneForgetsThePod(t *testing.T) {
	dir := t.TempDir()
	k := newKubelet(t, dir)
	st, err := statestore.Open(statestore.RootIn(dir))
	if err != nil {
		t.Fatal(err)
	}
	st.Subscribe(k.m.SandboxGone)
	ann := map[string]string{podspec.RestartRulesPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`}
	sb := k.runPod(ann)
	id := k.start(sb, "main")
	if k.m.Tracked() != 1 {
		t.Fatalf("tracked %d", k.m.Tracked())
	}
	if err := st.Gone(sb); err != nil {
		t.Fatal(err)
	}
	k.m.mu.Lock()
	pod, known := k.m.pods.Get(sb) != nil, k.m.pods.Of(id) != nil || k.m.pods.Indexed() != 0
	k.m.mu.Unlock()
	if pod || known || k.m.Tracked() != 0 {
		t.Fatalf("after Gone: pod %v, container %v, tracked %d", pod, known, k.m.Tracked())
	}
	if left, _ := filepath.Glob(filepath.Join(recordsDir(dir), sb+"*")); len(left) > 0 {
		t.Fatalf("records left after Gone: %v", left)
	}
}

// recordsDir is where the pods' records are under stateDir (restartrecord's
// slot bucket).
func recordsDir(stateDir string) string { return filepath.Join(stateDir, "store", "podstate") }
