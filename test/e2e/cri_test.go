package e2e

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
)

// critest results are compared spec by spec: every spec has the same result
// through the shim as against containerd directly, every spec but the pinned
// few this test bed cannot run (testdata/critest-not-run.txt) runs both ways
// and passes, so a spec that stops running or starts failing fails the test.
// The direct run depends only on the runtime's versions and the node's
// config, so it is cached per those (critestBaseline); the long tier runs it
// every time, with the pinned specs too.
func TestCritestThroughShimMatchesDirect(t *testing.T) {
	needNode(t)
	// critest's pods are orphans to a kubelet, which would kill them mid-spec:
	// critest runs with no kubelet on the node, whatever ran before it.
	pauseKubelet(t)
	prefix := startRegistry(t)
	// critest's logs and JUnit reports (each spec's time) are kept for a
	// failed or slow run: _output/critest/ (per lane).
	dir := filepath.Join(node.repo, "_output", "critest"+laneSuffix())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(name, sock string, filter ...string) map[string]string {
		report := filepath.Join(dir, name+".xml")
		args := append([]string{
			"--runtime-endpoint", "unix://" + sock, "--image-endpoint", "unix://" + sock,
			"--registry-prefix", prefix,
			"--ginkgo.junit-report", report, "--ginkgo.no-color",
		}, filter...)
		start := time.Now()
		out, _ := exec.Command(bin("critest"), args...).CombinedOutput() // a failing spec is data here
		_ = os.WriteFile(filepath.Join(dir, name+".log"), out, 0o644)
		res := readJUnit(t, report)
		t.Logf("critest %s: %s in %v", name, summarize(res), time.Since(start).Round(time.Millisecond))
		return res
	}
	// critest listens on fixed host ports (its port forward spec on
	// 127.0.0.1:12001, its host port mapping): one critest at a time on the
	// machine, whatever lane it runs in.
	unlock := machineLock(t, "critest")
	defer unlock()
	notRun := critestNotRun(t)
	// Benchmarks are not conformance.
	skip := []string{"--ginkgo.skip", "benchmark" + specsRegexp(notRun)}
	direct, from := critestBaseline(t, skip, func() map[string]string {
		return run("direct", node.env["CONTAINERD_SOCK"], skip...)
	})
	shim := run("shim", node.env["SHIM_SOCK"], skip...)

	if failed := withStatus(direct, "failed"); len(failed) > 0 {
		t.Errorf("%d specs failed against containerd directly (%s): the node is broken, or a spec to pin in testdata/critest-not-run.txt with its reason:\n  %s",
			len(failed), from, strings.Join(failed, "\n  "))
	}
	var diffs []string
	for spec, st := range direct {
		if shim[spec] != st {
			diffs = append(diffs, fmt.Sprintf("%s: directly %s, through the shim %q", spec, st, shim[spec]))
		}
	}
	for spec, st := range shim {
		if _, ok := direct[spec]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: through the shim %s, not in the direct run", spec, st))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		t.Errorf("%d specs differ between containerd and the shim:\n  %s", len(diffs), strings.Join(diffs, "\n  "))
	}
	for spec := range notRun {
		if st, ok := direct["[It] "+spec]; !ok || st != "skipped" {
			t.Errorf("pinned spec %q: %q in the direct run, want skipped (is it still critest's?)", spec, st)
		}
	}
	if longTier() {
		// The pinned specs, against containerd: each must still fail here.
		pinned := run("direct-pinned", node.env["CONTAINERD_SOCK"], "--ginkgo.focus", strings.TrimPrefix(specsRegexp(notRun), "|"))
		for spec := range notRun {
			if st := pinned["[It] "+spec]; st != "failed" {
				t.Errorf("pinned spec %q %s against containerd: unpin it from testdata/critest-not-run.txt", spec, st)
			}
		}
	}
	resultsLine := fmt.Sprintf("critest v1.34.0: direct (%s) %s; through cri-shim %s; %d pinned as not runnable here\n",
		from, summarize(direct), summarize(shim), len(notRun))
	_ = os.WriteFile(filepath.Join(dir, "summary.txt"), []byte(resultsLine), 0o644)
	t.Log(resultsLine)
}

