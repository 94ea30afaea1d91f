package podstate

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/cri-shim/cri-shim/internal/restartrecord"
)

// syncBuffer is a log destination safe for the manager's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func logAt(buf *syncBuffer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: level}))
}

type traceLine struct {
	Msg, Pod, Sandbox, Step, Name, Via string
	SinceExitMs                        float64
}

// traceLines are the restart trace's lines in buf, in order.
func traceLines(t *testing.T, buf *syncBuffer) []traceLine {
	t.Helper()
	var out []traceLine
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var e traceLine
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if e.Msg == "podstate: restart trace" {
			out = append(out, e)
		}
	}
	return out
}

// A restart at debug level is traced step by step, from the exit to the
// swap and the kubelet's read after it, with the time since the exit
// never going back.
func TestRestartTraceSteps(t *testing.T) {
	var buf syncBuffer
	k, sb, ids := setupLogged(t, t.TempDir(), logAt(&buf, slog.LevelDebug))
	k.exit(ids["main"], 88)
	k.status(ids["main"]) // the kubelet's read classifies the exit
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	k.readPod(sb)
	lines := traceLines(t, &buf)
	var got []string
	prev := 0.0
	for _, l := range lines {
		if l.Sandbox != sb || l.Pod != "ns/p" {
			t.Errorf("trace line of %s (%s), want %s (ns/p)", l.Sandbox, l.Pod, sb)
		}
		if l.SinceExitMs < prev {
			t.Errorf("%s at %.3f ms, before the step logged before it (%.3f ms)", l.Step, l.SinceExitMs, prev)
		}
		prev = l.SinceExitMs
		if l.Step == traceStep || l.Step == traceWait {
			continue // how often the engine ran, and the backoff's wait: timing
		}
		got = append(got, strings.TrimSpace(l.Step+" "+l.Name))
	}
	want := []string{"exit seen", "rule matched", "shown set checked", "stop asked sidecar", "stopped sidecar",
		"create asked init", "created init", "started init", "exited init",
		"create asked sidecar", "created sidecar", "started sidecar", "running sidecar",
		"create asked main", "created main", "started main", "running main", "swapped", "kubelet read"}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Fatalf("trace:\n%s\nwant:\n%s", strings.Join(got, ", "), strings.Join(want, ", "))
	}
	if lines[0].Via != viaRead || lines[0].SinceExitMs < 0 {
		t.Errorf("first line %+v: want the exit seen by a read, at or after the exit", lines[0])
	}
}

// An exit from the event feed is traced as such.
func TestRestartTraceViaEvent(t *testing.T) {
	var buf syncBuffer
	k, sb, ids := setupLogged(t, t.TempDir(), logAt(&buf, slog.LevelDebug))
	k.exit(ids["main"], 88)
	k.event(sb, ids["main"], runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	lines := traceLines(t, &buf)
	if len(lines) == 0 || lines[0].Step != traceExitSeen || lines[0].Via != viaEvent {
		t.Fatalf("trace %+v: want it to begin with the exit seen via the event", lines)
	}
}

// At info level nothing of the trace is kept or logged.
func TestRestartTraceOnlyAtDebug(t *testing.T) {
	var buf syncBuffer
	k, sb, ids := setupLogged(t, t.TempDir(), logAt(&buf, slog.LevelInfo))
	k.exit(ids["main"], 88)
	k.event(sb, ids["main"], runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT)
	k.m.traces.Range(func(key, _ any) bool {
		t.Errorf("trace of %v kept at info level", key)
		return true
	})
	if err := runSteps(k.m, context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if k.m.pods.Get(sb).Restarts != 1 {
		t.Fatalf("restarts %d, want 1", k.m.pods.Get(sb).Restarts)
	}
	if strings.Contains(buf.String(), "restart trace") {
		t.Fatalf("trace logged at info level:\n%s", buf.String())
	}
}

// manualClock is a clock the test moves.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// The kubelet's calls are traced for traceTail after the swap, then the
// trace is dropped; a sandbox gone drops its trace at once.
func TestRestartTraceTail(t *testing.T) {
	var buf syncBuffer
	k, sb, _ := setupLogged(t, t.TempDir(), logAt(&buf, slog.LevelDebug))
	clock := &manualClock{now: time.Unix(1000, 0)}
	k.m.clock = clock
	k.m.with(sb, func(p *restartrecord.Pod) { k.m.traceBegin(p, clock.now.Add(-20*time.Millisecond), viaEvent) })
	clock.add(time.Second)
	k.m.traceEnd(sb, traceSwapped)
	clock.add(traceTail)
	k.readPod(sb)
	clock.add(time.Millisecond)
	k.readPod(sb)
	lines := traceLines(t, &buf)
	if len(lines) != 3 || lines[2].Step != traceKubeRead {
		t.Fatalf("trace %+v: want the exit, the swap and one read within the tail", lines)
	}
	for i, want := range []float64{20, 1020, 1020 + float64(traceTail.Milliseconds())} {
		if lines[i].SinceExitMs != want {
			t.Errorf("%s at %.3f ms since the exit, want %.0f", lines[i].Step, lines[i].SinceExitMs, want)
		}
	}
	if _, ok := k.m.traces.Load(sb); ok {
		t.Fatal("trace kept after its tail")
	}
	k.m.with(sb, func(p *restartrecord.Pod) { k.m.traceBegin(p, clock.now, viaEvent) })
	k.m.SandboxGone(sb)
	if _, ok := k.m.traces.Load(sb); ok {
		t.Fatal("trace kept after the sandbox went")
	}
}
