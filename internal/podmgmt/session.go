package podmgmt

// The connection to a pod's orchestrator: connect, hand over the current
// state, then deliver queued notifications until the channel ends.

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/metadata"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	pb "github.com/cri-shim/cri-shim/api/podmanagement/v1"
	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/pkg/podmanagement"
)

// connectLocked starts the pod's connector if it is not running and Run
// runs (Run cancels it at its end, and waits for it); m.mu held.
func (m *Manager) connectLocked(p *pod) {
	if p.cancel != nil || !m.serving || p.terminating.Load() {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	m.connectors.Add(1)
	go func() {
		defer m.connectors.Done()
		m.connector(ctx, p)
	}()
}

// connector keeps the pod's channel up: connect with exponential backoff
// until the sidecar answers, resend the current state, then deliver queued
// events and serve commands until the connection fails; then again.
func (m *Manager) connector(ctx context.Context, p *pod) {
	retry := backoff.Retry(m.minBackoff, m.maxBackoff)
	for ctx.Err() == nil {
		err := m.session(ctx, p)
		if ctx.Err() != nil {
			return
		}
		if r := (*refusal)(nil); errors.As(err, &r) {
			m.refuse(p, r)
			return
		}
		m.setState(p, "backoff")
		m.setConnected(p, 0)
		if err == nil { // it was connected: start over fast
			retry = backoff.Retry(m.minBackoff, m.maxBackoff)
		}
		delay := retry.Step()
		m.log.Debug("podmgmt: channel down; retrying", "pod", p.Namespace+"/"+p.Name, "in", delay, "err", err)
		if !backoff.Sleep(ctx, delay) {
			return
		}
	}
}

func (m *Manager) session(ctx context.Context, p *pod) error {
	m.setState(p, "connecting")
	sb, err := m.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.SandboxID})
	if err != nil {
		return err
	}
	addr, err := m.podAddr(sb.GetStatus(), p.Decl.Port)
	if err != nil {
		return err
	}
	conn, err := m.dial(addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	c := pb.NewPodManagementClient(conn)
	cctx := metadata.AppendToOutgoingContext(ctx, podmanagement.TokenMetadata, p.token)
	hctx, cancel := context.WithTimeout(cctx, 2*time.Second)
	_, err = c.Hello(hctx, &pb.HelloRequest{Versions: podspec.SupportedVersions, Agent: "cri-shim", PodNamespace: p.Namespace, PodName: p.Name, PodUid: p.UID})
	cancel()
	if err != nil {
		return err
	}
	m.setState(p, "connected")
	m.setConnected(p, 1)
	m.log.Info("podmgmt: channel connected", "pod", p.Namespace+"/"+p.Name, "sidecar", p.Decl.Container)
	sctx, scancel := context.WithCancel(cctx)
	defer scancel()
	errc := make(chan error, 2)
	go func() { errc <- m.commands(sctx, p, c) }()
	go func() { errc <- m.deliver(sctx, p, c) }()
	err = <-errc
	scancel()
	<-errc
	return err
}

// deliver resends the current state of every container, then the queued events.
func (m *Manager) deliver(ctx context.Context, p *pod, c pb.PodManagementClient) error {
	for len(p.queue) > 0 { // superseded by the state sent next
		<-p.queue
	}
	var seq uint64
	send := func(ev *pb.ContainerEvent) error {
		seq++
		ev.Sequence = seq
		nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := c.NotifyContainerEvent(nctx, &pb.NotifyContainerEventRequest{Event: ev})
		if err == nil {
			m.metrics.sent.Inc()
		}
		return err
	}
	state, err := m.current(ctx, p)
	if err != nil {
		return err
	}
	for _, ev := range state {
		if err := send(ev); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev := <-p.queue:
			if err := send(ev); err != nil {
				return err
			}
		}
	}
}

// current is the latest instance of every container of the pod, as events.
func (m *Manager) current(ctx context.Context, p *pod) ([]*pb.ContainerEvent, error) {
	r, err := m.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{PodSandboxId: p.SandboxID}})
	if err != nil {
		return nil, err
	}
	latest := map[string]*runtimeapi.Container{}
	for _, c := range r.GetContainers() {
		n := c.GetMetadata().GetName()
		if l := latest[n]; l == nil || c.GetCreatedAt() > l.GetCreatedAt() {
			latest[n] = c
		}
	}
	var out []*pb.ContainerEvent
	for _, c := range latest {
		switch c.GetState() {
		case runtimeapi.ContainerState_CONTAINER_RUNNING:
			st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId()})
			if err != nil {
				continue
			}
			out = append(out, m.event(p, st.GetStatus(), pb.EventType_STARTED, "resync"))
		case runtimeapi.ContainerState_CONTAINER_EXITED:
			st, err := m.rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.GetId()})
			if err != nil {
				continue
			}
			out = append(out, m.event(p, st.GetStatus(), pb.EventType_EXITED, "resync"))
		}
	}
	sortEvents(out)
	return out, nil
}
