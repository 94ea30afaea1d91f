// Package podmanagement is the sidecar's side of cri-shim's pod management
// channel (KEP-5309, api/podmanagement/v1): serve it, receive the node
// agent's container events, and send commands (terminate, restart a
// container, restart the pod) and get their results.
//
//	sc, _ := podmanagement.New(podmanagement.Options{})   // reads the token cri-shim mounted
//	go sc.Serve(lis)                                      // lis on the declared port
//	for ev := range sc.Events() { ... sc.Terminate(ctx, "main", 0) ... }
package podmanagement

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/cri-shim/cri-shim/api/podmanagement/v1"
)

// TokenPath is where cri-shim mounts the pod's token in the declared container.
const TokenPath = "/var/run/cri-shim/podmanagement/token"

// TokenMetadata is the call metadata key carrying the token.
const TokenMetadata = "x-cri-shim-token"

// Version is the protocol version this package speaks.
const Version = "1.0"

// Options configure a Sidecar.
type Options struct {
	// Token the node agent must present; empty reads TokenPath. With
	// InsecureNoToken set, calls are not checked (tests only).
	Token           string
	InsecureNoToken bool
	// EventBuffer is the size of the Events channel (default 256); a full
	// buffer makes the node agent's call wait, never drops.
	EventBuffer int
}

// Sidecar serves PodManagement.
type Sidecar struct {
	pb.UnimplementedPodManagementServer
	token    string
	events   chan *pb.ContainerEvent
	rejected atomic.Int64

	mu      sync.Mutex
	stream  pb.PodManagement_CommandStreamServer
	waiting map[string]chan *pb.CommandResponse
	nextID  atomic.Uint64
	gs      *grpc.Server
	ready   chan struct{} // closed when a command stream is open
}

// New builds a sidecar.
func New(o Options) (*Sidecar, error) {
	s := &Sidecar{token: o.Token, waiting: map[string]chan *pb.CommandResponse{}, ready: make(chan struct{})}
	if s.token == "" && !o.InsecureNoToken {
		b, err := os.ReadFile(TokenPath)
		if err != nil {
			return nil, fmt.Errorf("pod management token: %w (is the pod-management.cri-shim.io annotation set for this container?)", err)
		}
		s.token = strings.TrimSpace(string(b))
	}
	n := o.EventBuffer
	if n <= 0 {
		n = 256
	}
	s.events = make(chan *pb.ContainerEvent, n)
	return s, nil
}

// Events delivers the node agent's container events in order.
func (s *Sidecar) Events() <-chan *pb.ContainerEvent { return s.events }

// Rejected counts calls refused for a wrong or missing token.
func (s *Sidecar) Rejected() int64 { return s.rejected.Load() }

// Serve serves the channel on lis until Stop.
func (s *Sidecar) Serve(lis net.Listener) error {
	s.mu.Lock()
	s.gs = grpc.NewServer(grpc.UnaryInterceptor(s.unaryAuth), grpc.StreamInterceptor(s.streamAuth))
	pb.RegisterPodManagementServer(s.gs, s)
	gs := s.gs
	s.mu.Unlock()
	return gs.Serve(lis)
}

// Stop stops serving.
func (s *Sidecar) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gs != nil {
		s.gs.Stop()
	}
}

func (s *Sidecar) check(ctx context.Context) error {
	if s.token == "" {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(TokenMetadata); len(v) == 1 && subtle.ConstantTimeCompare([]byte(v[0]), []byte(s.token)) == 1 {
		return nil
	}
	s.rejected.Add(1)
	return status.Error(codes.Unauthenticated, "pod management: wrong or missing node agent token")
}

func (s *Sidecar) unaryAuth(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (s *Sidecar) streamAuth(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := s.check(ss.Context()); err != nil {
		return err
	}
	return h(srv, ss)
}

// Hello picks the protocol version.
func (s *Sidecar) Hello(_ context.Context, r *pb.HelloRequest) (*pb.HelloResponse, error) {
	for _, v := range r.GetVersions() {
		if v == Version {
			return &pb.HelloResponse{Version: Version}, nil
		}
	}
	return nil, status.Errorf(codes.FailedPrecondition, "pod management: node agent speaks %v, this sidecar %s", r.GetVersions(), Version)
}

// NotifyContainerEvent hands the event to Events.
func (s *Sidecar) NotifyContainerEvent(ctx context.Context, r *pb.NotifyContainerEventRequest) (*pb.NotifyContainerEventResponse, error) {
	select {
	case s.events <- r.GetEvent():
		return &pb.NotifyContainerEventResponse{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// CommandStream is the node agent's end of the command channel; it lasts
// until the node agent disconnects.
func (s *Sidecar) CommandStream(stream pb.PodManagement_CommandStreamServer) error {
	s.mu.Lock()
	s.stream = stream
	select {
	case <-s.ready:
	default:
		close(s.ready)
	}
	s.mu.Unlock()
	for {
		r, err := stream.Recv()
		if err != nil {
			s.mu.Lock()
			if s.stream == stream {
				s.stream = nil
				s.ready = make(chan struct{})
			}
			s.mu.Unlock()
			return err
		}
		s.mu.Lock()
		ch := s.waiting[r.GetId()]
		delete(s.waiting, r.GetId())
		s.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
}

// ErrNotConnected: no node agent holds the command stream open.
var ErrNotConnected = errors.New("pod management: the node agent is not connected")

// Send sends a command and waits for its response.
func (s *Sidecar) Send(ctx context.Context, c *pb.Command) (*pb.CommandResponse, error) {
	s.mu.Lock()
	ready := s.ready
	s.mu.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
		return nil, ErrNotConnected
	}
	c.Id = strconv.FormatUint(s.nextID.Add(1), 10)
	ch := make(chan *pb.CommandResponse, 1)
	s.mu.Lock()
	stream := s.stream
	if stream == nil {
		s.mu.Unlock()
		return nil, ErrNotConnected
	}
	s.waiting[c.Id] = ch
	err := stream.Send(c)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	select {
	case r := <-ch:
		return r, nil
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.waiting, c.Id)
		s.mu.Unlock()
		return nil, ctx.Err()
	}
}

// Terminate asks the node agent to stop a container, reporting exitCode.
func (s *Sidecar) Terminate(ctx context.Context, container string, exitCode int32) (*pb.CommandResponse, error) {
	return s.Send(ctx, &pb.Command{Command: &pb.Command_TerminateContainer{TerminateContainer: &pb.TerminateContainerCommand{ContainerName: container, ExitCode: exitCode}}})
}

// Restart asks the node agent to restart a container.
func (s *Sidecar) Restart(ctx context.Context, container string) (*pb.CommandResponse, error) {
	return s.Send(ctx, &pb.Command{Command: &pb.Command_RestartContainer{RestartContainer: &pb.RestartContainerCommand{ContainerName: container}}})
}

// RestartAll asks the node agent to restart every container of the pod in place.
func (s *Sidecar) RestartAll(ctx context.Context, reason string) (*pb.CommandResponse, error) {
	return s.Send(ctx, &pb.Command{Command: &pb.Command_RestartAllContainers{RestartAllContainers: &pb.RestartAllContainersCommand{Reason: reason}}})
}
