package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"

	"github.com/cri-shim/cri-shim/internal/layout"
	"github.com/cri-shim/cri-shim/internal/podspec"
)

// fakeShim answers the CRI calls the CLI makes, on a unix socket: one ready
// sandbox with one running container, and a CheckpointPod that writes a
// manifest after delay.
type fakeShim struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	delay time.Duration
}

func (f *fakeShim) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "fake"}, nil
}

func (f *fakeShim) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	return &runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{{Id: "sb-1"}}}, nil
}

func (f *fakeShim) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	return &runtimeapi.ListContainersResponse{Containers: []*runtimeapi.Container{{Id: "c-1", Metadata: &runtimeapi.ContainerMetadata{Name: "app"}}}}, nil
}

func (f *fakeShim) CheckpointPod(_ context.Context, req *runtimeapi.CheckpointPodRequest) (*runtimeapi.CheckpointPodResponse, error) {
	time.Sleep(f.delay)
	writeManifest(nil, req.OutputPath, "web", time.Now())
	return &runtimeapi.CheckpointPodResponse{}, nil
}

// serveOn serves srv (nil: a gRPC server without the CRI runtime service) on
// a unix socket in dir.
func serveOn(t *testing.T, dir string, srv runtimeapi.RuntimeServiceServer) string {
	t.Helper()
	sock := filepath.Join(dir, "shim.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	if srv != nil {
		runtimeapi.RegisterRuntimeServiceServer(s, srv)
	}
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return sock
}

// nodeConfig writes a config whose state and checkpoints are under dir.
func nodeConfig(t *testing.T, dir, listen string) string {
	t.Helper()
	body := fmt.Sprintf("state_dir = %q\n[server]\nlisten = %q\n[runtime]\nendpoint = %q\n[checkpoint]\nroot = %q\n[backoff]\ninitial_delay = \"2s\"\n",
		filepath.Join(dir, "state"), listen, filepath.Join(dir, "containerd.sock"), filepath.Join(dir, "checkpoints"))
	p := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeManifest writes a valid manifest of two containers into dir (t nil:
// called from the fake's handler, where the CLI's check of it reports).
func writeManifest(t *testing.T, dir, pod string, at time.Time) {
	m := layout.Manifest{FormatVersion: layout.Version, CheckpointedAt: at.UTC(), Managed: true, Runtime: "runc", CRIUVersion: "4.1",
		Pod:           layout.PodInfo{Name: pod, Namespace: "default", UID: "uid-" + pod, SandboxID: "sb-1"},
		Containers:    []layout.ContainerEntry{{Name: "sidecar", Archive: "containers/sidecar.tar"}, {Name: "app", Archive: "containers/app.tar"}},
		FrozenSeconds: 0.25, TotalSeconds: 1.5, SizeBytes: 3 << 20}
	b, _ := json.Marshal(m)
	err := os.MkdirAll(dir, 0o700)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "manifest.json"), b, 0o600)
	}
	if err != nil && t != nil {
		t.Fatal(err)
	}
}

