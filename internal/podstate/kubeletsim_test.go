package podstate

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// TestCrashLoopNeverShowsTerminatedThenRunning plays the kubelet's pod reads
// against a restartPolicy Never pod whose container crashes at once, every
// time, while its restarts run concurrently: a full relist, then the status
// of each listed instance; the container's state is its newest instance's.
// The kubelet refuses a status in which a container it published terminated
// is no longer terminated (status_manager.go, checkContainerStateTransition).
func TestCrashLoopNeverShowsTerminatedThenRunning(t *testing.T) {
	rt := newFakeRT()
	k := kubelet{t: t, m: newTestManager(t, rt, t.TempDir()), rt: rt}
	sb := k.runPod(map[string]string{RulesAnnotationPrefix + "main": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
	first := k.start(sb, "main")
	rt.mu.Lock()
	rt.exitOnStart["main"] = 1
	rt.mu.Unlock()
	rt.exit(first, 1)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the restart executor
		defer wg.Done()
		for ctx.Err() == nil {
			if err := k.m.execute(ctx, sb); err != nil && ctx.Err() == nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	terminated, reads, restarts := false, 0, 0
	for ctx.Err() == nil {
		state, ok := k.podRead(ctx)
		if !ok {
			continue
		}
		reads++
		if terminated && state != runtimeapi.ContainerState_CONTAINER_EXITED {
			t.Fatalf("read %d: main published terminated, now %v", reads, state)
		}
		terminated = state == runtimeapi.ContainerState_CONTAINER_EXITED
	}
	cancel()
	wg.Wait()
	k.m.mu.Lock()
	restarts = k.m.pods[sb].ContainerRestarts["main"]
	k.m.mu.Unlock()
	t.Logf("%d restarts, %d pod reads", restarts, reads)
	if restarts < 10 || reads < 10 {
		t.Fatalf("%d restarts, %d reads: too few to tell", restarts, reads)
	}
	if terminated {
		t.Fatal("main ended terminated although its rule restarts it")
	}
}

// podRead is one pod read of the kubelet: a full relist, then the status of
// each instance it listed; it returns the state of the newest instance.
func (k kubelet) podRead(ctx context.Context) (runtimeapi.ContainerState, bool) {
	req, _ := proto.Marshal(&runtimeapi.ListContainersRequest{})
	out, err := k.m.ListContainersBytes(ctx, req, func(ctx context.Context, _ []byte) ([]byte, error) {
		resp, err := k.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
		if err != nil {
			return nil, err
		}
		return proto.Marshal(resp)
	})
	if err != nil {
		return 0, false
	}
	var l runtimeapi.ListContainersResponse
	if err := proto.Unmarshal(out, &l); err != nil {
		k.t.Fatal(err)
	}
	var newest *runtimeapi.ContainerStatus
	for _, c := range l.Containers {
		s, err := k.tryStatus(c.Id)
		if err != nil || s == nil {
			continue // removed meanwhile, as the kubelet skips NotFound
		}
		if newest == nil || s.CreatedAt > newest.CreatedAt {
			newest = s
		}
	}
	if newest == nil {
		return 0, false
	}
	return newest.State, true
}
