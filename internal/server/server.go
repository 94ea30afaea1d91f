package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cri-shim/cri-shim/internal/capture"
	"github.com/cri-shim/cri-shim/internal/events"

	gocriu "github.com/checkpoint-restore/go-criu/v8"
	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/ckptstore"
	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/kubeapi"
	"github.com/cri-shim/cri-shim/internal/metrics"
	"github.com/cri-shim/cri-shim/internal/ociartifact"
	"github.com/cri-shim/cri-shim/internal/podcheckpoint"
	"github.com/cri-shim/cri-shim/internal/podmgmt"
	"github.com/cri-shim/cri-shim/internal/podspec"
	"github.com/cri-shim/cri-shim/internal/podstate"
	"github.com/cri-shim/cri-shim/internal/podstatus"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/restartapi"
	"github.com/cri-shim/cri-shim/internal/restartview"
	"github.com/cri-shim/cri-shim/internal/restore"
	"github.com/cri-shim/cri-shim/internal/statefile"
	"github.com/cri-shim/cri-shim/internal/store"
	"github.com/cri-shim/cri-shim/internal/warm"
)

// Options are what Run needs beyond the config.
type Options struct {
	// Features are taken by the proxy before the shim's own, in this order
	// (tests use it to take part in calls).
	Features []any
	// Ready is called once the CRI socket accepts calls (sd_notify READY=1).
	Ready func()
	// Listener, when set, is the CRI socket, kept open after Run returns
	// (an in-place upgrade hands it to the next binary); otherwise Run
	// makes one with Listen and closes it when it returns.
	Listener *Listener
}

