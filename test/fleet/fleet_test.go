package fleet

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cri-shim/cri-shim/internal/ckptrouter"
	"github.com/cri-shim/cri-shim/internal/podcheckpoint"
	"github.com/cri-shim/cri-shim/internal/procstat"
	cpv1 "github.com/cri-shim/cri-shim/pkg/apis/checkpoint/v1alpha1"
)

// Sizes of a run (environment): CRI_SHIM_FLEET_NODES (default 50),
// CRI_SHIM_FLEET_PHASE (seconds of the timed phases, default 60),
// CRI_SHIM_FLEET_CHURN (seconds of the churn phase, default the same).
const (
	podsPerNode = 30
	namespaces  = 10
)

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}

// phaseResult is one phase's figures.
type phaseResult struct {
	name                                     string
	seconds                                  float64
	counts                                   phaseCounts
	cpu                                      float64 // API server CPU seconds
	rssMiB                                   float64 // API server RSS at the end
	watchEvents                              float64 // apiserver_watch_events_total, this phase
	listFetched, listEvaluated, listReturned float64 // PodCheckpoint lists served from the cache
	pcpEvents                                float64 // PodCheckpoint watch events sent
	objects                                  int     // PodCheckpoints in the cluster at the end
	note                                     string
}

// BenchmarkFleet runs N simulated nodes against one real API server. Each
// node is a kubelet-like baseline (its pod watch and lease) and, from the
// sync phase on, the shim's API side: phases kubelets-only, sync, idle,
// churn, checkpoint wave, restart storm, and two kill -9s of the API server
// (the second with ten times the PodCheckpoints). It writes
// bench/results/fleet-<time>-n<N>.md.
func BenchmarkFleet(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (the stack's binaries and ports, as make test)")
	}
	n := envInt("CRI_SHIM_FLEET_NODES", 50)
	phase := time.Duration(envInt("CRI_SHIM_FLEET_PHASE", 60)) * time.Second
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	cp := startControlPlane(b)
	audit := &auditReader{path: cp.audit}
	admin := kubernetes.NewForConfigOrDie(withRate(cp.admin, 1000))
	adminPCP, err := podcheckpoint.NewClient(withRate(cp.admin, 1000))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := &fleet{b: b, ctx: ctx, admin: admin, pcp: adminPCP, n: n, process: os.Getenv("CRI_SHIM_FLEET_MODE") == "process"}
	f.setup()
	audit.read(b) // the setup's requests are the admin's

	// The router, as its service account.
	rcfg, _ := cp.pki.client(b, cp.host, "system:serviceaccount:cri-shim-system:cri-shim-router",
		[]string{"system:serviceaccounts", "system:serviceaccounts:cri-shim-system"})
	rcfg.QPS, rcfg.Burst = 20, 40 // cri-shim router's defaults
	go runRouter(ctx, b, rcfg, log)

	var results []phaseResult
	measure := func(name string, run func() string) phaseResult {
		before, pid := cp.scrape(b), cp.pid()
		cpu := procstat.CPUSeconds(pid)
		start := time.Now()
		note := run()
		r := phaseResult{name: name, seconds: time.Since(start).Seconds(), note: note}
		if cp.pid() != pid {
			// A new API server: its counters and CPU start at zero (the
			// killed one's last seconds are not counted).
			before, cpu = "", 0
		}
		r.cpu = procstat.CPUSeconds(cp.pid()) - cpu
		r.rssMiB = float64(procstat.StatusKB(cp.pid(), "VmRSS")) / 1024
		after := cp.scrape(b)
		r.watchEvents = metricSum(after, "apiserver_watch_events_total", "") - metricSum(before, "apiserver_watch_events_total", "")
		r.listFetched = metricSum(after, "apiserver_cache_list_fetched_objects_total", "podcheckpoints") - metricSum(before, "apiserver_cache_list_fetched_objects_total", "podcheckpoints")
		r.pcpEvents = metricSum(after, "apiserver_watch_events_total", "heckpoint") - metricSum(before, "apiserver_watch_events_total", "heckpoint")
		r.listEvaluated = metricSum(after, "apiserver_cache_list_evaluated_objects_total", "podcheckpoints") - metricSum(before, "apiserver_cache_list_evaluated_objects_total", "podcheckpoints")
		r.listReturned = metricSum(after, "apiserver_cache_list_returned_objects_total", "podcheckpoints") - metricSum(before, "apiserver_cache_list_returned_objects_total", "podcheckpoints")
		time.Sleep(time.Second) // the audit log's last lines
		r.counts = audit.read(b)
		results = append(results, r)
		b.Logf("phase %s: %.0f s, API server CPU %.1f s; %s", name, r.seconds, r.cpu, note)
		return r
	}

	measure("kubelets only", func() string {
		for _, node := range f.nodes {
			startBaselineNode(ctx, b, cp, node)
		}
		time.Sleep(phase)
		return "pod watch and lease of every node"
	})
	heapKubelets := heapPerNode(n)
	sims := make([]shimNode, n)
	root := b.TempDir()
	measure("sync", func() string {
		for i, node := range f.nodes {
			if f.process {
				sims[i] = startProcNode(b, cp, node, root)
			} else {
				sims[i] = startShimNode(ctx, b, cp, node, root, log)
			}
			for _, p := range f.podsOf(i) {
				sims[i].add(p)
			}
		}
		// Every tenth node also has a stale sandbox of a pod bound to the
		// next node, one with PodCheckpoints: same namespace and name,
		// another UID. Only the pod's own node may hold its objects.
		for i := 0; i+1 < n; i += 10 {
			stale := f.podsOf(i + 1)[0].DeepCopy()
			stale.UID = stale.UID + "-stale"
			sims[i].add(stale)
		}
		note := f.waitReady(10 * time.Minute)
		return note + "; " + f.claims()
	})
	measure("idle", func() string { time.Sleep(phase); return "" })
	heapShims := shimMemory(sims, n, heapKubelets)
	churnFor := time.Duration(envInt("CRI_SHIM_FLEET_CHURN", int(phase/time.Second))) * time.Second
	measure("churn", func() string {
		var samples []string
		every := max(churnFor/12, 30*time.Second)
		note := f.churn(sims, churnFor, every, func() {
			samples = append(samples, fmt.Sprintf("%.0f", shimMemory(sims, n, heapKubelets)))
		})
		return fmt.Sprintf("%s; shim memory per node %.0f KiB at the start, then every %s (KiB): %s", note, heapShims, every, strings.Join(samples, ", "))
	})
	measure("checkpoint wave", func() string {
		for i := range f.nodes {
			f.object(f.podsOf(i)[podsPerNode-1], "wave")
		}
		return f.waitReady(10 * time.Minute)
	})
	sourceNote := "spec.sourceImage race: not run (process mode cannot drive a restore)"
	if !f.process {
		race := measure("source-image restores", func() string { return f.sourceRace(sims) })
		sourceNote = sourceFigures(race.counts.side[shim])
	}
	stormNote := "restart storm: not run (process mode cannot drive restarts)"
	if !f.process {
		restartAt := map[string]time.Time{}
		storm := measure("restart storm", func() string {
			for i := range f.nodes {
				for _, p := range f.podsOf(i) {
					restartAt[p.Namespace+"/"+p.Name] = time.Now()
					sims[i].restart(p)
				}
			}
			deadline := time.Now().Add(5 * time.Minute)
			for !writersIdle(sims) && time.Now().Before(deadline) {
				time.Sleep(time.Second)
			}
			time.Sleep(5 * time.Second)
			return fmt.Sprintf("%d restarts; %s", len(restartAt), dropped(sims))
		})
		stormNote = stormFigures(storm.counts.side[shim], restartAt)
	}
	objectsNow := f.objects
	kill := func(name string) string {
		var ready time.Time
		r := measure(name, func() string {
			cp.stopAPIServer(syscall.SIGKILL)
			time.Sleep(5 * time.Second)
			cp.startAPIServer(b)
			cp.waitReady(b, 2*time.Minute)
			ready = time.Now()
			time.Sleep(75 * time.Second)
			return "75 s after the restarted API server was ready"
		})
		r.objects = objectsNow
		return name + ": " + resyncFigures(r.counts.side[shim], ready, &r)
	}
	killNote := kill("API server kill -9")
	// Ten times the PodCheckpoints, of pods no node runs: no node's
	// re-list may fetch more for it.
	extra := 9 * f.objects
	parallel(extra, 16, func(i int) {
		pc := &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("team-%d", i%namespaces), Name: fmt.Sprintf("elsewhere-%d", i)},
			Spec: cpv1.PodCheckpointSpec{SourcePodName: fmt.Sprintf("gone-%d", i)}}
		if _, err := adminPCP.Create(ctx, pc); err != nil {
			b.Error(err)
		}
	})
	objectsNow += extra
	audit.read(b)
	killNote10 := kill(fmt.Sprintf("API server kill -9, %d PodCheckpoints", 10*f.objects))

	report := renderReport(n, f.objects, f.mode(), phase, heapKubelets, heapShims, results, []string{sourceNote, stormNote, killNote, killNote10})
	b.Log("\n" + report)
	out := filepath.Join("../../bench/results", fmt.Sprintf("fleet-%s-n%d-%s.md", time.Now().UTC().Format("20060102-150405"), n, f.mode()))
	if err := os.WriteFile(out, []byte(report), 0o644); err != nil {
		b.Error(err)
	} else {
		b.Logf("wrote %s", out)
	}
}

