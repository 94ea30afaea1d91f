package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
)

// The bare forwarder is the floor a CRI proxy can reach with grpc-go: one
// server whose unknown-service handler relays every call's frames, undecoded,
// to one client connection, and nothing else (no routes, no metrics, no
// logging). proxybench runs it as a child process (proxybench bare) so its CPU
// is measured apart, and compares the shim with it in the same run. It gets
// the transport settings the shim runs with (GOMAXPROCS 1, fixed flow-control
// windows, shared write buffers, stream workers, 5 ms timer slack), so that the
// comparison measures what the shim does per call, not how it is tuned.

// rawFrame is one message as the bytes that arrived.
type rawFrame struct{ data mem.BufferSlice }

type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*rawFrame)
	if !ok {
		return nil, fmt.Errorf("bare forwarder: cannot marshal %T", v)
	}
	out := f.data
	f.data = nil
	if out == nil {
		return mem.BufferSlice{}, nil
	}
	return out, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*rawFrame)
	if !ok {
		return fmt.Errorf("bare forwarder: cannot unmarshal into %T", v)
	}
	data.Ref()
	f.data = data
	return nil
}

func (rawCodec) Name() string { return "proto" }

var _ encoding.CodecV2 = rawCodec{}

// bareMain serves listen, relaying to backend, until SIGTERM.
func bareMain(listen, backend string) error {
	cc, err := grpc.NewClient("unix://"+backend, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})),
		grpc.WithInitialWindowSize(4<<20), grpc.WithInitialConnWindowSize(16<<20),
		grpc.WithSharedWriteBuffer(true), grpc.WithIdleTimeout(0))
	if err != nil {
		return err
	}
	defer cc.Close()
	desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
	handler := func(_ any, ss grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(ss)
		md, _ := metadata.FromIncomingContext(ss.Context())
		ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ss.Context(), md))
		defer cancel()
		cs, err := cc.NewStream(ctx, desc, method)
		if err != nil {
			return err
		}
		errc := make(chan error, 1)
		go func() { // client to backend
			for {
				var f rawFrame
				if err := ss.RecvMsg(&f); err != nil {
					if errors.Is(err, io.EOF) {
						errc <- cs.CloseSend()
						return
					}
					errc <- err
					return
				}
				if err := cs.SendMsg(&f); err != nil {
					errc <- nil // the backend's answer below says why
					return
				}
			}
		}()
		first := true
		for { // backend to client
			var f rawFrame
			if err := cs.RecvMsg(&f); err != nil {
				if first {
					if h, herr := cs.Header(); herr == nil {
						_ = ss.SetHeader(h)
					}
				}
				ss.SetTrailer(cs.Trailer())
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			if first {
				if h, err := cs.Header(); err == nil {
					if err := ss.SendHeader(h); err != nil {
						return err
					}
				}
				first = false
			}
			if err := ss.SendMsg(&f); err != nil {
				return err
			}
		}
	}
	srv := grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}), grpc.UnknownServiceHandler(handler),
		grpc.InitialWindowSize(4<<20), grpc.InitialConnWindowSize(16<<20),
		grpc.SharedWriteBuffer(true), grpc.NumStreamWorkers(4))
	_ = os.Remove(listen)
	l, err := net.Listen("unix", listen)
	if err != nil {
		return err
	}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		srv.Stop()
	}()
	return srv.Serve(l)
}

// startBare runs this binary as the bare forwarder on sock in front of
// backend and waits until it answers; stop ends it.
func startBare(sock, backend string) (pid int, stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return 0, nil, err
	}
	cmd := exec.Command(self, "bare", sock, backend)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		_ = os.Remove(sock)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			if err := setSlack(cmd.Process.Pid, 5*time.Millisecond); err != nil {
				stop()
				return 0, nil, err
			}
			return cmd.Process.Pid, stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return 0, nil, fmt.Errorf("bare forwarder did not listen on %s", sock)
		}
	}
}

// setSlack gives every thread of pid the timer slack the shim sets on itself
// (server.timer_slack); threads made later inherit it.
func setSlack(pid int, d time.Duration) error {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	for _, t := range tasks {
		// /proc/<tid> reaches a thread by its id; /proc/<pid>/task/<tid>
		// has no timerslack_ns (proc(5)).
		p := fmt.Sprintf("/proc/%s/timerslack_ns", t.Name())
		if err := os.WriteFile(p, []byte(strconv.FormatInt(d.Nanoseconds(), 10)), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("timer slack of the bare forwarder: %w", err)
		}
	}
	got, err := os.ReadFile(fmt.Sprintf("/proc/%d/timerslack_ns", pid))
	if err != nil {
		return err
	}
	if want := strconv.FormatInt(d.Nanoseconds(), 10); strings.TrimSpace(string(got)) != want {
		return fmt.Errorf("timer slack of the bare forwarder is %s ns, not %s", strings.TrimSpace(string(got)), want)
	}
	return nil
}