type junitSuites struct {
	Suites []struct {
		Cases []struct {
			Name   string `xml:"name,attr"`
			Status string `xml:"status,attr"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func readJUnit(t testing.TB, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("critest wrote no report: %v", err)
	}
	var js junitSuites
	if err := xml.Unmarshal(b, &js); err != nil {
		t.Fatalf("critest report %s: %v", path, err)
	}
	res := map[string]string{}
	for _, s := range js.Suites {
		for _, c := range s.Cases {
			if strings.HasPrefix(c.Name, "[It]") {
				res[c.Name] = c.Status
			}
		}
	}
	if len(res) == 0 {
		t.Fatalf("critest report %s lists no specs", path)
	}
	return res
}

// specsRegexp is "|spec|spec..." of specs, for ginkgo's skip or focus: each
// quoted, in a stable order.
func specsRegexp(specs map[string]bool) string {
	var names []string
	for spec := range specs {
		names = append(names, regexp.QuoteMeta(spec))
	}
	sort.Strings(names)
	if len(names) == 0 {
		return ""
	}
	return "|" + strings.Join(names, "|")
}

// withStatus is the sorted specs of res with status st.
func withStatus(res map[string]string, st string) []string {
	var out []string
	for spec, s := range res {
		if s == st {
			out = append(out, spec)
		}
	}
	sort.Strings(out)
	return out
}

func countStatus(res map[string]string, st string) int { return len(withStatus(res, st)) }

func summarize(res map[string]string) string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped", countStatus(res, "passed"), countStatus(res, "failed"), countStatus(res, "skipped"))
}

func TestCrictlThroughShim(t *testing.T) {
	needNode(t)
	pauseKubelet(t) // a kubelet kills the pods it does not know
	sock := node.env["SHIM_SOCK"]
	dir := t.TempDir()
	podCfg := filepath.Join(dir, "pod.json")
	ctrCfg := filepath.Join(dir, "ctr.json")
	writeJSON(t, podCfg, map[string]any{
		"metadata":      map[string]any{"name": "crictl-e2e", "namespace": "e2e", "uid": "crictl-e2e-uid", "attempt": 0},
		"log_directory": filepath.Join(dir, "logs"),
		"linux":         map[string]any{},
	})
	writeJSON(t, ctrCfg, map[string]any{
		"metadata":    map[string]any{"name": "ticker"},
		"image":       map[string]any{"image": "docker.io/library/busybox:cri-shim"},
		"command":     []string{"sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done"},
		"log_path":    "ticker.log",
		"annotations": map[string]string{"e2e": "crictl"},
		"linux":       map[string]any{},
	})
	pod := strings.TrimSpace(mustCrictl(t, sock, "runp", podCfg))
	t.Cleanup(func() { _, _ = crictl(t, sock, "rmp", "-f", pod) })
	ctr := strings.TrimSpace(mustCrictl(t, sock, "create", pod, ctrCfg, podCfg))
	mustCrictl(t, sock, "start", ctr)

	if out := mustCrictl(t, sock, "ps", "-q"); !strings.Contains(out, ctr) {
		t.Fatalf("ps does not list %s: %q", ctr, out)
	}
	if out := mustCrictl(t, sock, "pods", "-q"); !strings.Contains(out, pod) {
		t.Fatalf("pods does not list %s: %q", pod, out)
	}
	var insp struct {
		Status struct {
			State string `json:"state"`
		} `json:"status"`
	}
	mustUnmarshal(t, mustCrictl(t, sock, "inspect", ctr), &insp)
	if insp.Status.State != "CONTAINER_RUNNING" {
		t.Fatalf("inspect: state %q", insp.Status.State)
	}
	mustUnmarshal(t, mustCrictl(t, sock, "inspectp", pod), &insp)
	if insp.Status.State != "SANDBOX_READY" {
		t.Fatalf("inspectp: state %q", insp.Status.State)
	}
	// exec goes through CRI Exec (a streaming URL from containerd); exec -s through ExecSync.
	if out := mustCrictl(t, sock, "exec", ctr, "echo", "hello-exec"); strings.TrimSpace(out) != "hello-exec" {
		t.Fatalf("exec: %q", out)
	}
	if out := mustCrictl(t, sock, "exec", "-s", ctr, "echo", "hello-sync"); strings.TrimSpace(out) != "hello-sync" {
		t.Fatalf("exec -s: %q", out)
	}
	eventually(t, 10*time.Second, "container logs", func() error {
		out, err := crictl(t, sock, "logs", ctr)
		if err != nil {
			return err
		}
		if !strings.Contains(out, "tick 1") {
			return fmt.Errorf("logs: %q", out)
		}
		return nil
	})
	eventually(t, 20*time.Second, "container stats", func() error {
		out, err := crictl(t, sock, "stats", "-o", "json", "--id", ctr)
		if err != nil {
			return err
		}
		if !strings.Contains(out, ctr) {
			return fmt.Errorf("stats has no %s: %q", ctr, out)
		}
		return nil
	})
	if out := mustCrictl(t, sock, "images"); !strings.Contains(out, "docker.io/library/busybox") {
		t.Fatalf("images: %q", out)
	}
	mustCrictl(t, sock, "stop", ctr)
	mustUnmarshal(t, mustCrictl(t, sock, "inspect", ctr), &insp)
	if insp.Status.State != "CONTAINER_EXITED" {
		t.Fatalf("after stop: state %q", insp.Status.State)
	}
	mustCrictl(t, sock, "rm", ctr)
	if out := mustCrictl(t, sock, "ps", "-a", "-q"); strings.Contains(out, ctr) {
		t.Fatalf("rm left %s", ctr)
	}
	mustCrictl(t, sock, "stopp", pod)
	mustCrictl(t, sock, "rmp", pod)
	// Stop/Remove of what is gone: containerd's answer, whatever it is, must come through as is.
	_, derr := crictl(t, node.env["CONTAINERD_SOCK"], "inspectp", pod)
	_, serr := crictl(t, sock, "inspectp", pod)
	if (derr == nil) != (serr == nil) {
		t.Fatalf("inspectp of a removed pod: direct %v, shim %v", derr, serr)
	}
}

// A method this build's cri-api does not know is answered by containerd, not the shim.
func TestUnknownMethodsAnsweredByContainerd(t *testing.T) {
	needNode(t)
	direct := dial(t, node.env["CONTAINERD_SOCK"])
	shim := dial(t, node.env["SHIM_SOCK"])
	for _, m := range []string{
		"/runtime.v1.RuntimeService/SomeFutureMethod", // not in any cri-api
		"/runtime.v1.ImageService/SomeFutureMethod",
		"/runtime.v1alpha2.RuntimeService/Version", // a service containerd 2 dropped
		// (CheckpointPod, in our cri-api and not in containerd 2.2's, is served
		// by the shim itself: see checkpoint_test.go.)
	} {
		ctx := ctxT(t, 10*time.Second)
		derr := direct.Invoke(ctx, m, &emptypb.Empty{}, &emptypb.Empty{})
		serr := shim.Invoke(ctx, m, &emptypb.Empty{}, &emptypb.Empty{})
		if derr == nil {
			t.Fatalf("%s: containerd answered OK; pick a method it does not know", m)
		}
		ds, ss := status.Convert(derr).Proto(), status.Convert(serr).Proto()
		if !proto.Equal(ds, ss) {
			t.Errorf("%s:\n  containerd: %v\n  shim:       %v", m, ds, ss)
		}
		if status.Code(serr) != codes.Unimplemented {
			t.Errorf("%s: through shim %v, want containerd's Unimplemented", m, serr)
		}
		t.Logf("%s -> %s", m, status.Convert(serr).Message())
	}
}

func writeJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustUnmarshal(t testing.TB, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatalf("%v: %q", err, s)
	}
}