// fleet is the cluster's objects as the harness made them.
type fleet struct {
	b       *testing.B
	ctx     context.Context
	admin   *kubernetes.Clientset
	pcp     *podcheckpoint.Client
	n       int
	process bool // the real binary per node (CRI_SHIM_FLEET_MODE=process)
	nodes   []string
	mu      sync.Mutex
	pods    [][]*corev1.Pod
	objects int
}

// setup makes the namespaces (with their default service accounts: no
// controller manager runs), the nodes, 30 pods bound to each (names
// repeated across namespaces) and 2 to 10 PodCheckpoints per node.
func (f *fleet) setup() {
	start := time.Now()
	for ns := range namespaces {
		name := fmt.Sprintf("team-%d", ns)
		_, _ = f.admin.CoreV1().Namespaces().Create(f.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		_, _ = f.admin.CoreV1().ServiceAccounts(name).Create(f.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	}
	f.nodes = make([]string, f.n)
	f.pods = make([][]*corev1.Pod, f.n)
	for i := range f.nodes {
		f.nodes[i] = fmt.Sprintf("fleet-%03d", i)
	}
	parallel(f.n, 16, func(i int) {
		node := f.nodes[i]
		if _, err := f.admin.CoreV1().Nodes().Create(f.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
			f.b.Error(err)
			return
		}
		mine := make([]*corev1.Pod, 0, podsPerNode)
		for j := range podsPerNode {
			p, err := f.admin.CoreV1().Pods(fmt.Sprintf("team-%d", i%namespaces)).Create(f.ctx, podOf(fmt.Sprintf("p%d-%d", i/namespaces, j), node), metav1.CreateOptions{})
			if err != nil {
				f.b.Error(err)
				return
			}
			mine = append(mine, p)
		}
		f.mu.Lock()
		f.pods[i] = mine
		f.mu.Unlock()
	})
	for i := range f.nodes {
		for k := range 2 + i%9 {
			f.object(f.podsOf(i)[k], fmt.Sprint(k))
		}
	}
	f.b.Logf("setup: %d nodes, %d pods, %d PodCheckpoints in %s", f.n, f.n*podsPerNode, f.objects, time.Since(start).Round(time.Second))
}

func (f *fleet) podsOf(i int) []*corev1.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.pods[i])
}

