package proxy

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/fakeruntime"
	"github.com/cri-shim/cri-shim/internal/metrics"
	"github.com/cri-shim/cri-shim/internal/wire"
)

func TestTypedRouteChangesOnlyItsMethod(t *testing.T) {
	route := unary("/runtime.v1.RuntimeService/Version",
		func(ctx context.Context, req *runtimeapi.VersionRequest, next UnaryNext[runtimeapi.VersionRequest, runtimeapi.VersionResponse]) (*runtimeapi.VersionResponse, error) {
			resp, err := next(ctx, req)
			if err != nil {
				return nil, err
			}
			resp.RuntimeName += "+shim"
			return resp, nil
		})
	fx := newFixture(t, route)
	c := runtimeapi.NewRuntimeServiceClient(fx.shim)
	v, err := c.Version(ctxT(t), &runtimeapi.VersionRequest{})
	if err != nil || v.RuntimeName != fakeruntime.RuntimeName+"+shim" {
		t.Fatalf("typed route not applied: %v %v", v, err)
	}
	if _, err := c.Version(ctxT(t), &runtimeapi.VersionRequest{Version: "fail"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("typed route changed the runtime's error: %v", err)
	}
	if _, err := c.ListContainers(ctxT(t), &runtimeapi.ListContainersRequest{}); err != nil {
		t.Fatal(err)
	}
}

// Two features on one method: the first route serves the call and its forward
// runs the second, whose forward reaches the runtime; an inactive UnaryIf in
// front still hands decoded messages on.
func TestRoutesForOneMethodAreChained(t *testing.T) {
	const m = "/runtime.v1.RuntimeService/Version"
	tag := func(s string) func(context.Context, *runtimeapi.VersionRequest, UnaryNext[runtimeapi.VersionRequest, runtimeapi.VersionResponse]) (*runtimeapi.VersionResponse, error) {
		return func(ctx context.Context, req *runtimeapi.VersionRequest, next UnaryNext[runtimeapi.VersionRequest, runtimeapi.VersionResponse]) (*runtimeapi.VersionResponse, error) {
			resp, err := next(ctx, req)
			if err != nil {
				return nil, err
			}
			resp.RuntimeName += s
			return resp, nil
		}
	}
	// Both UnaryIf and inactive: the call goes through raw, untouched.
	off := func() bool { return false }
	fx := newFixture(t, unaryIf(m, off, tag("+a")), unaryIf(m, off, tag("+b")))
	if v, err := runtimeapi.NewRuntimeServiceClient(fx.shim).Version(ctxT(t), &runtimeapi.VersionRequest{}); err != nil || v.RuntimeName != fakeruntime.RuntimeName {
		t.Fatalf("inactive chain: %q %v", v.GetRuntimeName(), err)
	}
	for _, active := range []bool{true, false} {
		outer := unaryIf(m, func() bool { return active }, tag("+outer"))
		fx := newFixture(t, outer, unary(m, tag("+inner")), unary(m, tag("+last")))
		c := runtimeapi.NewRuntimeServiceClient(fx.shim)
		v, err := c.Version(ctxT(t), &runtimeapi.VersionRequest{})
		want := fakeruntime.RuntimeName + "+last+inner"
		if active {
			want += "+outer"
		}
		if err != nil || v.RuntimeName != want {
			t.Fatalf("active=%v: got %q, %v; want %q", active, v.GetRuntimeName(), err, want)
		}
		if _, err := c.Version(ctxT(t), &runtimeapi.VersionRequest{Version: "fail"}); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("active=%v: chain changed the runtime's error: %v", active, err)
		}
	}
	// An inactive link inside the chain is skipped; the ones around it
	// still run in order.
	mid := unaryIf(m, off, tag("+mid"))
	fx = newFixture(t, unary(m, tag("+first")), mid, unary(m, tag("+last")))
	if v, err := runtimeapi.NewRuntimeServiceClient(fx.shim).Version(ctxT(t), &runtimeapi.VersionRequest{}); err != nil ||
		v.RuntimeName != fakeruntime.RuntimeName+"+last+first" {
		t.Fatalf("chain with an inactive middle link: %q %v", v.GetRuntimeName(), err)
	}
}