// fixtures writes a pod with a problem, an orchestrator channel and two
// checkpoints (one of them unreadable) under dir.
func fixtures(t *testing.T, dir string) {
	t.Helper()
	state := filepath.Join(dir, "state")
	for _, d := range []string{"store/podstate-problems", "store/podmgmt", "store/podmgmt-state"} {
		if err := os.MkdirAll(filepath.Join(state, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	pod := `{"sandboxId":"sb-1","uid":"u1","name":"web","namespace":"default",
		"rules":{"app":[{"action":"RestartAllContainers","exitCodes":{"operator":"In","values":[42]}}]},
		"problems":["annotation x: malformed"],"phase":"TerminatingForRestart","restarts":2,"containerRestarts":{"app":1},
		"trigger":{"container":"app","exitCode":42,"action":"RestartAllContainers","delay":10000000000},
		"notBefore":"` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `"}`
	orch := `{"sandboxId":"sb-2","namespace":"jobs","name":"train","uid":"u2","declaration":{"container":"orch","port":7070,"version":"1.0"}}`
	for p, body := range map[string]string{"store/podstate-problems/sb-1": pod, "store/podmgmt/sb-2": orch, "store/podmgmt-state/sb-2": "connected\n"} {
		if err := os.WriteFile(filepath.Join(state, p), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeManifest(t, filepath.Join(dir, "checkpoints", "cp-web"), "web", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	if err := os.MkdirAll(filepath.Join(dir, "checkpoints", "half-written"), 0o700); err != nil {
		t.Fatal(err)
	}
}

// decode parses JSON or YAML strictly: a key the struct does not have fails.
func decode(format, s string, v any) error {
	if format == "json" {
		d := json.NewDecoder(strings.NewReader(s))
		d.DisallowUnknownFields()
		return d.Decode(v)
	}
	return yaml.UnmarshalStrict([]byte(s), v)
}

// -o json and -o yaml of every listing parse back into the documented
// structs, with the fixtures' values; -o table shows them too.
func TestListingsOutput(t *testing.T) {
	dir := t.TempDir()
	cfg := nodeConfig(t, dir, serveOn(t, dir, &fakeShim{}))
	fixtures(t, dir)
	for _, format := range []string{"json", "yaml"} {
		code, out, stderr := runOut(t, "pods", "-o", format, "--config", cfg)
		var pods podList
		if err := decode(format, out, &pods); code != 0 || err != nil {
			t.Fatalf("pods -o %s: exit %d, %v\n%s%s", format, code, err, out, stderr)
		}
		if len(pods.Pods) != 1 || len(pods.Channels) != 1 {
			t.Fatalf("pods -o %s: %+v", format, pods)
		}
		p := pods.Pods[0]
		if p.Namespace != "default" || p.Name != "web" || p.Restarts != 2 || p.ContainerRestarts["app"] != 1 ||
			len(p.Rules["app"]) != 1 || p.Rules["app"][0].ExitCodes.Values[0] != 42 || p.Problems[0] != "annotation x: malformed" ||
			p.LastTrigger == nil || p.LastTrigger.DelaySeconds != 10 || p.NextRestartAt == nil || p.Phase != "TerminatingForRestart" {
			t.Errorf("pods -o %s: %+v", format, p)
		}
		if c := pods.Channels[0]; c != (channelItem{"jobs", "train", "orch", 7070, "connected"}) {
			t.Errorf("pods -o %s: channel %+v", format, c)
		}

		code, out, stderr = runOut(t, "checkpoints", "-o", format, "--config", cfg)
		var cps checkpointList
		if err := decode(format, out, &cps); code != 0 || err != nil {
			t.Fatalf("checkpoints -o %s: exit %d, %v\n%s%s", format, code, err, out, stderr)
		}
		if len(cps.Checkpoints) != 1 || len(cps.Skipped) != 1 || !strings.Contains(stderr, "skipped: ") {
			t.Fatalf("checkpoints -o %s: %+v, stderr %q", format, cps, stderr)
		}
		c := cps.Checkpoints[0]
		if c.Name != "cp-web" || c.Pod != "web" || strings.Join(c.Containers, ",") != "sidecar,app" || c.SizeBytes != 3<<20 ||
			c.PausedSeconds != 0.25 || !c.Managed || !c.CheckpointedAt.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
			t.Errorf("checkpoints -o %s: %+v", format, c)
		}

		code, out, stderr = runOut(t, "backoff", "-o", format, "--config", cfg)
		var curve backoffCurve
		if err := decode(format, out, &curve); code != 0 || err != nil {
			t.Fatalf("backoff -o %s: exit %d, %v\n%s%s", format, code, err, out, stderr)
		}
		if curve.InitialDelaySeconds != 2 || len(curve.DelaysSeconds) != 10 || curve.DelaysSeconds[1] != 4 || curve.ResetAfterSeconds != 600 {
			t.Errorf("backoff -o %s: %+v", format, curve)
		}
	}
	for args, want := range map[string][]string{
		"pods":        {"POD", "default/web", "app=1", "app exit 42 (RestartAllContainers)", "annotation x: malformed", "jobs/train", "connected"},
		"checkpoints": {"NAME", "cp-web", "default/web", "2026-01-02T03:04:05Z", "3.0 MiB", "sidecar,app", "250ms"},
		"backoff":     {"effective initial delay: 2s", "delays before restarts 1-10: 2s 4s"},
	} {
		code, out, stderr := runOut(t, args, "--config", cfg)
		for _, w := range want {
			if code != 0 || !strings.Contains(out, w) {
				t.Errorf("%s: exit %d, %q lacks %q (%s)", args, code, out, w, stderr)
			}
		}
	}
	// checkpoints works with the shim stopped: it reads directories.
	cfgOff := filepath.Join(dir, "off.toml")
	b, _ := os.ReadFile(cfg)
	os.WriteFile(cfgOff, bytes.Replace(b, []byte(filepath.Join(dir, "shim.sock")), []byte(filepath.Join(dir, "absent.sock")), 1), 0o600)
	if code, out, _ := runOut(t, "checkpoints", "-o", "json", "--config", cfgOff); code != 0 || !strings.Contains(out, "cp-web") ||
		!strings.Contains(out, `"criuVersion": "4.1"`) {
		t.Errorf("checkpoints with the shim stopped: exit %d, %s", code, out)
	}
}

// pods and checkpoint need the running shim: when its socket does not answer
// they say so and exit 1, instead of printing an empty or stale table.
func TestUnreachableShim(t *testing.T) {
	dir := t.TempDir()
	absent := filepath.Join(dir, "absent.sock")
	cfg := nodeConfig(t, dir, absent)
	fixtures(t, dir)
	notCRI := t.TempDir()
	cfgNotCRI := nodeConfig(t, notCRI, serveOn(t, notCRI, nil))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pods", "--config", cfg}, "cri-shim: the shim is not reachable at " + absent + ": connect: no such file or directory (is it running? systemctl status cri-shim)\n"},
		{[]string{"pods", "-o", "json", "--config", cfg}, "cri-shim: the shim is not reachable at " + absent + ": connect: no such file or directory (is it running? systemctl status cri-shim)\n"},
		{[]string{"checkpoint", "--pod", "web", "--config", cfg}, "cri-shim: the shim is not reachable at " + absent + ": connect: no such file or directory (is it running? systemctl status cri-shim)\n"},
		{[]string{"pods", "--config", cfgNotCRI}, "unknown service runtime.v1.RuntimeService (is it running? systemctl status cri-shim)\n"},
	} {
		code, out, stderr := runOut(t, tc.args...)
		if code != 1 || out != "" || !strings.HasSuffix(stderr, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q, want exit 1 and %q", tc.args, code, out, stderr, tc.want)
		}
		checkOnePrefix(t, tc.args, stderr)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "checkpoints")); len(ents) != 2 {
		t.Errorf("checkpoint with the shim unreachable changed the root: %d entries", len(ents))
	}
}

// checkpoint against a shim: off a terminal its progress is plain lines, no
// carriage returns to garble a log.
func TestCheckpointProgressPlainOffTerminal(t *testing.T) {
	defer func(d time.Duration) { plainInterval = d }(plainInterval)
	plainInterval = 20 * time.Millisecond
	dir := t.TempDir()
	cfg := nodeConfig(t, dir, serveOn(t, dir, &fakeShim{delay: 200 * time.Millisecond}))
	code, out, stderr := runOut(t, "checkpoint", "--pod", "web", "--name", "cp-1", "--config", cfg)
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out, stderr)
	}
	if strings.Contains(out, "\r") || strings.Contains(out, "\x1b") {
		t.Errorf("control characters in plain output: %q", out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if !strings.HasPrefix(lines[0], "checkpointing pod default/web (app) into ") || !strings.Contains(out, "elapsed, ") ||
		!strings.HasPrefix(lines[len(lines)-2], "checkpoint cp-1: 2 containers, 3.0 MiB, in ") ||
		lines[len(lines)-1] != `restore with the pod annotation `+podspec.RestoreFromKey+`: "cp-1"` {
		t.Errorf("output:\n%s", out)
	}
}

// On a terminal an update rewrites its line and the next line starts fresh.
func TestProgressOnTerminal(t *testing.T) {
	var b bytes.Buffer
	p := &progress{w: &b, tty: true, interval: 5 * time.Millisecond}
	p.line("start")
	n := 0
	third := make(chan struct{}) // step 2 is written before step 3 is asked for
	stop := p.every(func() string {
		if n++; n == 3 {
			close(third)
		}
		return fmt.Sprintf("step %d", n)
	})
	<-third
	stop()
	p.line("done")
	s := b.String()
	if !strings.HasPrefix(s, "start\n\rstep 1\x1b[K\rstep 2") || !strings.HasSuffix(s, "\x1b[K\ndone\n") {
		t.Errorf("terminal output %q", s)
	}
}