// Run serves until ctx is cancelled, then shuts down: calls in flight get
// cfg.Server.ShutdownTimeout to finish, after which open streams are closed.
func Run(ctx context.Context, cfg config.Config, log *slog.Logger, o Options) error {
	gid, err := LookupGroup(cfg.Server.SocketGroup)
	if err != nil {
		return err
	}
	backend, err := proxy.DialBackend(cfg.Runtime.Endpoint, proxy.BackendOptions{
		MaxRecvMsgSize:    cfg.Server.MaxSendMsgSize, // what the runtime sends is what we send on
		MaxSendMsgSize:    cfg.Server.MaxRecvMsgSize,
		ReconnectMaxDelay: cfg.Runtime.ReconnectMaxDelay.Duration,
	})
	if err != nil {
		return fmt.Errorf("runtime.endpoint: %w", err)
	}
	defer backend.Close()

	rt := runtimeapi.NewRuntimeServiceClient(backend)
	mc := metrics.New(proxy.CRIMethods())
	mc.Registry.MustRegister(statefile.Collectors()...)
	// The API server connection, nil when standalone. What the features
	// write there is queued and written when it answers; nothing here
	// waits for it.
	api, err := kubeapi.Open(cfg.Kubernetes, log)
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	curve, err := cfg.BackoffCurve()
	if err != nil {
		return fmt.Errorf("backoff: %w", err)
	}
	// Every feature's per-sandbox records, and the lifecycle that tells
	// them when a sandbox is gone.
	st, err := store.Open(store.RootIn(cfg.StateDir))
	if err != nil {
		return fmt.Errorf("state_dir: %w", err)
	}
	// The node's sandboxes, and the one announcement that one is gone.
	table := podtable.New(rt, st, log)
	// One subscription to the runtime's container events for every feature.
	feed := events.NewFeed(backend, log)
	tasks, err := capture.DialTasks(cfg.Runtime.Endpoint)
	if err != nil {
		return fmt.Errorf("runtime.endpoint: %w", err)
	}
	defer tasks.Close()
	cp, err := wireCheckpoints(cfg, api, st, table, backend, tasks, log)
	if err != nil {
		return err
	}
	// The pod status reporter observes the restart engine, and once the API
	// server answers it catches up from the engine's snapshot: it reads
	// pods, made just below, only when it runs.
	var pods *podstate.Manager
	var reporter restartapi.Observer // nil: none
	if api != nil {
		reporter = podstatus.New(api, func() []restartapi.PodState { return pods.Snapshot() }, log)
	}
	pods, err = podstate.New(rt, cfg.StateDir, backoff.NewTracker(curve, nil), log, podstate.Options{
		KeepDead:   cfg.Backoff.KubeletDeadContainers,
		TrackAlso:  func(s podspec.Spec) bool { return s.Orchestrator != nil },
		EventsLive: feed.Live,
		Observer:   reporter,
		Warm:       cp.warm.WarmRestartRequest,
	})
	if err != nil {
		return fmt.Errorf("state_dir: %w", err)
	}
	// What the kubelet reads of the pods that restart in place.
	view := restartview.New(pods, feed.Live, log)
	channels, err := podmgmt.New(rt, cfg.StateDir, st, pods, log)
	if err != nil {
		return fmt.Errorf("pod management: %w", err)
	}

	// What runs, from the runtime outward. A new pod is admitted by the
	// features in this order (the pod table's RunPodSandbox): warm start
	// first (it may refuse the pod: restore-from), then the restart state,
	// the channel, and last the pod status reporter, which writes the
	// readiness gate once every other feature recorded the sandbox. A
	// sandbox gone and the runtime's container events reach them in this
	// order too. A CRI call crosses them the other way, from the last to
	// the first: the pod table sees RemovePodSandbox answered after every
	// feature and announces the sandbox gone to all of them (store.Gone);
	// the channel adds its token mount before the restart state records the
	// kubelet's CreateContainer (so replays carry it too) and overrides a
	// status before the restart view reads it encoded (a bytes hook is last
	// on its method); the restart state sees the kubelet's calls before warm
	// start rewrites them; warm start's StartContainer sees the result of
	// restore's, which ends a staged restore; capture serves CheckpointPod,
	// restore RestorePod.
	bg := &runGroup{}
	calls := wire(table, st, feed, mc.Registry, bg, []feature{
		{name: "runtime connection watch", run: func(ctx context.Context) { watchBackend(ctx, backend, log) }},
		{name: "API server writer", value: api},
		{name: "container event feed", value: feed},
		{name: "checkpoint recovery and resume retries", value: cp.capture, run: cp.run},
		{value: cp.restore},
		{value: cp.warm},
		{name: "pulled checkpoint sweep", value: cp.store, run: cp.store.SweepPulled},
		{name: "checkpoint schedules", run: func(ctx context.Context) { cp.store.RunSchedule(ctx, cp.capture) }, uses: []string{"checkpoint recovery and resume retries"}},
		{name: "in-place restarts", value: pods, uses: []string{"container event feed", "pod status reporter"}},
		{name: "kept exited statuses sweep", value: view, uses: []string{"container event feed"}},
		{name: "pod orchestrator channels", value: channels, uses: []string{"container event feed", "in-place restarts"}},
		{name: "pod status reporter", value: reporter, uses: []string{"API server writer"}},
		{name: "PodCheckpoint objects", run: cp.podCheckpoints, uses: []string{"API server writer", "checkpoint recovery and resume retries"}},
		{name: "pod table relist", value: table},
	})
	p, err := proxy.New(backend, mc, append(slices.Clone(o.Features), calls...)...)
	if err != nil {
		return err
	}
	gs := grpc.NewServer(append(p.ServerOptions(),
		grpc.MaxRecvMsgSize(cfg.Server.MaxRecvMsgSize),
		grpc.MaxSendMsgSize(cfg.Server.MaxSendMsgSize),
		grpc.SharedWriteBuffer(true),
	)...)

	listenPath := strings.TrimPrefix(cfg.Server.Listen, "unix://")
	sock := o.Listener
	if sock == nil {
		if sock, err = Listen(listenPath, cfg.SocketModeBits(), gid); err != nil {
			return err
		}
		defer sock.Close()
	}
	lis := sock.Serving()

	probe := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := rt.Version(ctx, &runtimeapi.VersionRequest{})
		mc.SetRuntimeUp(err == nil)
		return err
	}
	if err := probe(ctx); err != nil {
		log.Warn("runtime not answering at start; serving anyway, calls answer Unavailable until it is up",
			"endpoint", cfg.Runtime.Endpoint, "err", err)
	}

	// The records in step with the runtime before the first call is
	// answered (an in-place upgrade's calls are already waiting): sandboxes
	// removed while the shim was down are gone first.
	if err := table.Sync(ctx); err != nil {
		log.Warn("pod table: the runtime's sandboxes could not be listed at start; the next relist announces those gone", "err", err)
	}
	pods.Resume(ctx)

	stopBackground, err := bg.Start(ctx)
	if err != nil {
		return err
	}
	defer stopBackground()

	var hs *http.Server
	if cfg.Metrics.Address != "" {
		hl, err := net.Listen("tcp", cfg.Metrics.Address)
		if err != nil {
			lis.Close()
			return fmt.Errorf("metrics.address: %w", err)
		}
		hs = &http.Server{Handler: httpMux(mc, probe, statefile.Healthy, cfg.Metrics.Profiling), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := hs.Serve(hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics endpoint stopped", "err", err)
			}
		}()
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- gs.Serve(lis) }()
	log.Info("serving CRI", "listen", listenPath, "socket", sock.From(), "runtime", cfg.Runtime.Endpoint, "metrics", cfg.Metrics.Address)
	if o.Ready != nil {
		o.Ready()
	}

	select {
	case err = <-serveErr:
		err = fmt.Errorf("serve %s: %w", listenPath, err)
	case <-ctx.Done():
		log.Info("shutting down", "timeout", cfg.Server.ShutdownTimeout.Duration)
		stopGracefully(gs, cfg.Server.ShutdownTimeout.Duration)
		<-serveErr
		err = nil
	}
	if hs != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = hs.Shutdown(sctx)
		cancel()
	}
	stopBackground()
	return err
}

