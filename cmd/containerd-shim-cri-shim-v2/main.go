// Command containerd-shim-cri-shim-v2 is cri-shim's containerd runtime shim:
// containerd's runc shim (io.containerd.runc.v2) whose task creation restores
// the containers cri-shim marked from their checkpoint (internal/runtimeshim).
// It is set as the runtime_path of the runtime handler the pods use
// (deploy/containerd-cri-shim.toml; docs/restore-route.md).
package main

import (
	"context"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/containerd/v2/pkg/shutdown"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"

	"github.com/cri-shim/cri-shim/internal/restoremark"
	"github.com/cri-shim/cri-shim/internal/runtimeshim"
)

// The runc shim's "task" plugin (task/plugin/plugin_linux.go), with its
// service wrapped.
func init() {
	registry.Register(&plugin.Registration{
		Type:     plugins.TTRPCPlugin,
		ID:       "task",
		Requires: []plugin.Type{plugins.EventPlugin, plugins.InternalPlugin},
		InitFn: func(ic *plugin.InitContext) (interface{}, error) {
			pp, err := ic.GetByID(plugins.EventPlugin, "publisher")
			if err != nil {
				return nil, err
			}
			ss, err := ic.GetByID(plugins.InternalPlugin, "shutdown")
			if err != nil {
				return nil, err
			}
			inner, err := task.NewTaskService(ic.Context, pp.(shim.Publisher), ss.(shutdown.Service))
			if err != nil {
				return nil, err
			}
			return runtimeshim.New(inner, restoremark.Default()), nil
		},
	})
}

func main() {
	shim.Run(context.Background(), manager.NewShimManager("io.containerd.runc.v2"))
}
