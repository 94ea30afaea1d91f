package server

import (
	"context"
	"reflect"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cri-shim/cri-shim/internal/events"
	"github.com/cri-shim/cri-shim/internal/podtable"
	"github.com/cri-shim/cri-shim/internal/proxy"
	"github.com/cri-shim/cri-shim/internal/store"
)

// feature is one entry of Run's list. Its value takes part in each of
// these it implements: the CRI calls (proxy hooks: proxy.Takes), a new
// pod's admission (podtable.Admitter), a sandbox gone
// (SandboxGone(id string)), the runtime's container events
// (OnEvent(*events.Event)), the metrics (Collectors()), and what runs
// beside the CRI server (Run(ctx), or run) under name, after the entries
// it uses and stopped before them (runGroup). A nil value (a feature this
// configuration has not: the pod status reporter without an API
// connection) takes part in nothing, and what uses it waits for nothing.
type feature struct {
	name  string
	value any
	run   func(context.Context)
	uses  []string
}

// wire takes fs in, in their order: a new pod is admitted by them, and a
// sandbox gone and a container event reach them, in this order. It returns
// the values that take CRI calls in the order a call crosses them: the
// list's last first.
func wire(table *podtable.Table, st *store.Store, feed *events.Feed, reg *prometheus.Registry, g *runGroup, fs []feature) []any {
	var calls []any
	for _, f := range fs {
		v := f.value
		if rv := reflect.ValueOf(v); v != nil && rv.Kind() == reflect.Pointer && rv.IsNil() {
			v = nil
		}
		if proxy.Takes(v) {
			calls = append([]any{v}, calls...)
		}
		if a, ok := v.(podtable.Admitter); ok {
			table.Register(a)
		}
		if s, ok := v.(interface{ SandboxGone(id string) }); ok {
			st.Subscribe(s.SandboxGone)
		}
		if e, ok := v.(interface{ OnEvent(*events.Event) }); ok {
			feed.Subscribe(e.OnEvent)
		}
		if c, ok := v.(interface{ Collectors() []prometheus.Collector }); ok {
			reg.MustRegister(c.Collectors()...)
		}
		if r, ok := v.(interface{ Run(context.Context) }); ok && f.run == nil {
			f.run = r.Run
		} else if f.run == nil {
			f.run = func(context.Context) {}
		}
		if f.name != "" {
			g.Add(f.name, f.run, f.uses...)
		}
	}
	return calls
}
