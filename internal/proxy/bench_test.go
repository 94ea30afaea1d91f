package proxy

import (
	"context"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// BenchmarkVersion compares a call to the fake runtime directly and through the
// proxy, both over real unix sockets in this process. The difference is the
// proxy's own cost per call (server side + client side + routing).
func BenchmarkVersion(b *testing.B) {
	fx := newFixture(b)
	for _, side := range []struct {
		name string
		c    runtimeapi.RuntimeServiceClient
	}{{"direct", runtimeapi.NewRuntimeServiceClient(fx.direct)}, {"proxy", runtimeapi.NewRuntimeServiceClient(fx.shim)}} {
		b.Run(side.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := side.c.Version(ctx, &runtimeapi.VersionRequest{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
