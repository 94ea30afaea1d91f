package e2e

// The steps of one bench-restart restart, in seconds from main's exit:
// cri-shim's restart trace (its debug log, internal/podstate/trace.go), the
// kubelet's PLEG events and kills (its log at --v 2), and the pod's own
// stamps. BenchmarkRestart writes the median of each step per side.

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// restartSteps reads the steps of bench pod name's one restart from the
// lines the shim and the kubelet logged meanwhile. A step seen more than
// once is numbered from its second time on ("#2").
func restartSteps(t testing.TB, name string, shimLines, kubeletLines []string) map[string]float64 {
	t.Helper()
	starts, exits := stamps(name)
	exit := mustStamp(t, name, exits, "exit", 1)
	out := map[string]float64{"pod: main ran": mustStamp(t, name, starts, "start", 2) - exit}
	for _, c := range []string{"init", "sidecar"} {
		if r := runStamps(name, c); len(r) >= 2 {
			out["pod: "+c+" ran"] = r[1] - exit
		}
	}
	seen := map[string]int{}
	put := func(label string, v float64) {
		seen[label]++
		if k := seen[label]; k > 1 {
			label = fmt.Sprintf("%s #%d", label, k)
		}
		out[label] = v
	}
	pod := "default/" + fullName(name)
	for _, l := range shimLines {
		var e struct {
			Msg, Pod, Step, Name, Via string
			SinceExitMs               float64
		}
		if !strings.Contains(l, "restart trace") || json.Unmarshal([]byte(l), &e) != nil || e.Msg != "podstate: restart trace" || e.Pod != pod {
			continue
		}
		put(strings.Join(strings.Fields("trace: "+e.Step+" "+e.Name+" "+e.Via), " "), e.SinceExitMs/1000)
	}
	// The kubelet's log stamps its wall clock; the pod's are the host's uptime.
	exitWall := time.Now().Add(-time.Duration((hostUptime() - exit) * float64(time.Second)))
	names := containerNames(t)
	for _, l := range kubeletLines {
		if !strings.Contains(l, `pod="`+pod+`"`) {
			continue
		}
		at, ok := klogTime(l)
		if !ok {
			continue
		}
		since := at.Sub(exitWall).Seconds()
		if since < -0.05 {
			continue // the pod's first start (10 ms stamps: a little slack)
		}
		if m := plegEventRe.FindStringSubmatch(l); m != nil {
			who := names[m[2]]
			if who == "" {
				who = "old"
			}
			put("kubelet: PLEG "+m[1]+" "+who, since)
		} else if m := killRe.FindStringSubmatch(l); m != nil {
			put("kubelet: kill "+m[1], since)
		}
	}
	return out
}

var (
	// kubelet.go syncLoopIteration, V(2): "SyncLoop (PLEG): event for pod"
	// pod="ns/name" event={"ID":"uid","Type":"ContainerDied","Data":"id"}.
	plegEventRe = regexp.MustCompile(`"SyncLoop \(PLEG\): event for pod".*"Type":"(\w+)","Data":"([0-9a-f]+)"`)
	// kuberuntime_container.go killContainer, V(2).
	killRe = regexp.MustCompile(`"Killing container with a grace period".*containerName="([^"]+)"`)
	// klog's header: I1129 12:34:56.789012 (local time, no year).
	klogRe = regexp.MustCompile(`^[IWE](\d{4} \d{2}:\d{2}:\d{2}\.\d{6})`)
)

// klogTime is when a kubelet log line was written.
func klogTime(l string) (time.Time, bool) {
	m := klogRe.FindStringSubmatch(l)
	if m == nil {
		return time.Time{}, false
	}
	at, err := time.ParseInLocation("0102 15:04:05.000000", m[1], time.Local)
	if err != nil {
		return time.Time{}, false
	}
	return at.AddDate(time.Now().Year(), 0, 0), true
}

// containerNames maps the IDs of the containers containerd has to
// name/attempt.
func containerNames(t testing.TB) map[string]string {
	out := map[string]string{}
	js, err := crictl(t, node.env["CONTAINERD_SOCK"], "ps", "-a", "-o", "json")
	if err != nil {
		return out
	}
	var l struct {
		Containers []struct {
			ID       string `json:"id"`
			Metadata struct {
				Name    string `json:"name"`
				Attempt int    `json:"attempt"`
			} `json:"metadata"`
		} `json:"containers"`
	}
	if json.Unmarshal([]byte(js), &l) == nil {
		for _, c := range l.Containers {
			out[c.ID] = fmt.Sprintf("%s/%d", c.Metadata.Name, c.Metadata.Attempt)
		}
	}
	return out
}

// stepTimes collects each step's times over a side's restarts.
type stepTimes struct {
	runs int
	at   map[string][]float64
}

func (s *stepTimes) add(steps map[string]float64) {
	if s.at == nil {
		s.at = map[string][]float64{}
	}
	s.runs++
	for k, v := range steps {
		s.at[k] = append(s.at[k], v)
	}
}

// table is the steps by median time, as markdown.
func (s *stepTimes) table() string {
	type row struct {
		step string
		v    []float64
	}
	var rows []row
	for k, v := range s.at {
		sort.Float64s(v)
		rows = append(rows, row{k, v})
	}
	sort.Slice(rows, func(i, j int) bool { return median(rows[i].v) < median(rows[j].v) })
	var sb strings.Builder
	fmt.Fprintf(&sb, "| step | seen in | median s | min s | max s |\n|---|---:|---:|---:|---:|\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "| %s | %d/%d | %.3f | %.3f | %.3f |\n", r.step, len(r.v), s.runs, median(r.v), r.v[0], r.v[len(r.v)-1])
	}
	return sb.String()
}

// stepsLine is one restart's steps in time order, for the bench's log.
func stepsLine(steps map[string]float64) string {
	keys := make([]string, 0, len(steps))
	for k := range steps {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return steps[keys[i]] < steps[keys[j]] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %.3f", k, steps[k])
	}
	return strings.Join(parts, "; ")
}
