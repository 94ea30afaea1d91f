package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/metrics"
	"github.com/cri-shim/cri-shim/internal/statefile"
)

type statusNext = UnaryNext[runtimeapi.ContainerStatusRequest, runtimeapi.ContainerStatusResponse]

// tagger hooks ContainerStatus: it forwards and appends its tag to the
// status's ID, or, with answer set, answers with its tag itself.
type tagger struct {
	tag    string
	answer bool
	err    error
	// seen is the code of the error next returned, when it returned one.
	seen codes.Code
}

func (f *tagger) ContainerStatus(ctx context.Context, req *runtimeapi.ContainerStatusRequest, next statusNext) (*runtimeapi.ContainerStatusResponse, error) {
	if f.err != nil {
		return nil, f.err
	}
	if f.answer {
		return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: f.tag}}, nil
	}
	resp, err := next(ctx, req)
	if err != nil {
		f.seen = status.Code(err)
		return nil, err
	}
	resp.Status.Id += f.tag
	return resp, nil
}

// sleeper is a tagger with an Activity that says it has nothing to do.
type sleeper struct{ tagger }

func (*sleeper) HookActive(Method) bool { return false }

func featureFixture(t *testing.T, features ...any) *fixture {
	t.Helper()
	routes, err := routesOf(features)
	if err != nil {
		t.Fatal(err)
	}
	fx := newFixture(t, routes...)
	// Containers "a" and "b" in a sandbox, named so the hooks can tell them apart.
	fx.rt.NextIDs("sbx", "a", "b")
	sb, cfg := fx.runPod(t, 0, nil)
	fx.addContainer(t, sb, cfg, "a", nil, false)
	fx.addContainer(t, sb, cfg, "b", nil, true)
	return fx
}

// statusID is container "a"'s ID as ContainerStatus through the shim answers it.
func statusID(t *testing.T, fx *fixture) (string, error) {
	t.Helper()
	return statusOf(t, fx, "a")
}

func statusOf(t *testing.T, fx *fixture, id string) (string, error) {
	t.Helper()
	r, err := runtimeapi.NewRuntimeServiceClient(fx.shim).ContainerStatus(ctxT(t), &runtimeapi.ContainerStatusRequest{ContainerId: id})
	return r.GetStatus().GetId(), err
}