// checkpointWiring is the checkpoint features: the node's checkpoint store,
// captures, restores, warm starts and restarts, and the PodCheckpoint
// controller, which shares them (nil when not configured).
type checkpointWiring struct {
	store          *ckptstore.Store
	capture        *capture.Service
	restore        *restore.Service
	warm           *warm.Service
	podCheckpoints func(context.Context)
}

// wireCheckpoints builds the checkpoint features: restores from checkpoint
// names, PodCheckpoint objects (with an API connection) and image
// references (with [checkpoint] registries).
func wireCheckpoints(cfg config.Config, api *kubeapi.API, st *store.Store, table *podtable.Table, backend *grpc.ClientConn, tasks capture.Tasks, log *slog.Logger) (*checkpointWiring, error) {
	exe, err := os.Executable()
	if err != nil {
		log.Warn("cannot find the shim's own binary; warm-started pods will run completed init containers again", "err", err)
		exe = ""
	}
	// With an API connection, restore-from may name a PodCheckpoint object
	// (docs/podcheckpoint.md), answered from the node's watches (an object
	// they do not hold is read in the background, waited for at most
	// [checkpoint] object_wait).
	var resolve func(ctx context.Context, ns, pod, uid, name string) (string, error)
	var checkpointEvents podcheckpoint.EventSink
	var restores *podcheckpoint.Restores
	if api != nil && cfg.Kubernetes.PodCheckpoints {
		checkpointEvents = func(ref corev1.ObjectReference, eventType, reason, note string) {
			action := "Checkpoint"
			if ref.Kind == "Pod" {
				action = "Restore"
			}
			api.Writes().Event(kubeapi.Event{Regarding: ref, Type: eventType, Reason: reason, Action: action, Note: note})
		}
		restores = podcheckpoint.NewRestores(api.Client.Node, cfg.Checkpoint.ObjectWait.Duration, checkpointEvents)
		resolve = restores.Resolve
	}
	w := &checkpointWiring{}
	var exporter podcheckpoint.Exporter
	var sources podcheckpoint.SourceChecker
	// Restores from image references: pulled from the allow-listed
	// registries only, with the pod's image pull secrets read as the node.
	var pullRestore func(ctx context.Context, ns, pod, uid, ref string, reserve func(int64) (func(), error)) (string, error)
	if len(cfg.Checkpoint.Registries) > 0 {
		pc := ociartifact.RestorePullConfig{
			Root: cfg.Checkpoint.Root, NodeAuthFile: cfg.Checkpoint.RegistryAuthFile,
			MaxBytes: cfg.Checkpoint.PullMaxBytes, Timeout: cfg.Checkpoint.PullTimeout.Duration, Wait: cfg.Checkpoint.PullWait.Duration,
			RestoreAllowed: func(from, to string) bool { return from == to || cfg.Checkpoint.RestoreAllowed(from, to) },
			Log:            log,
			Registries:     cfg.Checkpoint.Registries,
		}
		if api != nil {
			secrets := ociartifact.NewSecretCache()
			pc.PodKeychain = func(ctx context.Context, ns, pod, uid string) (authn.Keychain, error) {
				return ociartifact.PodKeychain(ctx, api.Client.Resources(), secrets, api.Client.Node, ns, pod, uid, log)
			}
			exporter = &ociartifact.Exporter{Registries: pc.Registries, Resources: api.Client.Resources,
				Node: api.Client.Node, Timeout: cfg.Checkpoint.PullTimeout.Duration}
		}
		if cfg.Checkpoint.RestoreProvenance == config.ProvenanceCluster {
			pc.Provenance = func(context.Context, string, string, string) error {
				return fmt.Errorf("%w: [checkpoint] restore_provenance = \"cluster\" checks a checkpoint's origin with the API server, and this shim has no [kubernetes] connection; set restore_provenance = \"any\" to restore whatever the allowed registries serve", errdefs.ErrPermissionDenied)
			}
			if api != nil {
				pc.Provenance = podcheckpoint.Provenance(api.Client, cfg.Checkpoint.SourceNamespaces)
			}
		}
		puller := ociartifact.NewRestorePuller(pc)
		pullRestore, sources = puller.Pull, puller
	}
	// Events on pods (warm restarts the kubelet drives), with an API connection.
	var podEvent func(ns, pod, uid, eventType, reason, action, note string)
	if api != nil {
		podEvent = func(ns, pod, uid, eventType, reason, action, note string) {
			api.Writes().Event(kubeapi.Event{Regarding: kubeapi.PodObject(kubeapi.PodRef{Namespace: ns, Name: pod, UID: uid}),
				Type: eventType, Reason: reason, Action: action, Note: note})
		}
	}
	rt, img := runtimeapi.NewRuntimeServiceClient(backend), runtimeapi.NewImageServiceClient(backend)
	if w.store, err = ckptstore.New(ckptstore.Config{
		Root: cfg.Checkpoint.Root, Sandboxes: table,
		MaxPerPod: cfg.Checkpoint.MaxPerPod, MaxTotalBytes: cfg.Checkpoint.MaxTotalBytes,
		MaxBytesPerNamespace: cfg.Checkpoint.MaxBytesPerNamespace, MinInterval: cfg.Checkpoint.MinInterval.Duration,
		MaxConcurrentCaptures: cfg.Checkpoint.MaxConcurrentCaptures, PodMinGap: cfg.Checkpoint.PodMinGap.Duration,
		ContainerMemory: dumpableMemory(tasks), PullMaxTotalBytes: cfg.Checkpoint.PullMaxTotalBytes,
	}, rt, log); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if w.capture, err = capture.New(capture.Config{Root: cfg.Checkpoint.Root, StateDir: cfg.StateDir, StreamDuringCapture: cfg.Checkpoint.StreamArchives,
		CRIUVersion: criuVersion, Retain: w.store.Retain, Admit: w.store.Admit}, rt, img, tasks, log); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	w.restore = restore.New(restore.Config{Root: cfg.Checkpoint.Root, RestoreAcrossNamespaces: cfg.Checkpoint.RestoreAllowed,
		PodEvent: podEvent, RootfsDiffMaxBytes: cfg.Checkpoint.PullMaxBytes}, rt, img, tasks, log)
	if w.warm, err = warm.New(warm.Config{Root: cfg.Checkpoint.Root, Store: st, Sandboxes: table, ShimBinary: exe,
		ResolveRestore: resolve, PullRestore: pullRestore}, rt, w.restore, w.store, log); err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if api != nil && cfg.Kubernetes.PodCheckpoints {
		w.podCheckpoints = func(ctx context.Context) {
			podcheckpoint.Run(ctx, api.Client, api.Client.Node, cfg.Checkpoint.Root, w.capture,
				nodeRuntime{table, rt}, restores, exporter, sources, checkpointEvents, log)
		}
	}
	return w, nil
}