// object creates a PodCheckpoint of p.
func (f *fleet) object(p *corev1.Pod, suffix string) {
	pc := &cpv1.PodCheckpoint{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: "cp-" + p.Name + "-" + suffix},
		Spec: cpv1.PodCheckpointSpec{SourcePodName: p.Name}}
	if _, err := f.pcp.Create(f.ctx, pc); err != nil {
		f.b.Fatal(err)
	}
	f.objects++
}

func (f *fleet) mode() string {
	if f.process {
		return "process"
	}
	return "inprocess"
}

// waitReady waits until every object the harness made for a pod is Ready
// (in process mode: done, Ready or failed: its captures fail).
func (f *fleet) waitReady(within time.Duration) string {
	deadline := time.Now().Add(within)
	for {
		ready := readyObjects(f.ctx, f.b, f.pcp, f.process)
		if ready >= f.objects {
			return fmt.Sprintf("%d of %d PodCheckpoints Ready", ready, f.objects)
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("only %d of %d PodCheckpoints Ready after %s (%s)", ready, f.objects, within, f.notReady(5))
		}
		time.Sleep(2 * time.Second)
	}
}

// boundNodes maps each pod the harness bound, namespace/name, to its node.
func (f *fleet) boundNodes() map[string]string {
	bound := map[string]string{}
	for i := range f.nodes {
		for _, p := range f.podsOf(i) {
			bound[p.Namespace+"/"+p.Name] = f.nodes[i]
		}
	}
	return bound
}

