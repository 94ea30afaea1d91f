// Package config is the shim's TOML configuration: documented structs,
// DefaultConfig, strict decoding and a Validate that names the offending field.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/cri-shim/cri-shim/internal/backoff"
)

// DefaultPath is where the daemon looks for its config when --config is not given.
const DefaultPath = "/etc/cri-shim/config.toml"

// Config is the whole configuration file.
type Config struct {
	StateDir string `toml:"state_dir" comment:"Directory for the shim's own state; created if missing."`
	// Server is the CRI endpoint the shim serves to the kubelet and crictl.
	Server ServerConfig `toml:"server"`
	// Runtime is the CRI endpoint of the runtime the shim forwards to.
	Runtime RuntimeConfig `toml:"runtime"`
	// Metrics is the HTTP endpoint for /metrics, /healthz and /readyz.
	Metrics MetricsConfig `toml:"metrics"`
	// Log configures structured logging.
	Log LogConfig `toml:"log"`
	// Backoff is the restart curve (KEP-4603) for every restart the shim governs.
	Backoff BackoffConfig `toml:"backoff"`
	// Checkpoint is pod checkpoint/restore (KEP-5823): where checkpoints may live
	// and how many are kept.
	Checkpoint CheckpointConfig `toml:"checkpoint"`
	// Kubernetes is the shim's connection to the API server (pod conditions,
	// events); without a kubeconfig the shim runs standalone.
	Kubernetes KubernetesConfig `toml:"kubernetes"`
}

// KubernetesConfig connects the shim to the API server with the node's own
// identity (docs/kubernetes-api.md). Everything the shim writes there is
// queued and written when the API answers; no CRI call waits for it.
type KubernetesConfig struct {
	// Kubeconfig is the kubelet's kubeconfig (its rotated client certificate
	// makes the shim system:node:<node>, confined by the Node authorizer and
	// NodeRestriction). Empty: standalone, the shim never talks to the API.
	Kubeconfig string `toml:"kubeconfig" comment:"The kubelet's kubeconfig (e.g. /etc/kubernetes/kubelet.conf); the shim acts as the node. Empty: standalone, no API server."`
	// NodeName is this node's name in the API; empty means the hostname,
	// trimmed and lowercased, as the kubelet picks it without --hostname-override.
	NodeName string  `toml:"node_name" comment:"This node's name in the API (the kubelet's --hostname-override); empty = the hostname, lowercased."`
	QPS      float32 `toml:"qps" comment:"Sustained requests per second to the API server."`
	Burst    int     `toml:"burst" comment:"Requests allowed in a burst above qps."`
	// PodCheckpoints turns the PodCheckpoint controller on: its watches,
	// its reconciler and restores naming an object. Off, a cluster without
	// the CRD (deploy/crd) or its RBAC costs the API server nothing.
	PodCheckpoints bool `toml:"pod_checkpoints" comment:"Reconcile PodCheckpoint objects of this node's pods, and restore by object name (needs deploy/crd and deploy/rbac); false turns that off."`
}

// Enabled reports whether the shim talks to an API server.
func (k KubernetesConfig) Enabled() bool { return k.Kubeconfig != "" }

// Node is the node name the shim acts for: node_name, or the hostname as
// the kubelet defaults it (k8s.io/component-helpers/node/util.GetHostname).
func (k KubernetesConfig) Node() (string, error) {
	if k.NodeName != "" {
		return k.NodeName, nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("kubernetes.node_name is empty and the hostname is unknown: %w", err)
	}
	if h = strings.ToLower(strings.TrimSpace(h)); h == "" {
		return "", errors.New("kubernetes.node_name is empty and so is the hostname")
	}
	return h, nil
}

// BackoffConfig is the KEP-4603 restart curve: initial_delay doubling up to
// max_delay, or up to the per-node max_container_restart_period when it is set.
type BackoffConfig struct {
	InitialDelay Duration `toml:"initial_delay" comment:"Wait before the first restart; doubles on each restart."`
	MaxDelay     Duration `toml:"max_delay" comment:"Cap of the curve when max_container_restart_period is not set."`
	// MaxContainerRestartPeriod is the per-node maximum in whole seconds (1..300),
	// like the kubelet's crashLoopBackOff.maxContainerRestartPeriod. Unset by default;
	// when set it replaces max_delay and lowers initial_delay to itself if needed.
	MaxContainerRestartPeriod *int `toml:"max_container_restart_period,omitempty" comment:"Per-node maximum, whole seconds 1..300 (unset by default). When set it replaces max_delay, and an initial_delay above it is lowered to it (KEP-4603)." example:"30"`
	// KubeletDeadContainers is the kubelet's --maximum-dead-containers-per-container:
	// a restart waits (at most a minute) while a container it restarts has
	// more exited instances than that plus four (backlog.go), so restarts
	// never outrun the kubelet's removal of exited instances.
	KubeletDeadContainers int `toml:"kubelet_dead_containers_per_container" comment:"The kubelet's --maximum-dead-containers-per-container (1..100): restarts wait for its removals."`
}

