package fakeruntime_test

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
)

func TestSandboxStopAndRemove(t *testing.T) {
	rt := fakeruntime.Start(t)
	sb := runPod(t, rt, nil)
	host := runPod(t, rt, &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "h", Namespace: "ns", Uid: "u2"},
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}}})
	if s := sbstatus(t, rt, sb); s.State != runtimeapi.PodSandboxState_SANDBOX_READY || s.Network.Ip == "" || s.CreatedAt == 0 {
		t.Fatalf("new sandbox: %v", s)
	}
	if s := sbstatus(t, rt, host); s.Network.Ip != "" {
		t.Fatalf("a sandbox on the node's network has IP %q", s.Network.Ip)
	}
	_, err := rt.Client().RunPodSandbox(ctxT(t), &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{Metadata: podMeta}})
	wantErr(t, err, codes.FailedPrecondition, `failed to reserve sandbox name "p_ns_u1_0": name "p_ns_u1_0" is reserved for "`+sb+`"`)
	id := create(t, rt, sb, "main", 0)
	start(t, rt, id)
	if _, err := rt.Client().StopPodSandbox(ctxT(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb}); err != nil {
		t.Fatal(err)
	}
	if s := sbstatus(t, rt, sb); s.State != runtimeapi.PodSandboxState_SANDBOX_NOTREADY || s.Network.Ip != "" {
		t.Fatalf("stopped sandbox: %v", s)
	}
	if s := cstatus(t, rt, id); s.ExitCode != 137 {
		t.Fatalf("container of a stopped sandbox: %v", s)
	}
	if _, err := rt.Client().RemovePodSandbox(ctxT(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb}); err != nil {
		t.Fatal(err)
	}
	_, err = rt.Client().PodSandboxStatus(ctxT(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb})
	wantErr(t, err, codes.NotFound, "an error occurred when try to find sandbox: not found")
	if _, _, ok := rt.Container(id); ok {
		t.Fatal("a removed sandbox's container remains")
	}
	for _, call := range []func() error{
		func() error {
			_, err := rt.Client().StopPodSandbox(ctxT(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb})
			return err
		},
		func() error {
			_, err := rt.Client().RemovePodSandbox(ctxT(t), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb})
			return err
		},
	} {
		if err := call(); err != nil {
			t.Fatalf("stop or remove of a removed sandbox: %v", err)
		}
	}
	runPod(t, rt, nil) // the name is free again
}

func TestListFilters(t *testing.T) {
	rt := fakeruntime.Start(t)
	sb1 := runPod(t, rt, nil)
	sb2 := runPod(t, rt, &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "q", Namespace: "ns", Uid: "u2"},
		Labels: map[string]string{"app": "b"}})
	a, b := create(t, rt, sb1, "a", 0), create(t, rt, sb1, "b", 0)
	start(t, rt, a)
	resp, err := rt.Client().CreateContainer(ctxT(t), &runtimeapi.CreateContainerRequest{PodSandboxId: sb2,
		Config: &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "a"}, Image: &runtimeapi.ImageSpec{Image: busybox},
			Labels: map[string]string{"c": "a"}},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "q", Namespace: "ns", Uid: "u2"}}})
	if err != nil {
		t.Fatal(err)
	}
	c := resp.ContainerId
	running := &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING}
	for name, tc := range map[string]struct {
		f    *runtimeapi.ContainerFilter
		want []string
	}{
		"none":         {nil, []string{a, b, c}},
		"id":           {&runtimeapi.ContainerFilter{Id: b}, []string{b}},
		"id prefix":    {&runtimeapi.ContainerFilter{Id: b[:12]}, []string{b}},
		"sandbox":      {&runtimeapi.ContainerFilter{PodSandboxId: sb2}, []string{c}},
		"state":        {&runtimeapi.ContainerFilter{State: running}, []string{a}},
		"labels":       {&runtimeapi.ContainerFilter{LabelSelector: map[string]string{"c": "a"}}, []string{a, c}},
		"all of them":  {&runtimeapi.ContainerFilter{PodSandboxId: sb1, LabelSelector: map[string]string{"c": "a"}, State: running}, []string{a}},
		"unknown id":   {&runtimeapi.ContainerFilter{Id: "nope"}, nil},
		"label absent": {&runtimeapi.ContainerFilter{LabelSelector: map[string]string{"x": ""}}, nil},
	} {
		got, err := rt.Client().ListContainers(ctxT(t), &runtimeapi.ListContainersRequest{Filter: tc.f})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, c := range got.Containers {
			ids = append(ids, c.Id)
		}
		if !slices.Equal(ids, tc.want) {
			t.Errorf("%s: got %v, want %v", name, ids, tc.want)
		}
	}
	if _, err := rt.Client().StopPodSandbox(ctxT(t), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb2}); err != nil {
		t.Fatal(err)
	}
	ready := &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY}
	for name, tc := range map[string]struct {
		f    *runtimeapi.PodSandboxFilter
		want []string
	}{
		"none":      {nil, []string{sb1, sb2}},
		"id prefix": {&runtimeapi.PodSandboxFilter{Id: sb2[:10]}, []string{sb2}},
		"state":     {&runtimeapi.PodSandboxFilter{State: ready}, []string{sb1}},
		"labels":    {&runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"app": "b"}}, []string{sb2}},
	} {
		got, err := rt.Client().ListPodSandbox(ctxT(t), &runtimeapi.ListPodSandboxRequest{Filter: tc.f})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, s := range got.Items {
			ids = append(ids, s.Id)
		}
		if !slices.Equal(ids, tc.want) {
			t.Errorf("sandboxes %s: got %v, want %v", name, ids, tc.want)
		}
	}
}
