package kubeapi

import (
	"context"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/cri-shim/cri-shim/internal/config"
)

// API is the shim's API connection as the daemon runs it: the client and
// its writer. A nil *API is the standalone shim (no [kubernetes]
// kubeconfig): its Writer is nil, which drops everything.
type API struct {
	Client *Client
	Writer *Writer
}

// Open prepares the API connection of cfg, or returns nil when cfg has no
// kubeconfig. It does not contact the API server or read the kubeconfig;
// Run does.
func Open(cfg config.KubernetesConfig, log *slog.Logger) (*API, error) {
	if !cfg.Enabled() {
		return nil, nil
	}
	log = log.With("component", "kubeapi")
	c, err := New(cfg, log)
	if err != nil {
		return nil, err
	}
	// client-go logs through klog; send it to the shim's log.
	klog.SetSlogLogger(log.With("source", "client-go"))
	return &API{Client: c, Writer: NewWriter(c, WriterOptions{Log: log})}, nil
}

// Collectors are the metrics of the connection (none when standalone).
func (a *API) Collectors() []prometheus.Collector {
	if a == nil {
		return nil
	}
	return a.Writer.Collectors()
}

// Writes is the writer, nil when standalone (a nil *Writer drops what it
// is given, so features need not check).
func (a *API) Writes() *Writer {
	if a == nil {
		return nil
	}
	return a.Writer
}

// Run connects and writes until ctx is done.
func (a *API) Run(ctx context.Context) {
	if a == nil {
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a.Client.Connect(ctx) }()
	a.Writer.Run(ctx)
	wg.Wait()
}
