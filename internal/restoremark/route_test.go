package restoremark

import "testing"

const verboseConfig = `{"containerd":{"defaultRuntimeName":"runc","runtimes":{
 "runc":{"runtimeType":"io.containerd.runc.v2","runtimePath":"/usr/local/bin/containerd-shim-cri-shim-v2"},
 "kata":{"runtimeType":"io.containerd.kata.v2","runtimePath":""}}},"enableCDI":false}`

func TestHandlerRoute(t *testing.T) {
	r, err := HandlerRoute(verboseConfig, "")
	if err != nil || r.Handler != "runc" || !r.Restores {
		t.Fatalf("default handler: %+v %v", r, err)
	}
	r, err = HandlerRoute(verboseConfig, "kata")
	if err != nil || r.Restores {
		t.Fatalf("kata: %+v %v", r, err)
	}
	if _, err := HandlerRoute(verboseConfig, "gvisor"); err == nil {
		t.Fatal("an unknown handler was found")
	}
	plain := `{"containerd":{"defaultRuntimeName":"runc","runtimes":{"runc":{"runtimeType":"io.containerd.runc.v2"}}}}`
	if r, err := HandlerRoute(plain, ""); err != nil || r.Restores {
		t.Fatalf("containerd's own shim: %+v %v", r, err)
	}
	if _, err := HandlerRoute("{", ""); err == nil {
		t.Fatal("bad JSON accepted")
	}
	hs, err := Handlers(verboseConfig)
	if err != nil || len(hs) != 2 || hs[0].Handler != "runc" {
		t.Fatalf("handlers: %+v %v", hs, err)
	}
}

func FuzzHandlerRoute(f *testing.F) {
	f.Add(verboseConfig, "")
	f.Add(`{"containerd":{"runtimes":null}}`, "x")
	f.Fuzz(func(t *testing.T, cfg, handler string) {
		r, err := HandlerRoute(cfg, handler)
		if err == nil && r.Restores && r.RuntimePath == "" {
			t.Fatal("restores without a runtime path")
		}
	})
}
