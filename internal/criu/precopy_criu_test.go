package criu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/checkpoint-restore/go-criu/v8/rpc"
	"google.golang.org/protobuf/proto"
)

// fakeCRIU writes a shell script standing in for criu and returns its path.
func fakeCRIU(t *testing.T, script string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// A CRIU whose answer never comes while a forked child keeps the socket
// open (as CRIU's feature check forks one): the check returns by its
// deadline, or when its context is cancelled, although killing "criu swrk"
// does not close the socket.
func TestMemTrackAvailableHonoursDeadlineWithChildHoldingSocket(t *testing.T) {
	// The background sleep inherits fd 3 and outlives the killed shell.
	bin := fakeCRIU(t, "sleep 4 &\nexec sleep 4\n")
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 300*time.Millisecond)
		}, context.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(300*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
	} {
		ctx, cancel := tc.ctx()
		done := make(chan error, 1)
		go func() { _, err := MemTrackAvailable(ctx, bin); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, tc.want) {
				t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
			}
		case <-time.After(3 * time.Second):
			t.Errorf("%s: MemTrackAvailable still waiting 3s after 300ms", tc.name)
		}
		cancel()
	}
}

// A CRIU that answers is read as before: the answer's mem_track, not the
// request's. The fake answers with a prepared message on fd 3.
func TestMemTrackAvailableReadsAnswer(t *testing.T) {
	for _, want := range []bool{false, true} {
		b, err := (&rpc.CriuResp{Type: rpc.CriuReqType_FEATURE_CHECK.Enum(), Success: proto.Bool(true),
			Features: &rpc.CriuFeatures{MemTrack: proto.Bool(want)}}).MarshalVT()
		if err != nil {
			t.Fatal(err)
		}
		ans := filepath.Join(t.TempDir(), "answer")
		if err := os.WriteFile(ans, b, 0o600); err != nil {
			t.Fatal(err)
		}
		// One write of the whole message keeps it one SEQPACKET record.
		bin := fakeCRIU(t, "head -c 0 <&3 >/dev/null\ncat "+ans+" >&3\nsleep 1\n")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got, err := MemTrackAvailable(ctx, bin)
		cancel()
		if err != nil || got != want {
			t.Errorf("got %v, %v, want %v", got, err, want)
		}
	}
}
