package fakeruntime_test

import (
	"context"
	"regexp"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
)

var noProgram = regexp.MustCompile(`^failed to exec in container: failed to start exec "[0-9a-f]{64}": OCI runtime exec failed: exec failed: ` +
	`unable to start container process: exec: "true": executable file not found in \$PATH$`)

// ExecSync runs the program the test gave for the command's first word in
// a RUNNING container only, and answers what it did; a command with no
// program, an unknown or a not running container, and a timeout are
// refused as containerd refuses them.
func TestExecSyncRunsTheTestsPrograms(t *testing.T) {
	rt := fakeruntime.Start(t)
	var ran [][]string
	rt.AddProgram("sh", func(_ context.Context, id string, cmd []string) fakeruntime.ExecResult {
		ran = append(ran, append([]string{id}, cmd...))
		return fakeruntime.ExecResult{Stdout: []byte("out"), Stderr: []byte("err"), ExitCode: 3}
	})
	sb := runPod(t, rt, nil)
	id := create(t, rt, sb, "main", 0)
	exec := func(id string, timeout int64, cmd ...string) (*runtimeapi.ExecSyncResponse, error) {
		return rt.Client().ExecSync(ctxT(t), &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: timeout})
	}
	_, err := exec(id, 0, "sh", "-c", "flush")
	wantErr(t, err, codes.Unknown, "failed to exec in container: container is in CONTAINER_CREATED state")
	start(t, rt, id)
	r, err := exec(id[:12], 0, "sh", "-c", "flush")
	if err != nil || string(r.Stdout) != "out" || string(r.Stderr) != "err" || r.ExitCode != 3 {
		t.Fatalf("exec of a program: %v %v", r, err)
	}
	if len(ran) != 1 || !slices.Equal(ran[0], []string{id, "sh", "-c", "flush"}) {
		t.Fatalf("program ran %v", ran)
	}
	_, err = exec(id, 0, "true")
	if st := status.Convert(err); st.Code() != codes.Unknown || !noProgram.MatchString(st.Message()) {
		t.Fatalf("exec of a command with no program: %v", err)
	}
	_, err = exec("nope", 0, "sh")
	wantErr(t, err, codes.NotFound, `failed to exec in container: failed to find container "nope" in store: not found`)

	// A program that outlives the request's timeout: DeadlineExceeded,
	// and the program's context ends.
	ended := make(chan struct{})
	rt.AddProgram("sleep", func(ctx context.Context, _ string, _ []string) fakeruntime.ExecResult {
		<-ctx.Done()
		close(ended)
		return fakeruntime.ExecResult{}
	})
	_, err = exec(id, 1, "sleep", "60")
	wantErr(t, err, codes.DeadlineExceeded, "failed to exec in container: timeout 1s exceeded: context deadline exceeded")
	<-ended

	if err := rt.Exit(id, 0); err != nil {
		t.Fatal(err)
	}
	_, err = exec(id, 0, "sh")
	wantErr(t, err, codes.Unknown, "failed to exec in container: container is in CONTAINER_EXITED state")
}