func TestNewRefusesBadRoutes(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "r.sock")
	backend, err := DialBackend(sock, BackendOptions{MaxRecvMsgSize: 1 << 20, MaxSendMsgSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	h := func(context.Context, grpc.ServerStream, grpc.ClientConnInterface) error { return nil }
	mc := metrics.New(CRIMethods())
	for name, routes := range map[string][]hookRoute{
		"not a CRI method": {{Method: "/x.Y/Z", Handler: h}},
		"duplicate":        {{Method: "/runtime.v1.RuntimeService/Version", Handler: h}, {Method: "/runtime.v1.RuntimeService/Version", Handler: h}},
		"nil handler":      {{Method: "/runtime.v1.RuntimeService/Version"}},
	} {
		if _, err := newWithRoutes(backend, mc, routes); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestBytesRoute(t *testing.T) {
	const m = "/runtime.v1.RuntimeService/Version"
	// Appends "+bytes" to runtime_name (field 2) by appending the field again:
	// the last occurrence wins for every reader.
	var calls atomic.Int32
	edit := func(ctx context.Context, req []byte, next BytesNext) ([]byte, error) {
		calls.Add(1)
		resp, err := next(ctx, req)
		if err != nil {
			return nil, err
		}
		name, _, err := wire.String(resp, 2)
		if err != nil {
			return nil, err
		}
		return protowire.AppendString(protowire.AppendTag(resp, 2, protowire.BytesType), name+"+bytes"), nil
	}
	tag := func(ctx context.Context, req *runtimeapi.VersionRequest, next UnaryNext[runtimeapi.VersionRequest, runtimeapi.VersionResponse]) (*runtimeapi.VersionResponse, error) {
		resp, err := next(ctx, req)
		if err != nil {
			return nil, err
		}
		resp.RuntimeName += "+outer"
		return resp, nil
	}
	for _, tc := range []struct {
		name          string
		outer, active bool
		want          string
	}{
		{"alone, active", false, true, fakeruntime.RuntimeName + "+bytes"},
		{"alone, inactive", false, false, fakeruntime.RuntimeName},
		{"after an active typed route", true, true, fakeruntime.RuntimeName + "+bytes+outer"},
		{"after an inactive typed route", false, true, fakeruntime.RuntimeName + "+bytes"},
		{"typed route active, bytes inactive", true, false, fakeruntime.RuntimeName + "+outer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			routes := []hookRoute{unaryBytesIf(m, func() bool { return tc.active }, edit)}
			if strings.Contains(tc.name, "typed") {
				routes = append([]hookRoute{unaryIf(m, func() bool { return tc.outer }, tag)}, routes...)
			}
			fx := newFixture(t, routes...)
			c := runtimeapi.NewRuntimeServiceClient(fx.shim)
			v, err := c.Version(ctxT(t), &runtimeapi.VersionRequest{Version: "v1"})
			if err != nil || v.RuntimeName != tc.want || v.Version == "" {
				t.Fatalf("got %q (version %q), %v; want %q", v.GetRuntimeName(), v.GetVersion(), err, tc.want)
			}
			if _, err := c.Version(ctxT(t), &runtimeapi.VersionRequest{Version: "fail"}); status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("the runtime's error changed: %v", err)
			}
		})
	}
	if calls.Load() == 0 {
		t.Fatal("the bytes route never ran")
	}
	// Its forward goes to the runtime: nothing may be chained after it.
	sock := filepath.Join(t.TempDir(), "r.sock")
	backend, err := DialBackend(sock, BackendOptions{MaxRecvMsgSize: 1 << 20, MaxSendMsgSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	if _, err := newWithRoutes(backend, metrics.New(CRIMethods()), []hookRoute{unaryBytesIf(m, func() bool { return true }, edit), unaryIf(m, func() bool { return true }, tag)}); err == nil {
		t.Fatal("a route chained after a bytes route was accepted")
	}
}

// unary builds the route of a unary hook: the request is decoded, fn decides
// what to do with it and may call next to forward it.
func unary[Req, Resp any, PReq interface {
	*Req
	proto.Message
}, PResp interface {
	*Resp
	proto.Message
}](method string, fn func(ctx context.Context, req *Req, next UnaryNext[Req, Resp]) (*Resp, error)) hookRoute {
	return unaryIf[Req, Resp, PReq, PResp](method, nil, fn)
}