// run recovers from a crash of an earlier shim (the pods asking for warm
// restarts found again, restores it had staged, pods it had frozen, its
// unfinished checkpoints) and keeps retrying resumes that failed, until ctx
// ends.
func (w *checkpointWiring) run(ctx context.Context) {
	w.warm.Adopt()
	w.restore.Recover(ctx)
	w.capture.Recover(ctx)
	w.capture.RetryResumes(ctx)
}

// stopGracefully lets unary calls finish; long-lived streams (GetContainerEvents)
// would hold GracefulStop forever, so they are cut after timeout.
func stopGracefully(gs *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		gs.Stop()
		<-done
	}
}

// watchBackend logs the runtime connection going down and coming back, so an
// operator can see a containerd restart from the shim's side.
func watchBackend(ctx context.Context, cc *grpc.ClientConn, log *slog.Logger) {
	cc.Connect()
	last := cc.GetState()
	for cc.WaitForStateChange(ctx, last) {
		s := cc.GetState()
		switch {
		case s == connectivity.Ready:
			log.Info("runtime connection ready")
		case last == connectivity.Ready:
			log.Warn("runtime connection lost; calls answer Unavailable while reconnecting", "state", s.String())
		}
		if s == connectivity.Idle {
			cc.Connect()
		}
		last = s
	}
}

// criuVersion asks CRIU for its version once (go-criu runs "criu swrk"); the
// answer goes into every checkpoint's manifest.
var criuVersion = sync.OnceValues(func() (string, error) {
	v, err := gocriu.MakeCriu().GetCriuVersion()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d.%d.%d", v/10000, v/100%100, v%100), nil
})

// nodeRuntime is what podcheckpoint reads of the node: the pod table's
// sandboxes and the runtime's containers.
type nodeRuntime struct {
	*podtable.Table
	runtimeapi.RuntimeServiceClient
}

// dumpableMemory is containerd's count of what a capture of a container
// writes (capture.ContainerdTasks.DumpableMemory), when tasks gives it.
func dumpableMemory(tasks capture.Tasks) func(context.Context, string) (uint64, error) {
	if m, ok := tasks.(interface {
		DumpableMemory(context.Context, string) (uint64, error)
	}); ok {
		return m.DumpableMemory
	}
	return nil
}