// notReady describes at most n objects that are not Ready: routing label,
// holder, Ready reason and message, and where their source pod is bound.
func (f *fleet) notReady(n int) string {
	l, err := f.pcp.List(f.ctx, "", metav1.ListOptions{})
	if err != nil {
		return "objects not listed: " + err.Error()
	}
	bound := f.boundNodes()
	var out []string
	for _, pc := range l.Items {
		reason, msg := "no Ready condition", ""
		for _, c := range pc.Status.Conditions {
			if c.Type == cpv1.ConditionReady {
				reason, msg = c.Reason, c.Message
			}
		}
		if reason == cpv1.ReasonCompleted || pc.Spec.SourceImage != "" || len(out) >= n {
			continue
		}
		out = append(out, fmt.Sprintf("%s/%s: label %q, held by %q, %s %q, pod bound to %q", pc.Namespace, pc.Name,
			pc.Labels[cpv1.NodeLabel], pc.Status.NodeName, reason, msg, bound[pc.Namespace+"/"+pc.Spec.SourcePodName]))
	}
	return strings.Join(out, "; ")
}

// claims counts the objects held by a node their pod is not bound to.
func (f *fleet) claims() string {
	bound := f.boundNodes()
	l, err := f.pcp.List(f.ctx, "", metav1.ListOptions{})
	if err != nil {
		return "objects not listed: " + err.Error()
	}
	wrong := 0
	for _, pc := range l.Items {
		if node := bound[pc.Namespace+"/"+pc.Spec.SourcePodName]; pc.Status.NodeName != "" && pc.Status.NodeName != node {
			wrong++
		}
	}
	return fmt.Sprintf("objects held by a node their pod is not bound to: %d", wrong)
}

