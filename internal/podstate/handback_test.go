package podstate

import (
	"context"
	"fmt"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// kubeletView is one container instance as the kubelet reads it: listed
// through the view, its status read through the view.
type kubeletView struct {
	id, name string
	state    runtimeapi.ContainerState
	exitCode int32
	created  int64
	attempt  uint32
}

// kubeletRead reads pod sb as the kubelet's PLEG does: a list, then the
// status of every listed container (all of the pod's are in sb).
func kubeletRead(k kubelet) []kubeletView {
	var out []kubeletView
	for id := range k.list() {
		s := k.status(id)
		out = append(out, kubeletView{id: id, name: s.GetMetadata().GetName(), state: s.State, exitCode: s.ExitCode,
			created: s.CreatedAt, attempt: s.GetMetadata().GetAttempt()})
	}
	return out
}

// newestOf is the kubelet's FindContainerStatusByName (and, v1.37,
// FindActiveContainerStatusByName): the newest instance of name.
func newestOf(vs []kubeletView, name string) *kubeletView {
	var n *kubeletView
	for i := range vs {
		v := &vs[i]
		if v.name == name && (n == nil || v.created > n.created || (v.created == n.created && v.attempt > n.attempt)) {
			n = v
		}
	}
	return n
}

// podSpec names a pod's init containers (restartable: a sidecar) and
// regular containers, in order.
type podSpec struct {
	inits []struct {
		name        string
		restartable bool
	}
	regular []string
}

// setupSpec is the pod of setup: init, sidecar, main.
var setupSpec = podSpec{inits: []struct {
	name        string
	restartable bool
}{{"init", false}, {"sidecar", true}}, regular: []string{"main"}}

// kubeletStarts is what a kubelet starts next for a pod of spec
// (restartPolicy Always), from what it reads: computeInitContainerActions and the regular
// containers' part of computePodActions in pkg/kubelet/kuberuntime, for the
// exited and running states, v1.36.3 or v1.37.2. They differ in one thing:
// v1.36.3 takes the pod for initialized when the newest instance of a
// regular container is created or running, v1.37.2 when any instance of a
// regular container of the current sandbox is listed, exited too
// (kubecontainer.HasAnyActiveRegularContainerStarted).
func kubeletStarts(vs []kubeletView, spec podSpec, v137 bool) []string {
	inits, regular := spec.inits, spec.regular
	initialized := false
	for _, r := range regular {
		if v137 {
			initialized = initialized || newestOf(vs, r) != nil
		} else if n := newestOf(vs, r); n != nil && (n.state == runtimeapi.ContainerState_CONTAINER_RUNNING || n.state == runtimeapi.ContainerState_CONTAINER_CREATED) {
			initialized = true
		}
	}
	var start []string
	prev := initialized
	for i := len(inits) - 1; i >= 0; i-- {
		c := inits[i]
		s := newestOf(vs, c.name)
		if s == nil {
			if prev && c.restartable {
				start = append([]string{c.name}, start...)
			}
			continue
		}
		if prev && !c.restartable {
			continue
		}
		switch s.state {
		case runtimeapi.ContainerState_CONTAINER_RUNNING:
			if c.restartable {
				if i == len(inits)-1 {
					initialized = true
				} else if !prev {
					start = append([]string{inits[i+1].name}, start...)
				}
			}
		case runtimeapi.ContainerState_CONTAINER_EXITED:
			switch {
			case c.restartable, s.exitCode != 0: // Always: a failed init container is retried
				start = append([]string{c.name}, start...)
			case i == len(inits)-1:
				initialized = true
			default:
				start = append([]string{inits[i+1].name}, start...)
			}
		}
		prev = true
	}
	if !prev {
		start = append([]string{inits[0].name}, start...)
	}
	if !initialized {
		return start
	}
	for _, r := range regular {
		if n := newestOf(vs, r); n == nil || n.state != runtimeapi.ContainerState_CONTAINER_RUNNING {
			start = append(start, r)
		}
	}
	return start
}

// An init container that fails in the shim's replay is handed back: both
// kubelets must retry that init container, not start the sidecar or main
// past it. Before the old sidecar and main instances were hidden, kubelet
// v1.37.2 (TestInitFailsAfterRestart/Always on the real stack) started main
// at once, the exited old main counting as "initialized", and either kubelet
// restarted the exited old sidecar instead of the init container.
func TestHandedBackInitIsRetriedByTheKubelet(t *testing.T) {
	k, sb, ids := setup(t, t.TempDir())
	k.rt.ExitOnStart("init", 1)
	k.exit(ids["main"], 88)
	k.status(ids["main"])
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	p := k.m.pods.Get(sb)
	if p.Phase != restartrecord.PhaseRunning || fmt.Sprint(k.created()[3:]) != "[init]" {
		t.Fatalf("phase %s, replayed %v; want Running after replaying init only", p.Phase, k.created()[3:])
	}
	check := func(when, want string) {
		t.Helper()
		vs := kubeletRead(k)
		for _, v137 := range []bool{false, true} {
			if got := fmt.Sprint(kubeletStarts(vs, setupSpec, v137)); got != want {
				t.Errorf("%s: kubelet (v1.37: %v) starts %s, want %s; it reads %+v", when, v137, got, want, vs)
			}
		}
	}
	check("after the hand-back", "[init]")
	if st := k.list(); len(st) != 2 {
		t.Fatalf("listed %v; want the two init instances only", st)
	}

	// The kubelet retries init (it succeeds), then starts the sidecar: the
	// sidecar's old instance is shown again, as the previous one.
	k.rt.ExitOnStart("init", 0)
	k.start(sb, "init")
	check("after init succeeded", "[sidecar]")
	k.start(sb, "sidecar")
	if st := k.list(); st[ids["sidecar"]] != runtimeapi.ContainerState_CONTAINER_EXITED {
		t.Fatalf("old sidecar once the kubelet created the sidecar: %v", st[ids["sidecar"]])
	}
	check("sidecar up", "[main]")
	newMain := k.start(sb, "main")
	if st := k.list(); st[ids["main"]] != runtimeapi.ContainerState_CONTAINER_EXITED || st[newMain] != runtimeapi.ContainerState_CONTAINER_RUNNING {
		t.Fatalf("main once the kubelet created it: old %v, new %v", st[ids["main"]], st[newMain])
	}
	check("pod up", "[]")

	// Recorded: a shim restarted keeps nothing hidden now.
	for id, in := range p.Instances {
		if in.Hidden {
			t.Errorf("instance %s (%s) still hidden", id, in.Name)
		}
	}
}

// What is hidden is recorded: a shim restarted after the hand-back keeps
// the old main and sidecar from the kubelet.
func TestHandedBackHiddenSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	k, sb, ids := setup(t, dir)
	k.rt.ExitOnStart("init", 1)
	k.exit(ids["main"], 88)
	k.status(ids["main"])
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	k2 := k.restarted(dir)
	st := k2.list()
	if _, ok := st[ids["main"]]; ok {
		t.Fatalf("old main listed after a restart of the shim: %v", st)
	}
	if _, ok := st[ids["sidecar"]]; ok {
		t.Fatalf("old sidecar listed after a restart of the shim: %v", st)
	}
}

