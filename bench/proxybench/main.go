// Command proxybench measures cri-shim against containerd directly and against
// a bare grpc-go frame forwarder (bare.go), on the real node, interleaved in
// one run: the same calls, the same containers, the sides in rotating
// rounds, so drift of the machine hits all alike. A second bare forwarder
// (--control, on by default) is the null control: what two identical
// forwarders measure apart. It reports p50/p99 latency, throughput and the
// ratios, the RSS of the shim and the CPU per call of the shim and the bare
// forwarder, and writes them under --out.
//
//	proxybench --direct /run/.../containerd.sock --shim /run/.../cri-shim.sock --shim-pid N --out bench/results
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/procstat"
)

const image = "docker.io/library/busybox:cri-shim"

type result struct {
	Workload    string  `json:"workload"`
	Concurrency int     `json:"concurrency"`
	Side        string  `json:"side"`
	Calls       int     `json:"calls"`
	Seconds     float64 `json:"seconds"`
	Throughput  float64 `json:"throughput_per_s"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
	// RoundRatios is, on the shim's row, its calls/s over the bare
	// forwarder's in each round: the run's drift and noise, which the
	// pooled ratio hides.
	RoundRatios []float64 `json:"round_ratios,omitempty"`
	// CPUus is the forwarder's CPU per call in this workload (bare and
	// shim rows; each process is idle while the other sides run).
	CPUus float64 `json:"cpu_us_per_call,omitempty"`
	// Control is, on the shim's row, what a second bare forwarder (the
	// same program and settings as the first) measured in the same rounds:
	// its calls/s over the first's, pooled and per round, and its p99. Two
	// identical forwarders differ by this much on this machine: a shim/bare
	// ratio within it is not a difference the run can show.
	Control *control `json:"control,omitempty"`
}

type control struct {
	Ratio       float64   `json:"throughput_ratio"`
	RoundRatios []float64 `json:"round_ratios"`
	P99us       float64   `json:"p99_us"`
}

func main() {
	if len(os.Args) == 4 && os.Args[1] == "bare" {
		if err := bareMain(os.Args[2], os.Args[3]); err != nil {
			fmt.Fprintln(os.Stderr, "proxybench bare:", err)
			os.Exit(1)
		}
		return
	}
	direct := flag.String("direct", "", "containerd CRI socket")
	shim := flag.String("shim", "", "cri-shim socket")
	shimPID := flag.Int("shim-pid", 0, "cri-shim pid, for RSS and CPU")
	out := flag.String("out", "bench/results", "results directory")
	running := flag.Int("running", 100, "running containers (one pod each)")
	tracked := flag.Int("tracked", 100, "running containers in pods with a restart rule, created through the shim (its restart machinery tracks them)")
	created := flag.Int("created", 900, "extra created (not started) containers, for the 1000-container list")
	rounds := flag.Int("rounds", 6, "interleaved rounds per workload and concurrency")
	roundDur := flag.Duration("round", 700*time.Millisecond, "duration of one side of one round")
	largeRounds := flag.Int("large-rounds", 12, "interleaved rounds of the large list (a p99 needs more calls than its 75 calls/s give in the short rounds)")
	largeRoundDur := flag.Duration("large-round", 2*time.Second, "duration of one side of one round of the large list")
	withControl := flag.Bool("control", true, "also measure a second bare forwarder in every round (the null control: how far apart two identical forwarders measure)")
	pacedRate := flag.Int("paced-rate", 0, "instead of the comparison: ContainerStatus through the shim at this many calls/s (the kubelet's pace), printing the shim's CPU per call; nothing written")
	pacedFor := flag.Duration("paced-for", 20*time.Second, "how long --paced-rate runs")
	flag.Parse()
	if *direct == "" || *shim == "" {
		fmt.Fprintln(os.Stderr, "proxybench: --direct and --shim are required")
		os.Exit(2)
	}
	var err error
	if *pacedRate > 0 {
		err = paced(*direct, *shim, *shimPID, *running, *pacedRate, *pacedFor)
	} else {
		err = run(*direct, *shim, *shimPID, *out, *running, *tracked, *created, *rounds, *roundDur, *largeRounds, *largeRoundDur, *withControl)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxybench:", err)
		os.Exit(1)
	}
}

func dial(sock string) (runtimeapi.RuntimeServiceClient, *grpc.ClientConn, error) {
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return nil, nil, err
	}
	return runtimeapi.NewRuntimeServiceClient(cc), cc, nil
}

// dialBoth connects to containerd and to the shim; closeBoth closes both.
func dialBoth(directSock, shimSock string) (dc, sc runtimeapi.RuntimeServiceClient, closeBoth func(), err error) {
	dc, dconn, err := dial(directSock)
	if err != nil {
		return nil, nil, nil, err
	}
	sc, sconn, err := dial(shimSock)
	if err != nil {
		dconn.Close()
		return nil, nil, nil, err
	}
	return dc, sc, func() { dconn.Close(); sconn.Close() }, nil
}

func run(directSock, shimSock string, shimPID int, outDir string, nRunning, nTracked, nCreated, rounds int, roundDur time.Duration, largeRounds int, largeRoundDur time.Duration, withControl bool) error {
	ctx := context.Background()
	dc, sc, closeBoth, err := dialBoth(directSock, shimSock)
	if err != nil {
		return err
	}
	defer closeBoth()
	tmp, err := os.MkdirTemp("", "proxybench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	type side struct {
		name string
		c    runtimeapi.RuntimeServiceClient
	}
	// forwarder starts a bare forwarder named name and returns its side.
	forwarder := func(name string) (side, int, func(), error) {
		sock := filepath.Join(tmp, name+".sock")
		pid, stop, err := startBare(sock, directSock)
		if err != nil {
			return side{}, 0, nil, err
		}
		c, conn, err := dial(sock)
		if err != nil {
			stop()
			return side{}, 0, nil, err
		}
		return side{name, c}, pid, func() { conn.Close(); stop() }, nil
	}
	bare, barePID, stopBare, err := forwarder("bare")
	if err != nil {
		return err
	}
	defer stopBare()
	sides := []side{{"direct", dc}, bare, {"shim", sc}}
	if withControl {
		ctl, _, stopControl, err := forwarder("control")
		if err != nil {
			return err
		}
		defer stopControl()
		sides = append(sides, ctl)
	}

	var results []result
	calls := map[string]int64{}
	cpu0 := map[string]float64{"shim": cpuSeconds(shimPID), "bare": cpuSeconds(barePID)}
	measureFor := func(workload string, rounds int, roundDur time.Duration, call func(c runtimeapi.RuntimeServiceClient, i int) error) error {
		for _, conc := range []int{1, 16} {
			lat := map[string][]time.Duration{}
			busy := map[string]time.Duration{}
			var ratios, controlRatios []float64
			cpuBefore := map[string]float64{"shim": cpuSeconds(shimPID), "bare": cpuSeconds(barePID)}
			for r := range rounds {
				thr := map[string]float64{}
				for k := range sides { // the order rotates every round
					s := sides[(k+r)%len(sides)]
					l, d, err := drive(s.c, conc, roundDur, call)
					if err != nil {
						return fmt.Errorf("%s %s c=%d: %w", workload, s.name, conc, err)
					}
					lat[s.name] = append(lat[s.name], l...)
					busy[s.name] += d
					calls[s.name] += int64(len(l))
					thr[s.name] = float64(len(l)) / d.Seconds()
				}
				ratios = append(ratios, thr["shim"]/thr["bare"])
				if withControl {
					controlRatios = append(controlRatios, thr["control"]/thr["bare"])
				}
			}
			for _, s := range sides[:3] {
				l := lat[s.name]
				sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
				results = append(results, result{
					Workload: workload, Concurrency: conc, Side: s.name, Calls: len(l),
					Seconds: busy[s.name].Seconds(), Throughput: float64(len(l)) / busy[s.name].Seconds(),
					P50us: us(pct(l, 0.50)), P99us: us(pct(l, 0.99)),
				})
			}
			results[len(results)-1].RoundRatios = ratios
			if withControl {
				l := lat["control"]
				sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
				results[len(results)-1].Control = &control{
					Ratio:       float64(len(l)) / busy["control"].Seconds() / results[len(results)-2].Throughput,
					RoundRatios: controlRatios, P99us: us(pct(l, 0.99)),
				}
			}
			for i, pid := range map[int]int{2: barePID, 1: shimPID} {
				r := &results[len(results)-i]
				r.CPUus = (cpuSeconds(pid) - cpuBefore[r.Side]) * 1e6 / float64(r.Calls)
			}
			d, b, s := results[len(results)-3], results[len(results)-2], results[len(results)-1]
			fmt.Printf("  %-34s c=%-2d  p50 direct %6.0fµs bare %6.0fµs shim %6.0fµs | calls/s %7.0f %7.0f %7.0f | shim/bare thr %.3f\n",
				workload, conc, d.P50us, b.P50us, s.P50us, d.Throughput, b.Throughput, s.Throughput, s.Throughput/b.Throughput)
		}
		return nil
	}
	measure := func(workload string, call func(c runtimeapi.RuntimeServiceClient, i int) error) error {
		return measureFor(workload, rounds, roundDur, call)
	}

	if err := measure("Version", func(c runtimeapi.RuntimeServiceClient, _ int) error {
		_, err := c.Version(ctx, &runtimeapi.VersionRequest{})
		return err
	}); err != nil {
		return err
	}
	if nRunning == 0 {
		// --running 0: small calls only, for quick A/B runs of shim settings; nothing written.
		fmt.Printf("shim RSS %d kB\n", rssKB(shimPID))
		return nil
	}
	fmt.Printf("setting up %d pods with a running container each...\n", nRunning)
	t0 := time.Now()
	pods, runningIDs, err := setup(ctx, dc, nRunning)
	if err != nil {
		return err
	}
	fmt.Printf("  done in %v\n", time.Since(t0).Round(time.Second))
	listAll := func(want int) func(runtimeapi.RuntimeServiceClient, int) error {
		return func(c runtimeapi.RuntimeServiceClient, _ int) error {
			r, err := c.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
			if err == nil && len(r.Containers) != want {
				err = fmt.Errorf("listed %d containers, want %d", len(r.Containers), want)
			}
			return err
		}
	}
	if err := measure(fmt.Sprintf("ListContainers (%d running)", nRunning), listAll(nRunning)); err != nil {
		return err
	}
	if err := measure(fmt.Sprintf("ContainerStatus (%d running)", nRunning), func(c runtimeapi.RuntimeServiceClient, i int) error {
		_, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: runningIDs[i%len(runningIDs)]})
		return err
	}); err != nil {
		return err
	}
	rssRunning := rssKB(shimPID)

	// Pods the shim tracks (a restart rule each, created through it): the
	// restart machinery holds their state, and their calls take its routes.
	if nTracked > 0 {
		fmt.Printf("setting up %d pods with a restart rule, through the shim...\n", nTracked)
		t0 = time.Now()
		tracked, trackedIDs, err := setupWith(ctx, sc, nTracked, "tracked", map[string]string{
			"restart-rules.cri-shim.io/sleeper": `[{"action":"Restart","exitCodes":{"operator":"NotIn","values":[0]}}]`})
		if err != nil {
			return err
		}
		pods = append(pods, tracked...)
		fmt.Printf("  done in %v\n", time.Since(t0).Round(time.Second))
		if err := measure(fmt.Sprintf("Version (%d tracked pods)", nTracked), func(c runtimeapi.RuntimeServiceClient, _ int) error {
			_, err := c.Version(ctx, &runtimeapi.VersionRequest{})
			return err
		}); err != nil {
			return err
		}
		if err := measure(fmt.Sprintf("ContainerStatus (%d tracked)", nTracked), func(c runtimeapi.RuntimeServiceClient, i int) error {
			_, err := c.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: trackedIDs[i%len(trackedIDs)]})
			return err
		}); err != nil {
			return err
		}
	}

	fmt.Printf("creating %d more containers (not started)...\n", nCreated)
	t0 = time.Now()
	if err := createMore(ctx, dc, pods, nCreated); err != nil {
		return err
	}
	fmt.Printf("  done in %v\n", time.Since(t0).Round(time.Second))
	total := nRunning + nTracked + nCreated
	if err := measureFor(fmt.Sprintf("ListContainers (%d containers)", total), largeRounds, largeRoundDur, listAll(total)); err != nil {
		return err
	}
	cpu := map[string]float64{"shim": cpuSeconds(shimPID) - cpu0["shim"], "bare": cpuSeconds(barePID) - cpu0["bare"]}
	rssEnd, hwm := rssKB(shimPID), hwmKB(shimPID)
	return write(outDir, results, nRunning, total, rssRunning, rssEnd, hwm, cpu, calls)
}

// paced calls ContainerStatus through the shim at rate calls/s, spread over
// nRunning running containers, and prints the shim's CPU per call. At the
// kubelet's pace (a few hundred calls/s at most) every call wakes the shim
// from idle, so this measures what the kubelet really costs it per call,
// which flat-out rounds (batched wake-ups) understate.
func paced(directSock, shimSock string, shimPID, nRunning, rate int, d time.Duration) error {
	ctx := context.Background()
	dc, sc, closeBoth, err := dialBoth(directSock, shimSock)
	if err != nil {
		return err
	}
	defer closeBoth()
	if nRunning < 1 {
		nRunning = 1
	}
	_, ids, err := setup(ctx, dc, nRunning)
	if err != nil {
		return err
	}
	// One call to connect, then let the setup's work settle.
	if _, err := sc.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: ids[0]}); err != nil {
		return err
	}
	time.Sleep(2 * time.Second)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	cpu0, t0 := cpuSeconds(shimPID), time.Now()
	n := 0
	for time.Since(t0) < d {
		<-tick.C
		if _, err := sc.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: ids[n%len(ids)]}); err != nil {
			return err
		}
		n++
	}
	cpu, el := cpuSeconds(shimPID)-cpu0, time.Since(t0)
	fmt.Printf("paced ContainerStatus: %d calls in %.1f s (%.0f/s); shim CPU %.3f s, %.1f µs per call, %.2f %% of a core\n",
		n, el.Seconds(), float64(n)/el.Seconds(), cpu, cpu*1e6/float64(n), 100*cpu/el.Seconds())
	return nil
}

// drive runs call from conc goroutines for d and returns every call's latency.
func drive(c runtimeapi.RuntimeServiceClient, conc int, d time.Duration, call func(runtimeapi.RuntimeServiceClient, int) error) ([]time.Duration, time.Duration, error) {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		all      []time.Duration
		firstErr atomic.Pointer[error]
		seq      atomic.Int64
	)
	start := time.Now()
	deadline := start.Add(d)
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 4096)
			for time.Now().Before(deadline) {
				t := time.Now()
				if err := call(c, int(seq.Add(1))); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					break
				}
				local = append(local, time.Since(t))
			}
			mu.Lock()
			all = append(all, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return nil, 0, *e
	}
	return all, time.Since(start), nil
}

// parallel runs f(0..n-1) four at a time and returns the first error.
func parallel(n int, f func(i int) error) error {
	errs := make(chan error, n)
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(i); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func setup(ctx context.Context, c runtimeapi.RuntimeServiceClient, n int) ([]podRef, []string, error) {
	return setupWith(ctx, c, n, "bench", nil)
}

// setupWith runs n pods named prefix-NNN with the given annotations through
// c, each with one running container.
func setupWith(ctx context.Context, c runtimeapi.RuntimeServiceClient, n int, prefix string, annotations map[string]string) ([]podRef, []string, error) {
	pods := make([]podRef, n)
	ids := make([]string, n)
	err := parallel(n, func(i int) error {
		name := fmt.Sprintf("%s-%03d", prefix, i)
		cfg := &runtimeapi.PodSandboxConfig{
			Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "proxybench", Uid: "proxybench-" + name},
			LogDirectory: filepath.Join(os.TempDir(), "proxybench", name),
			Linux:        &runtimeapi.LinuxPodSandboxConfig{},
			Annotations:  annotations,
		}
		r, err := c.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
		if err != nil {
			return fmt.Errorf("RunPodSandbox: %w", err)
		}
		pods[i] = podRef{id: r.PodSandboxId, cfg: cfg}
		id, err := createContainer(ctx, c, pods[i], "sleeper", []string{"sleep", "100000"})
		if err != nil {
			return err
		}
		ids[i] = id
		_, err = c.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id})
		return err
	})
	return pods, ids, err
}

type podRef struct {
	id  string
	cfg *runtimeapi.PodSandboxConfig
}

func createContainer(ctx context.Context, c runtimeapi.RuntimeServiceClient, p podRef, name string, cmd []string) (string, error) {
	r, err := c.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId: p.id,
		Config: &runtimeapi.ContainerConfig{
			Metadata:    &runtimeapi.ContainerMetadata{Name: name},
			Image:       &runtimeapi.ImageSpec{Image: image},
			Command:     cmd,
			LogPath:     name + ".log",
			Annotations: map[string]string{"proxybench": "1"},
			Labels:      map[string]string{"io.kubernetes.container.name": name, "bench": "proxy"},
			Linux:       &runtimeapi.LinuxContainerConfig{},
		},
		SandboxConfig: p.cfg,
	})
	if err != nil {
		return "", fmt.Errorf("CreateContainer: %w", err)
	}
	return r.ContainerId, nil
}

func createMore(ctx context.Context, c runtimeapi.RuntimeServiceClient, pods []podRef, n int) error {
	return parallel(n, func(i int) error {
		_, err := createContainer(ctx, c, pods[i%len(pods)], fmt.Sprintf("idle-%04d", i), []string{"true"})
		return err
	})
}

func pct(l []time.Duration, p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	return l[int(float64(len(l)-1)*p)]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func rssKB(pid int) int          { return procstat.StatusKB(pid, "VmRSS") }
func hwmKB(pid int) int          { return procstat.StatusKB(pid, "VmHWM") }
func cpuSeconds(pid int) float64 { return procstat.CPUSeconds(pid) }

func write(dir string, rs []result, nRunning, total, rssRunning, rssEnd, hwm int, cpu map[string]float64, calls map[string]int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	host, _ := os.Hostname()
	var b strings.Builder
	fmt.Fprintf(&b, "# cri-shim proxy benchmark\n\n%s, %s, %d cores. containerd direct, through a bare grpc-go frame forwarder "+
		"(the floor for a proxy: an unknown-service handler relaying undecoded frames, nothing else) and through cri-shim, "+
		"interleaved rounds in one run (the order rotates every round).\n\n",
		time.Now().UTC().Format(time.RFC3339), host, numCPU())
	fmt.Fprintf(&b, "| workload | conc | direct p50 µs | bare p50 µs | shim p50 µs | shim - bare p50 µs | direct p99 µs | bare p99 µs | shim p99 µs | direct calls/s | bare calls/s | shim calls/s | shim/direct | bare/direct | shim/bare |\n")
	fmt.Fprintf(&b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i := 0; i+2 < len(rs); i += 3 {
		d, br, s := rs[i], rs[i+1], rs[i+2]
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.0f | %.0f | %+.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.3f | %.3f | %.3f |\n",
			d.Workload, d.Concurrency, d.P50us, br.P50us, s.P50us, s.P50us-br.P50us, d.P99us, br.P99us, s.P99us,
			d.Throughput, br.Throughput, s.Throughput, s.Throughput/d.Throughput, br.Throughput/d.Throughput, s.Throughput/br.Throughput)
	}
	fmt.Fprintf(&b, "\nCalls per side, and the shim's calls/s over the bare forwarder's in each round (median, lowest, highest), and CPU per call of each forwarder in that workload:\n\n")
	for i := 0; i+2 < len(rs); i += 3 {
		s := rs[i+2]
		r := slices.Sorted(slices.Values(s.RoundRatios))
		if len(r) > 0 {
			fmt.Fprintf(&b, "- %s, c=%d: %d calls; %.3f (%.3f to %.3f) over %d rounds; CPU per call %.0f µs, bare %.0f µs\n",
				s.Workload, s.Concurrency, s.Calls, r[len(r)/2], r[0], r[len(r)-1], len(r), s.CPUus, rs[i+1].CPUus)
		}
	}
	if rs[len(rs)-1].Control != nil {
		fmt.Fprintf(&b, "\nNull control: a second bare forwarder, the same program and settings as the first, measured in the same rounds. "+
			"Its calls/s over the first's (pooled; per round median, lowest, highest) and its p99 over the first's are how far apart two identical forwarders measure here: "+
			"a shim/bare ratio inside that spread is not a difference this run can show.\n\n")
		fmt.Fprintf(&b, "| workload | conc | shim/bare calls/s | control/bare calls/s | control/bare per round | shim p99 / bare p99 | control p99 / bare p99 |\n|---|---:|---:|---:|---|---:|---:|\n")
		for i := 0; i+2 < len(rs); i += 3 {
			br, s := rs[i+1], rs[i+2]
			if c := s.Control; c != nil {
				r := slices.Sorted(slices.Values(c.RoundRatios))
				fmt.Fprintf(&b, "| %s | %d | %.3f | %.3f | %.3f (%.3f to %.3f) | %.3f | %.3f |\n", s.Workload, s.Concurrency,
					s.Throughput/br.Throughput, c.Ratio, r[len(r)/2], r[0], r[len(r)-1], s.P99us/br.P99us, c.P99us/br.P99us)
			}
		}
	}
	fmt.Fprintf(&b, "\nShim RSS: %.1f MB with %d pods running; %.1f MB at the end (%d containers), peak %.1f MB.\n",
		float64(rssRunning)/1024, nRunning, float64(rssEnd)/1024, total, float64(hwm)/1024)
	perCall := map[string]float64{}
	for _, side := range []string{"shim", "bare"} {
		if calls[side] > 0 {
			perCall[side] = cpu[side] * 1e6 / float64(calls[side])
			fmt.Fprintf(&b, "%s CPU: %.2f s for %d calls through it (%.1f µs per call, all workloads).\n", side, cpu[side], calls[side], perCall[side])
		}
	}
	if perCall["bare"] > 0 {
		fmt.Fprintf(&b, "Shim/bare CPU per call: %.2f (goal 1.2 or less).\n", perCall["shim"]/perCall["bare"])
	}
	md := b.String()
	fmt.Print("\n" + md)
	stamp := time.Now().UTC().Format("20060102-150405")
	if err := os.WriteFile(filepath.Join(dir, "proxy-"+stamp+".md"), []byte(md), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "proxy-latest.md"), []byte(md), 0o644); err != nil {
		return err
	}
	j, _ := json.MarshalIndent(map[string]any{"results": rs, "shim_rss_kb_running": rssRunning, "shim_rss_kb_end": rssEnd, "shim_hwm_kb": hwm,
		"cpu_s": cpu, "calls": calls, "cpu_us_per_call": perCall}, "", "  ")
	return os.WriteFile(filepath.Join(dir, "proxy-latest.json"), j, 0o644)
}

func numCPU() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}