// churn replaces one pod per node per minute, spread evenly, for d; the
// node's runtime follows. It calls sample every sampleEvery and at the end.
func (f *fleet) churn(sims []shimNode, d, sampleEvery time.Duration, sample func()) string {
	replaced := 0
	every := time.Minute / time.Duration(f.n)
	end := time.Now().Add(d)
	nextSample := time.Now().Add(sampleEvery)
	defer sample()
	for i := 0; time.Now().Before(end); i++ {
		if now := time.Now(); now.After(nextSample) && now.Add(sampleEvery/2).Before(end) {
			sample()
			nextSample = now.Add(sampleEvery)
		}
		k := i % f.n
		j := podsPerNode - 2 - (i/f.n)%(podsPerNode-12) // never a pod with an object
		f.mu.Lock()
		old := f.pods[k][j]
		f.mu.Unlock()
		_ = f.admin.CoreV1().Pods(old.Namespace).Delete(f.ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		sims[k].remove(old)
		p, err := f.admin.CoreV1().Pods(old.Namespace).Create(f.ctx, podOf(old.Name+"r", f.nodes[k]), metav1.CreateOptions{})
		if err == nil {
			sims[k].add(p)
			f.mu.Lock()
			f.pods[k][j] = p
			f.mu.Unlock()
			replaced++
		}
		time.Sleep(every)
	}
	return fmt.Sprintf("%d pods replaced (one per node per minute)", replaced)
}

// stormFigures: status writes per restart and the readiness-gate lag (from
// each restart's report to its pod's first status patch after it).
func stormFigures(c *counts, restartAt map[string]time.Time) string {
	writes := c.byVerb["patch pods/status"]
	var lags []float64
	missing := 0
	for k, at := range restartAt {
		found := false
		for _, w := range c.statusAt[k] {
			if !w.Before(at.Add(-time.Millisecond)) {
				lags = append(lags, w.Sub(at).Seconds())
				found = true
				break
			}
		}
		if !found {
			missing++
		}
	}
	slices.Sort(lags)
	// How fast the API server took the storm's status writes: the gate lag
	// cannot be lower than the writes before a pod's own over that rate.
	var first, last time.Time
	for _, at := range c.statusAt {
		for _, w := range at {
			if first.IsZero() || w.Before(first) {
				first = w
			}
			if w.After(last) {
				last = w
			}
		}
	}
	rate := float64(writes) / max(last.Sub(first).Seconds(), 1)
	p := func(q float64) float64 {
		if len(lags) == 0 {
			return 0
		}
		return lags[int(q*float64(len(lags)-1))]
	}
	return fmt.Sprintf("restart storm: %d restarts, %.2f pods/status writes per restart, readiness-gate lag p50 %.2f s, p99 %.2f s, max %.2f s; pods with no status write: %d; status writes taken at %.0f/s (%d over %.1f s)",
		len(restartAt), float64(writes)/float64(max(1, len(restartAt))), p(0.5), p(0.99), p(1), missing, rate, writes, last.Sub(first).Seconds())
}

// resyncFigures: after the API server was ready again, how long until
// every node's last watch was open again, the most lists one node made, and
// the spread of the nodes' requests (busiest second over the mean second).
func resyncFigures(c *counts, ready time.Time, r *phaseResult) string {
	var last time.Time
	for _, t := range c.lastWatch {
		if t.After(last) {
			last = t
		}
	}
	maxLists, busiestNode := 0, ""
	for node, l := range c.lists {
		if l > maxLists {
			maxLists, busiestNode = l, node
		}
	}
	refusedAll, refusedMost := 0, 0
	for _, k := range c.refused {
		refusedAll += k
		refusedMost = max(refusedMost, k)
	}
	var busiestLists []string
	for _, l := range c.listLog[busiestNode] {
		busiestLists = append(busiestLists, l.String())
	}
	busiest, total := 0, 0
	for _, v := range c.perSecond {
		busiest = max(busiest, v)
		total += v
	}
	mean := float64(total) / float64(max(1, len(c.perSecond)))
	// The PodCheckpoint events the nodes' re-lists were sent: all of
	// them less the router's re-lists, each of every object.
	nodeLists := 0
	for _, l := range c.lists {
		nodeLists += l
	}
	toNodes := r.pcpEvents - float64(r.counts.routerLists*r.objects)
	perList := 0.0
	if c.pcpLists > 0 {
		perList = toNodes / float64(c.pcpLists)
	}
	return fmt.Sprintf("%d nodes' shims re-watched, the last %.1f s after the API server was ready; at most %d lists by one node (%d in all; %s: %s); lists and watch-lists refused (429, nothing listed): %d, at most %d by one node; busiest second %d requests, mean %.1f (ratio %.1f); %d PodCheckpoints in the cluster; PodCheckpoint watch events %.0f, the router's %d re-lists' share %d, so %.2f per node's PodCheckpoint list",
		len(c.lastWatch), last.Sub(ready).Seconds(), maxLists, nodeLists, busiestNode, strings.Join(busiestLists, "; "), refusedAll, refusedMost, busiest, mean, float64(busiest)/max(mean, 1), r.objects, r.pcpEvents, r.counts.routerLists, r.counts.routerLists*r.objects, perList)
}

// dropped sums the writes the nodes' API writers dropped.
func dropped(sims []shimNode) string {
	total := 0.0
	for _, s := range sims {
		total += s.dropped()
	}
	return fmt.Sprintf("writes dropped from the queues: %.0f", total)
}

func withRate(cfg *rest.Config, qps float32) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst = qps, int(qps)*2
	return c
}