// ServerConfig is the shim's own CRI socket.
type ServerConfig struct {
	Listen      string `toml:"listen" comment:"Unix socket the kubelet and crictl connect to."`
	SocketMode  string `toml:"socket_mode" comment:"Octal permissions of the socket file."`
	SocketGroup string `toml:"socket_group" comment:"Group owning the socket (name or gid); empty keeps root's."`
	// MaxRecvMsgSize and MaxSendMsgSize bound a CRI message, in bytes. The kubelet uses 16 MiB.
	MaxRecvMsgSize  int      `toml:"max_recv_message_size" comment:"Largest CRI message accepted, bytes (kubelet: 16 MiB)."`
	MaxSendMsgSize  int      `toml:"max_send_message_size" comment:"Largest CRI message sent, bytes."`
	ShutdownTimeout Duration `toml:"shutdown_timeout" comment:"How long SIGTERM waits for calls in flight."`
	// MaxProcs is the shim's GOMAXPROCS: how many threads run its Go code at
	// once. The shim relays small messages at the kubelet's pace; with more
	// than one, every hand-off between its goroutines (a gRPC call crosses
	// about eight) may wake an idle thread, which costs more than the work.
	MaxProcs int `toml:"max_procs" comment:"Threads running the shim's Go code at once (GOMAXPROCS); 0 = one per CPU. The GOMAXPROCS environment variable overrides it."`
	// TimerSlack is the kernel timer slack of the shim's threads: how late the
	// kernel may end a timed sleep so that it can merge wake-ups. The Go
	// runtime's monitor thread sleeps 20 µs at a time after every wake-up of
	// an idle process; at the kernel's 50 µs slack that polling, and the
	// thread hand-offs it starts, cost a fifth of the shim's CPU under
	// restart load (docs/architecture.md, "Hot path"). Timed sleeps only:
	// a message that arrives wakes the shim at once whatever the slack.
	TimerSlack Duration `toml:"timer_slack" comment:"How late the kernel may wake the shim's sleeping threads, to merge wake-ups (0 to 100ms; 0 keeps the slack the shim was started with). Only timed sleeps wait; arriving calls are served at once."`
	// MemoryLimit is the Go runtime's soft memory limit (debug.SetMemoryLimit):
	// past it the garbage collector runs sooner instead of letting the heap
	// double. 0: none (the runtime's default).
	MemoryLimit int64 `toml:"memory_limit" comment:"Soft limit of the memory the shim's Go runtime manages, bytes (GOMEMLIMIT): past it garbage is collected sooner; 0 = no limit. The GOMEMLIMIT environment variable overrides it."`
	// ReleaseStartupPages unmaps, once the shim serves, the pages of its
	// executable mapped so far: most were touched once, by the
	// initialisation of its dependencies, and would count in its RSS for
	// good (docs/operations.md, "Memory").
	ReleaseStartupPages bool `toml:"release_startup_pages" comment:"Once serving, unmap the pages of the shim's executable that start-up mapped; what it runs again is mapped back on first use (the pages stay in the page cache)."`
}

// RuntimeConfig is the runtime the shim forwards to.
type RuntimeConfig struct {
	Endpoint          string   `toml:"endpoint" comment:"The runtime's CRI socket (containerd)."`
	ReconnectMaxDelay Duration `toml:"reconnect_max_delay" comment:"Longest wait between reconnect attempts while the runtime is down."`
}

// MetricsConfig is the HTTP side of the shim.
type MetricsConfig struct {
	Address   string `toml:"address" comment:"host:port for /metrics, /healthz, /readyz; empty disables."`
	Profiling bool   `toml:"profiling" comment:"Serve /debug/pprof on the metrics address too (keep that address on loopback)."`
}

// LogConfig configures logging.
type LogConfig struct {
	Level  string `toml:"level" comment:"debug, info, warn or error."`
	Format string `toml:"format" comment:"json or text."`
}

// Duration is a time.Duration written as a Go duration string ("5s", "1m30s").
type Duration struct{ time.Duration }

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("want a duration like \"5s\": %w", err)
	}
	d.Duration = v
	return nil
}

