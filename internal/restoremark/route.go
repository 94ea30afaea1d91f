package restoremark

import (
	"encoding/json"
	"fmt"
	"path/filepath"
)

// RuntimeShimName is the binary of cri-shim's runtime shim; a handler whose
// runtime_path names it restores marked containers.
const RuntimeShimName = "containerd-shim-cri-shim-v2"

// criConfig is the part of containerd's CRI configuration that says which
// binary runs a handler's tasks: the "config" entry of a verbose CRI Status
// (internal/cri/server/status.go marshals its config; runtime_path is
// internal/cri/config's Runtime.Path, json "runtimePath").
type criConfig struct {
	Containerd struct {
		DefaultRuntimeName string `json:"defaultRuntimeName"`
		Runtimes           map[string]struct {
			RuntimeType string `json:"runtimeType"`
			RuntimePath string `json:"runtimePath"`
		} `json:"runtimes"`
	} `json:"containerd"`
}

// Route is how containerd runs a handler's tasks.
type Route struct {
	Handler     string // the handler's name ("" resolved to the default)
	RuntimeType string
	RuntimePath string // "" when containerd resolves the runtime type's binary
	// Restores reports whether the runtime is cri-shim's runtime shim.
	Restores bool
}

// HandlerRoute reads containerd's CRI configuration (JSON) for handler (""
// for containerd's default).
func HandlerRoute(configJSON, handler string) (Route, error) {
	var c criConfig
	if err := json.Unmarshal([]byte(configJSON), &c); err != nil {
		return Route{}, fmt.Errorf("containerd's CRI configuration: %w", err)
	}
	if handler == "" {
		handler = c.Containerd.DefaultRuntimeName
	}
	r, ok := c.Containerd.Runtimes[handler]
	if !ok {
		return Route{Handler: handler}, fmt.Errorf("containerd has no runtime handler %q", handler)
	}
	return Route{Handler: handler, RuntimeType: r.RuntimeType, RuntimePath: r.RuntimePath,
		Restores: r.RuntimePath != "" && filepath.Base(r.RuntimePath) == RuntimeShimName}, nil
}

// Handlers lists the handlers of containerd's CRI configuration, the default first.
func Handlers(configJSON string) ([]Route, error) {
	var c criConfig
	if err := json.Unmarshal([]byte(configJSON), &c); err != nil {
		return nil, fmt.Errorf("containerd's CRI configuration: %w", err)
	}
	var out []Route
	if r, err := HandlerRoute(configJSON, ""); err == nil {
		out = append(out, r)
	}
	for name := range c.Containerd.Runtimes {
		if name != c.Containerd.DefaultRuntimeName {
			r, _ := HandlerRoute(configJSON, name)
			out = append(out, r)
		}
	}
	return out, nil
}
