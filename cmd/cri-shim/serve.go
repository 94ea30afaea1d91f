package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/server"
	"github.com/cri-shim/cri-shim/internal/version"
)

func serve(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfgPath := fs.String("config", config.DefaultPath, "TOML config file (absent default file: built-in defaults)")
	listen := fs.String("listen", "", "override server.listen: the shim's CRI socket")
	endpoint := fs.String("runtime-endpoint", "", "override runtime.endpoint: containerd's CRI socket")
	level := fs.String("log-level", "", "override log.level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "config" {
			explicit = true
		}
	})
	cfg, err := config.Load(*cfgPath, explicit)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cri-shim:", err)
		return 1
	}
	if *listen != "" {
		cfg.Server.Listen = *listen
	}
	if *endpoint != "" {
		cfg.Runtime.Endpoint = *endpoint
	}
	if *level != "" {
		cfg.Log.Level = *level
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "cri-shim: invalid configuration:\n%v\n", err)
		return 1
	}
	log := newLogger(cfg.Log)
	procs := setMaxProcs(cfg.Server.MaxProcs)
	log.Info("starting", "version", version.String(), "config", *cfgPath, "maxProcs", procs)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err = server.Run(ctx, cfg, log, server.Options{
		Ready: func() { _, _ = daemon.SdNotify(false, daemon.SdNotifyReady) },
	})
	if err != nil {
		log.Error("exiting", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// setMaxProcs applies server.max_procs unless the GOMAXPROCS environment
// variable is set (an operator's explicit override wins), and returns the
// value in effect.
func setMaxProcs(n int) int {
	if os.Getenv("GOMAXPROCS") == "" && n > 0 {
		runtime.GOMAXPROCS(n)
	}
	return runtime.GOMAXPROCS(0)
}

func newLogger(c config.LogConfig) *slog.Logger {
	lvl, _ := config.ParseLevel(c.Level) // validated
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "text" {
		return slog.New(slog.NewTextHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, opts))
}