// MarshalText writes the duration as a Go duration string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// DefaultConfig is the configuration used when no file exists; every field of a
// file that omits it keeps this value.
func DefaultConfig() Config {
	return Config{
		StateDir: "/var/lib/cri-shim",
		Server: ServerConfig{
			Listen:          "/run/cri-shim/cri-shim.sock",
			SocketMode:      "0660",
			MaxRecvMsgSize:  16 << 20,
			MaxSendMsgSize:  16 << 20,
			ShutdownTimeout: Duration{10 * time.Second},
			MaxProcs:        1,
			TimerSlack:      Duration{5 * time.Millisecond},

			ReleaseStartupPages: true,
		},
		Runtime: RuntimeConfig{
			Endpoint:          "/run/containerd/containerd.sock",
			ReconnectMaxDelay: Duration{time.Second},
		},
		Metrics: MetricsConfig{Address: "127.0.0.1:9464"},
		Log:     LogConfig{Level: "info", Format: "json"},
		Backoff: BackoffConfig{InitialDelay: Duration{time.Second}, MaxDelay: Duration{time.Minute}, KubeletDeadContainers: 1},
		Checkpoint: CheckpointConfig{
			Root:          "/var/lib/cri-shim/checkpoints",
			MaxPerPod:     3,
			MaxTotalBytes: 20 << 30,
			// A namespace's share: its checkpoints never push out more
			// than this of another's (docs/security.md).
			MaxBytesPerNamespace: 5 << 30,
			MinInterval:          Duration{5 * time.Minute},
			// Two captures at once: a third pod's freeze waits rather
			// than compete for the disk and CPU with them.
			MaxConcurrentCaptures: 2,
			PodMinGap:             Duration{10 * time.Second},
			RestoreProvenance:     "cluster",
			PullMaxBytes:          16 << 30,
			PullMaxTotalBytes:     64 << 30,
			PullTimeout:           Duration{30 * time.Minute},
			PullWait:              Duration{time.Minute},
			ObjectWait:            Duration{5 * time.Second},
		},
		Kubernetes: KubernetesConfig{QPS: 5, Burst: 10, PodCheckpoints: true},
	}
}