// parallel runs f(0..n-1) on workers goroutines.
func parallel(n, workers int, f func(int)) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

func podOf(name, node string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}}}
}

// readyObjects counts the PodCheckpoints whose Ready condition is True (or,
// with failed, whose checkpoint failed).
func readyObjects(ctx context.Context, t testing.TB, c *podcheckpoint.Client, failed bool) int {
	l, err := c.List(ctx, "", metav1.ListOptions{})
	if err != nil {
		t.Logf("list PodCheckpoints: %v", err)
		return 0
	}
	ready := 0
	for _, pc := range l.Items {
		for _, cond := range pc.Status.Conditions {
			if cond.Type == cpv1.ConditionReady && (cond.Status == metav1.ConditionTrue || failed && cond.Reason == cpv1.ReasonFailed) {
				ready++
			}
		}
	}
	return ready
}

// runRouter is cri-shim router in this process.
func runRouter(ctx context.Context, t testing.TB, cfg *rest.Config, log *slog.Logger) {
	r, err := ckptrouter.NewForConfig(cfg, log)
	if err != nil {
		t.Error(err)
		return
	}
	r.Run(ctx, 2)
}

// heapPerNode is the Go heap in use after a collection, per simulated
// node (the harness's own share is small beside N nodes' informers).
func heapPerNode(n int) float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapInuse) / float64(n) / 1024
}

// shimMemory is the shim's memory per node in KiB: in this process the Go
// heap in use beyond the kubelet baselines' (heapKubelets per node); in
// process mode the mean RSS of the shim processes.
func shimMemory(sims []shimNode, n int, heapKubelets float64) float64 {
	total, procs := 0, 0
	for _, s := range sims {
		if p, ok := s.(*procNode); ok {
			total += procstat.StatusKB(p.cmd.Process.Pid, "VmRSS")
			procs++
		}
	}
	if procs > 0 {
		return float64(total) / float64(procs)
	}
	return heapPerNode(n) - heapKubelets
}

// writersIdle says whether no simulated node's API writer has a write waiting.
func writersIdle(sims []shimNode) bool {
	for _, s := range sims {
		if s.pending() > 0 {
			return false
		}
	}
	return true
}

