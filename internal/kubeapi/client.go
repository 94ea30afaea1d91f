// Package kubeapi is the shim's connection to the Kubernetes API server: a
// client with the node's own identity, and a Writer that queues what the
// shim writes there (pod conditions, events, other status) and writes it
// when the API answers. Nothing on a CRI call path waits for these writes:
// the features enqueue and return; the one read a CRI call waits for is
// bounded (internal/podcheckpoint's restore by name, docs/kubernetes-api.md).
package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cri-shim/cri-shim/internal/backoff"
	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/version"
)

// requestTimeout bounds one request, so a hung connection cannot stall the
// writer's queue for longer.
const requestTimeout = 15 * time.Second

// drainTimeout bounds how long the writer goes on writing what was queued
// once it is stopped (a shim's stop or in-place upgrade waits that long at
// most, and only while writes are queued and the API server answers).
const drainTimeout = time.Second

// loadRetry is how often Connect looks for a kubeconfig that is missing or
// unreadable: on a new node the kubelet writes it only after TLS
// bootstrapping, and the kubelet needs the shim's socket first.
const loadRetry = 5 * time.Second

// Client is the shim's API connection, acting as the node. Its Resources
// exist once Ready is closed.
type Client struct {
	// Node is the node the shim acts for.
	Node string

	cfg   config.KubernetesConfig
	log   *slog.Logger
	ready chan struct{}
	res   Resources
	rc    *rest.Config
	probe func(context.Context) error
}

// New prepares the client of cfg; Connect loads the kubeconfig. Neither
// needs the API server: one that is down at start must not keep the shim
// from serving CRI.
func New(cfg config.KubernetesConfig, log *slog.Logger) (*Client, error) {
	node, err := cfg.Node()
	if err != nil {
		return nil, err
	}
	return &Client{Node: node, cfg: cfg, log: log, ready: make(chan struct{})}, nil
}

// NewFor is a client that is ready at once on res (tests, fakes); its probe
// always succeeds.
func NewFor(res Resources, node string) *Client {
	c := &Client{Node: node, res: res, ready: make(chan struct{}), log: slog.New(slog.DiscardHandler),
		probe: func(context.Context) error { return nil }}
	close(c.ready)
	return c
}

// Connect loads the kubeconfig, retrying while it is missing or invalid,
// and then closes Ready. It returns when connected or when ctx is done.
func (c *Client) Connect(ctx context.Context) {
	logged := ""
	for {
		err := c.load()
		if err == nil {
			c.log.Info("Kubernetes API client ready", "kubeconfig", c.cfg.Kubeconfig, "node", c.Node, "server", c.rc.Host)
			close(c.ready)
			return
		}
		if msg := err.Error(); msg != logged { // once per distinct cause
			logged = msg
			lvl := slog.LevelWarn
			if errors.Is(err, fs.ErrNotExist) {
				lvl = slog.LevelInfo
			}
			c.log.Log(ctx, lvl, "Kubernetes API client not ready; status and events are queued until it is", "err", err, "retry", loadRetry)
		}
		backoff.Sleep(ctx, loadRetry)
		if ctx.Err() != nil {
			return
		}
	}
}

func (c *Client) load() error {
	rc, err := clientcmd.BuildConfigFromFlags("", c.cfg.Kubeconfig)
	if err != nil {
		return fmt.Errorf("kubernetes.kubeconfig %s: %w", c.cfg.Kubeconfig, err)
	}
	// One token bucket for every client made from this configuration
	// (rest.CopyConfig keeps the limiter): the shim's requests as a whole
	// stay within [kubernetes] qps and burst, however many clients it has,
	// and its turns go to namespaces fairly, pod status writes first
	// (fairlimit.go).
	rc.QPS, rc.Burst = c.cfg.QPS, c.cfg.Burst
	rc.RateLimiter = newFairLimiter(c.cfg.QPS, c.cfg.Burst)
	rc.Timeout = requestTimeout
	rc.UserAgent = "cri-shim/" + version.Version + " (node " + c.Node + ")"
	res, err := newRESTResources(rc)
	if err != nil {
		return fmt.Errorf("kubernetes.kubeconfig %s: %w", c.cfg.Kubeconfig, err)
	}
	c.res, c.rc = res, rc
	// /readyz may be read by every identity (the system:public-info-viewer role).
	c.probe = func(ctx context.Context) error {
		return res.core.Get().AbsPath("/readyz").Do(ctx).Error()
	}
	return nil
}

// Ready is closed once the Resources exist.
func (c *Client) Ready() <-chan struct{} { return c.ready }

// Resources are the calls on built-in resources; nil before Ready.
func (c *Client) Resources() Resources {
	select {
	case <-c.ready:
		return c.res
	default:
		return nil
	}
}

// REST is the client's configuration, for clients of other types
// (the PodCheckpoint CRD) with the same identity and limits; nil before
// Ready or for a client made by NewFor.
func (c *Client) REST() *rest.Config {
	select {
	case <-c.ready:
		return c.rc
	default:
		return nil
	}
}

// Probe reports whether the API server answers (its /readyz).
func (c *Client) Probe(ctx context.Context) error {
	select {
	case <-c.ready:
		return c.probe(ctx)
	default:
		return errors.New("kubeconfig not loaded yet")
	}
}
