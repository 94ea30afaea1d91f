package server

import (
	"context"
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cri-shim/cri-shim/internal/metrics"
)

// httpMux serves metrics, health and readiness. stateHealth is
// statefile.Healthy: while state writes fail, the shim refuses the steps
// they would record, so it is not ready.
func httpMux(mc *metrics.Collector, probe func(context.Context) error, stateHealth func() error, profiling bool) *http.ServeMux {
	mux := http.NewServeMux()
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(mc.Registry, promhttp.HandlerOpts{}))
	// healthz: the shim process serves. readyz: and the runtime behind it
	// answers, and the shim's state can be written.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		var reasons []string
		if err := stateHealth(); err != nil {
			reasons = append(reasons, "state not writable (restart and checkpoint steps are refused): "+err.Error())
		}
		if err := probe(r.Context()); err != nil {
			reasons = append(reasons, "runtime not ready: "+err.Error())
		}
		if len(reasons) > 0 {
			http.Error(w, strings.Join(reasons, "\n"), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