// metricSum sums the samples of a metric in Prometheus text whose labels
// contain has ("" for all).
func metricSum(text, name, has string) float64 {
	sum := 0.0
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		if has != "" && !strings.Contains(line, has) {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// renderReport is the run's Markdown.
func renderReport(n, objects int, mode string, phase time.Duration, heapKubelets, heapShims float64, rs []phaseResult, notes []string) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Fleet run: %d simulated nodes (%s)\n\n", n, mode)
	fmt.Fprintf(&b, "%s, `make bench-fleet` (test/fleet, BenchmarkFleet). One etcd and kube-apiserver of the test stack; %d nodes in one process, each with its own client certificate as system:node:<name>, each a kubelet-like baseline (pod watch by spec.nodeName, lease every 10 s) and, from the sync phase on, the shim's API side; %d pods per node bound by spec.nodeName (names repeated across %d namespaces); %d PodCheckpoints for pods, routed by the router; timed phases of %s. Requests are counted from the API server's audit log (users system:node:*, split by user agent).\n\n",
		time.Now().UTC().Format(time.RFC3339), n, podsPerNode, namespaces, objects, phase)
	if mode == "process" {
		fmt.Fprintf(&b, "Go heap in use per node after a collection: kubelet baselines %.0f KiB. Shim processes: %.0f KiB RSS each after the idle phase.\n\n", heapKubelets, heapShims)
	} else {
		fmt.Fprintf(&b, "Go heap in use per node after a collection: kubelet baselines %.0f KiB; the shim's API side %.0f KiB more.\n\n", heapKubelets, heapShims)
	}
	b.WriteString("| phase | s | shim req/s per node (mean) | busiest node | shim watches per node | shim lists per node | kubelet req/s per node | kubelet watches per node | unscoped PodCheckpoint lists/watches | API server CPU s | API server RSS MiB | watch events sent | PodCheckpoint list objects fetched / evaluated / returned | note |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	open := [2]map[string]int{{}, {}}
	for _, r := range rs {
		if strings.HasPrefix(r.name, "API server kill") {
			open = [2]map[string]int{{}, {}} // the dead server's watches ended unrecorded
		}
		sc, kc := r.counts.side[shim], r.counts.side[kubelet]
		total, busiest := 0, 0
		for _, c := range sc.perNode {
			total += c
			busiest = max(busiest, c)
		}
		ktotal := 0
		for _, c := range kc.perNode {
			ktotal += c
		}
		lists := 0
		for _, l := range sc.lists {
			lists += l
		}
		watches := [2]int{}
		for side, c := range []*counts{sc, kc} {
			for node, d := range c.watchDelta {
				open[side][node] += d
			}
			for _, w := range open[side] {
				watches[side] += w
			}
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.3f | %.3f | %.2f | %.2f | %.3f | %.2f | %d | %.1f | %.0f | %.0f | %.0f / %.0f / %.0f | %s |\n", r.name, r.seconds,
			float64(total)/float64(n)/r.seconds, float64(busiest)/r.seconds, float64(watches[0])/float64(n), float64(lists)/float64(n),
			float64(ktotal)/float64(n)/r.seconds, float64(watches[1])/float64(n), len(r.counts.unscoped), r.cpu, r.rssMiB, r.watchEvents, r.listFetched, r.listEvaluated, r.listReturned, r.note)
	}
	b.WriteString("\n")
	for _, note := range notes {
		b.WriteString("- " + note + "\n")
	}
	b.WriteString("\n## Requests by verb and resource (all nodes)\n\n| phase | shim | kubelet baseline |\n|---|---|---|\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", r.name, verbs(r.counts.side[shim]), verbs(r.counts.side[kubelet]))
	}
	leases := 0
	for _, r := range rs {
		leases += r.counts.leaseTooMany
	}
	fmt.Fprintf(&b, "\n429 answers to the kubelets' lease writes: %d.\n", leases)
	return b.String()
}

func verbs(c *counts) string {
	keys := make([]string, 0, len(c.byVerb))
	for k := range c.byVerb {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys)+1)
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s: %d", k, c.byVerb[k]))
	}
	for code, k := range c.codes {
		parts = append(parts, fmt.Sprintf("HTTP %d: %d", code, k))
	}
	return strings.Join(parts, ", ")
}