func TestHooksRunInTheOrderFeaturesAreGiven(t *testing.T) {
	for _, tc := range []struct {
		name     string
		features []any
		want     string
	}{
		{"outer forwards to inner", []any{&tagger{tag: "+outer"}, &tagger{tag: "inner", answer: true}}, "inner+outer"},
		{"inner never reached", []any{&tagger{tag: "outer", answer: true}, &tagger{tag: "+inner"}}, "outer"},
		{"inactive outer skipped", []any{&sleeper{tagger{tag: "+outer"}}, &tagger{tag: "inner", answer: true}}, "inner"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := statusID(t, featureFixture(t, tc.features...))
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// A method whose every hook is inactive is forwarded raw: the runtime's own
// answer comes back.
func TestAllHooksInactiveForwardsRaw(t *testing.T) {
	fx := featureFixture(t, &sleeper{tagger{tag: "x", answer: true}}, &sleeper{tagger{tag: "y", answer: true}})
	if id, err := statusID(t, fx); err != nil || id != "a" {
		t.Fatalf("want the runtime's answer a, got %q, %v", id, err)
	}
}

func TestHookErrorsBecomeStatusAtTheEdge(t *testing.T) {
	notDurable := fmt.Errorf("%w: /var/lib/cri-shim/x: no space left on device", statefile.ErrNotDurable)
	for _, tc := range []struct {
		name string
		err  error
		code codes.Code
	}{
		{"not found", fmt.Errorf("checkpoint %q: %w", "c1", errdefs.ErrNotFound), codes.NotFound},
		{"invalid", fmt.Errorf("annotation x: %w", errdefs.ErrInvalidArgument), codes.InvalidArgument},
		{"precondition", fmt.Errorf("pod not running: %w", errdefs.ErrFailedPrecondition), codes.FailedPrecondition},
		{"unavailable", fmt.Errorf("busy: %w", errdefs.ErrUnavailable), codes.Unavailable},
		{"not durable", notDurable, codes.Unavailable},
		{"deadline", fmt.Errorf("capture: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{"untyped", errors.New("something broke"), codes.Unknown},
		{"runtime status wrapped", fmt.Errorf("cri-shim: %w", status.Error(codes.Aborted, "runtime says no")), codes.Aborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := statusID(t, featureFixture(t, &tagger{err: tc.err}))
			if status.Code(err) != tc.code || status.Convert(err).Message() != tc.err.Error() {
				t.Fatalf("got %v; want code %v with message %q", err, tc.code, tc.err.Error())
			}
		})
	}
}

// A feature sees the next feature's error as it would the runtime's: as a
// gRPC status with its code.
func TestNextFeaturesErrorReachesTheOuterAsStatus(t *testing.T) {
	outer := &tagger{tag: "+outer"}
	fx := featureFixture(t, outer, &tagger{err: fmt.Errorf("held: %w", errdefs.ErrFailedPrecondition)})
	if _, err := statusID(t, fx); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("got %v", err)
	}
	if outer.seen != codes.FailedPrecondition {
		t.Fatalf("outer saw code %v from next", outer.seen)
	}
	// And the runtime's error unchanged, through a hook that forwards.
	fx = featureFixture(t, &tagger{tag: "+only"})
	_, err := statusOf(t, fx, "gone")
	if st := status.Convert(err); st.Code() != codes.NotFound || st.Message() != `an error occurred when try to find container "gone": not found` {
		t.Fatalf("runtime's error changed: %v", err)
	}
}

type bytesStatus struct{}

func (bytesStatus) ContainerStatusBytes(ctx context.Context, req []byte, next BytesNext) ([]byte, error) {
	return next(ctx, req)
}

type eventsA struct{}

func (eventsA) GetContainerEvents(context.Context, *runtimeapi.GetEventsRequest, func(*runtimeapi.ContainerEventResponse) error,
	StreamNext[runtimeapi.GetEventsRequest, runtimeapi.ContainerEventResponse]) error {
	return nil
}

func TestFeaturesThatCannotBeBoundAreRefused(t *testing.T) {
	backend, err := DialBackend("unix:///nonexistent/r.sock", BackendOptions{MaxRecvMsgSize: 1 << 20, MaxSendMsgSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	for name, features := range map[string][]any{
		"no hook":                 {struct{}{}},
		"nil":                     {nil},
		"hook after a bytes hook": {bytesStatus{}, &tagger{tag: "x"}},
		"two event stream hooks":  {eventsA{}, eventsA{}},
	} {
		if _, err := New(backend, metrics.New(CRIMethods()), features...); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := New(backend, metrics.New(CRIMethods()), &tagger{tag: "x"}, bytesStatus{}); err != nil {
		t.Errorf("a bytes hook last was refused: %v", err)
	}
}

// dropB hides container "b" from StreamContainers.
type dropB struct{ active bool }

func (d *dropB) HookActive(Method) bool { return d.active }

func (d *dropB) StreamContainers(ctx context.Context, req *runtimeapi.StreamContainersRequest,
	send func(*runtimeapi.StreamContainersResponse) error,
	next StreamNext[runtimeapi.StreamContainersRequest, runtimeapi.StreamContainersResponse]) error {
	cs, err := next(ctx, req)
	if err != nil {
		return err
	}
	return Relay(cs, send, func(r *runtimeapi.StreamContainersResponse) (bool, error) {
		var keep []*runtimeapi.Container
		for _, c := range r.Containers {
			if c.Id != "b" {
				keep = append(keep, c)
			}
		}
		r.Containers = keep
		return true, nil
	})
}

func TestStreamHook(t *testing.T) {
	for _, active := range []bool{true, false} {
		fx := featureFixture(t, &dropB{active: active})
		s, err := runtimeapi.NewRuntimeServiceClient(fx.shim).StreamContainers(ctxT(t), &runtimeapi.StreamContainersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for {
			r, err := s.Recv()
			if err != nil {
				// The runtime's end of stream status reaches the caller.
				if err == io.EOF || status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("active=%v: stream ended with %v", active, err)
				}
				break
			}
			for _, c := range r.Containers {
				ids = append(ids, c.Id)
			}
		}
		want := "a,b"
		if active {
			want = "a"
		}
		if got := strings.Join(ids, ","); got != want {
			t.Fatalf("active=%v: got %s, want %s", active, got, want)
		}
	}
}