// Load reads path over the defaults. A missing file at the default path is not an
// error (the defaults work); a missing file the operator named is.
func Load(path string, explicit bool) (Config, error) {
	cfg := DefaultConfig()
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) && !explicit {
			return cfg, nil
		}
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	if err := Decode(b, &cfg); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Decode parses TOML into cfg, refusing keys the shim does not know (a typo
// would otherwise silently leave a default in place) and values of the wrong
// type, each named at its full path.
func Decode(b []byte, cfg *Config) error {
	var doc map[string]any
	if err := toml.Unmarshal(b, &doc); err != nil {
		return decodeError(err)
	}
	unknown, wrong := shapeErrors(doc, reflect.TypeOf(*cfg))
	var errs []error
	if len(unknown) > 0 {
		errs = append(errs, fmt.Errorf("unknown field %s", strings.Join(unknown, ", ")))
	}
	for _, w := range wrong {
		errs = append(errs, errors.New(w))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// The shape check has passed; go-toml's strict mode stays as a backstop.
	d := toml.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(cfg); err != nil {
		return decodeError(err)
	}
	return nil
}

// decodeError says where go-toml found a problem: the keys it did not know,
// or the field and position of a syntax or type error.
func decodeError(err error) error {
	var sm *toml.StrictMissingError
	if errors.As(err, &sm) && len(sm.Errors) > 0 {
		keys := make([]string, 0, len(sm.Errors))
		for _, e := range sm.Errors {
			keys = append(keys, strings.Join(e.Key(), "."))
		}
		return fmt.Errorf("unknown field %s", strings.Join(keys, ", "))
	}
	var de *toml.DecodeError
	if errors.As(err, &de) {
		row, col := de.Position()
		key := strings.Join(de.Key(), ".")
		if key != "" {
			return fmt.Errorf("field %s (line %d, column %d): %s", key, row, col, de.Error())
		}
		return fmt.Errorf("line %d, column %d: %s", row, col, de.Error())
	}
	return err
}

// Validate refuses values the shim cannot run with, naming the field.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, a...)))
	}
	if !filepath.IsAbs(c.StateDir) {
		bad("state_dir", "must be an absolute path, got %q", c.StateDir)
	}
	if p := strings.TrimPrefix(c.Server.Listen, "unix://"); !filepath.IsAbs(p) {
		bad("server.listen", "must be an absolute unix socket path, got %q", c.Server.Listen)
	}
	if m, err := strconv.ParseUint(c.Server.SocketMode, 8, 32); err != nil || m > 0o777 {
		bad("server.socket_mode", "must be octal permissions like \"0660\", got %q", c.Server.SocketMode)
	}
	if c.Server.MaxRecvMsgSize < 4<<20 || c.Server.MaxRecvMsgSize > 1<<30 {
		bad("server.max_recv_message_size", "must be between 4 MiB and 1 GiB, got %d", c.Server.MaxRecvMsgSize)
	}
	if c.Server.MaxSendMsgSize < 4<<20 || c.Server.MaxSendMsgSize > 1<<30 {
		bad("server.max_send_message_size", "must be between 4 MiB and 1 GiB, got %d", c.Server.MaxSendMsgSize)
	}
	if c.Server.ShutdownTimeout.Duration < 0 || c.Server.ShutdownTimeout.Duration > 10*time.Minute {
		bad("server.shutdown_timeout", "must be between 0s and 10m, got %s", c.Server.ShutdownTimeout)
	}
	if c.Server.MaxProcs < 0 || c.Server.MaxProcs > 1024 {
		bad("server.max_procs", "must be 0 (one per CPU) to 1024, got %d", c.Server.MaxProcs)
	}
	if l := c.Server.MemoryLimit; l != 0 && (l < minMemoryLimit || l > maxMemoryLimit) {
		bad("server.memory_limit", "must be 0 (no limit) or from %d (16 MiB) to %d (64 GiB) bytes, got %d", int64(minMemoryLimit), int64(maxMemoryLimit), l)
	}
	if d := c.Server.TimerSlack.Duration; d < 0 || d > 100*time.Millisecond {
		bad("server.timer_slack", "must be between 0s (keep the inherited slack) and 100ms, got %s", c.Server.TimerSlack)
	}
	if p := strings.TrimPrefix(c.Runtime.Endpoint, "unix://"); !filepath.IsAbs(p) {
		bad("runtime.endpoint", "must be an absolute unix socket path, got %q", c.Runtime.Endpoint)
	}
	if strings.TrimPrefix(c.Runtime.Endpoint, "unix://") == strings.TrimPrefix(c.Server.Listen, "unix://") {
		bad("runtime.endpoint", "is the shim's own socket %q: the shim would forward to itself", c.Runtime.Endpoint)
	}
	if d := c.Runtime.ReconnectMaxDelay.Duration; d < 10*time.Millisecond || d > 2*time.Minute {
		bad("runtime.reconnect_max_delay", "must be between 10ms and 2m, got %s", c.Runtime.ReconnectMaxDelay)
	}
	c.Metrics.validate(bad)
	if _, err := ParseLevel(c.Log.Level); err != nil {
		bad("log.level", "%v", err)
	}
	if c.Log.Format != "json" && c.Log.Format != "text" {
		bad("log.format", "must be json or text, got %q", c.Log.Format)
	}
	c.Checkpoint.validate(bad)
	if k := c.Kubernetes; k.Kubeconfig != "" && !filepath.IsAbs(k.Kubeconfig) {
		bad("kubernetes.kubeconfig", "must be an absolute path or empty (standalone), got %q", k.Kubeconfig)
	}
	if n := c.Kubernetes.NodeName; n != "" {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			bad("kubernetes.node_name", "must be a node name (a DNS-1123 subdomain), got %q: %s", n, strings.Join(errs, "; "))
		}
	}
	if q := c.Kubernetes.QPS; q <= 0 || q > 1000 {
		bad("kubernetes.qps", "must be above 0 and at most 1000, got %g", q)
	}
	if b := c.Kubernetes.Burst; b < 1 || b > 10000 {
		bad("kubernetes.burst", "must be from 1 to 10000, got %d", b)
	}
	if n := c.Backoff.KubeletDeadContainers; n < 1 || n > 100 {
		bad("backoff.kubelet_dead_containers_per_container", "must be from 1 to 100, got %d", n)
	}
	if n := c.Backoff.MaxContainerRestartPeriod; n != nil && (*n < 1 || *n > 300) {
		bad("backoff.max_container_restart_period", "must be whole seconds from 1 to 300, got %d", *n)
	} else if _, err := c.BackoffCurve(); err != nil {
		bad("backoff", "%v", err)
	}
	return errors.Join(errs...)
}

// BackoffCurve resolves the effective restart curve (KEP-4603 conflict resolution).
func (c *Config) BackoffCurve() (backoff.Curve, error) {
	var nodeMax time.Duration
	if n := c.Backoff.MaxContainerRestartPeriod; n != nil {
		nodeMax = time.Duration(*n) * time.Second
	}
	return backoff.Resolve(c.Backoff.InitialDelay.Duration, c.Backoff.MaxDelay.Duration, nodeMax)
}

// ParseLevel maps a level name to slog's level.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("must be debug, info, warn or error, got %q", s)
}

// SocketModeBits returns Server.SocketMode as file permissions. Call after Validate.
func (c *Config) SocketModeBits() os.FileMode {
	m, _ := strconv.ParseUint(c.Server.SocketMode, 8, 32)
	return os.FileMode(m)
}

// The range of server.memory_limit: below 16 MiB the collector would run
// without pause (the shim's heap at rest is a few MiB, its frames in
// flight on a large node's relists more).
const (
	minMemoryLimit = 16 << 20
	maxMemoryLimit = 64 << 30
)