// The pod of TestInitFailsAfterRestart/Always (test/e2e): init, then main,
// which exits 88 once; init fails in the replay. Kubelet v1.36.3 retried
// init; v1.37.2 started main at once (init ran twice, not three times),
// taking the old main, exited but listed in the sandbox, for a sign the pod
// was initialized.
func TestHandedBackInitWithoutSidecar(t *testing.T) {
	k := newKubelet(t, t.TempDir())
	sb := k.runPod(map[string]string{podspec.RestartRulesPrefix + "main": rules88})
	init0 := k.start(sb, "init")
	k.list() // its first run is listed running (held at the swap: see the report)
	k.exit(init0, 0)
	main0 := k.start(sb, "main")
	k.rt.ExitOnStart("init", 1)
	k.exit(main0, 88)
	k.status(main0)
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	spec := podSpec{inits: []struct {
		name        string
		restartable bool
	}{{"init", false}}, regular: []string{"main"}}
	vs := kubeletRead(k)
	for _, v137 := range []bool{false, true} {
		if got := fmt.Sprint(kubeletStarts(vs, spec, v137)); got != "[init]" {
			t.Errorf("kubelet (v1.37: %v) starts %s after the hand-back, want [init]; it reads %+v", v137, got, vs)
		}
	}
	k.rt.ExitOnStart("init", 0)
	k.start(sb, "init")
	if got := fmt.Sprint(kubeletStarts(kubeletRead(k), spec, true)); got != "[main]" {
		t.Errorf("after init succeeded the kubelet starts %s, want [main]", got)
	}
}
