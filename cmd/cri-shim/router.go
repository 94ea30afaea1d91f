package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"

	"github.com/cri-shim/cri-shim/internal/ckptrouter"
	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/version"
)

func newRouterCmd() *cobra.Command {
	var kubeconfig, metricsAddr, level string
	var qps float32
	var burst, workers int
	cmd := &cobra.Command{
		Use:   "router",
		Short: "Route PodCheckpoint objects to the nodes of their source pods (one per cluster)",
		Long: `Route PodCheckpoint objects to the nodes of their source pods: label each
object no node holds yet with checkpoint.cri-shim.io/node=<node of its source
pod>, the only PodCheckpoints each node's shim watches. Run it once per
cluster (two at once agree), with the identity of deploy/router's service
account: it watches the bound pods and the PodCheckpoints of the cluster and
writes only that label (docs/podcheckpoint.md, "Routing").`,
		Example: "  cri-shim router --kubeconfig /etc/cri-shim/router.kubeconfig --metrics-address 127.0.0.1:9101",
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the router's identity (empty: the in-cluster service account)")
	cmd.Flags().StringVar(&metricsAddr, "metrics-address", "", "host:port of /metrics and /healthz (empty: none)")
	cmd.Flags().Float32Var(&qps, "qps", 20, "requests per second to the API server, sustained")
	cmd.Flags().IntVar(&burst, "burst", 40, "requests to the API server, in a burst")
	cmd.Flags().IntVar(&workers, "workers", 2, "objects labelled at once")
	cmd.Flags().StringVar(&level, "log-level", "info", "debug, info, warn or error")
	cmd.RunE = runE(func(cmd *cobra.Command, _ []string) error {
		if _, err := config.ParseLevel(level); err != nil {
			return usageErrorf("--log-level: %v", err)
		}
		if qps <= 0 || burst < 1 || workers < 1 {
			return usageErrorf("--qps, --burst and --workers must be positive")
		}
		return runRouter(kubeconfig, metricsAddr, level, qps, burst, workers)
	})
	return cmd
}

func runRouter(kubeconfig, metricsAddr, level string, qps float32, burst, workers int) error {
	log := newLogger(config.LogConfig{Level: level, Format: "json"}).With("component", "router")
	klog.SetSlogLogger(log.With("source", "client-go"))
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	// One token bucket for both clients.
	rc.QPS, rc.Burst = qps, burst
	rc.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(qps, burst)
	rc.Timeout = 15 * time.Second
	rc.UserAgent = "cri-shim-router/" + version.Version
	r, err := ckptrouter.NewForConfig(rc, log)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if metricsAddr != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(r.Collectors()...)
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
			if !r.Synced() {
				http.Error(w, "pods and PodCheckpoints not listed yet", http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("ok"))
		})
		l, err := net.Listen("tcp", metricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics-address: %w", err)
		}
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics endpoint stopped", "err", err)
			}
		}()
		defer hs.Close()
	}
	log.Info("routing PodCheckpoints", "version", version.String(), "server", rc.Host, "workers", workers)
	r.Run(ctx, workers)
	log.Info("stopped")
	return nil
}
