package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/server"
	"github.com/cri-shim/cri-shim/internal/version"
)

func newServeCmd() *cobra.Command {
	var cfgPath, listen, endpoint, level string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the CRI proxy daemon",
		Long: `Run the CRI proxy daemon: serve the kubelet's CRI calls on server.listen and
forward them to containerd at runtime.endpoint. Under systemd it sends READY=1
once the socket accepts calls and feeds the watchdog. Flags override the file.`,
		Example: "  cri-shim serve --config /etc/cri-shim/config.toml",
	}
	configFlag(cmd.Flags(), &cfgPath, config.DefaultPath, "TOML config file (absent default file: built-in defaults)")
	cmd.Flags().StringVar(&listen, "listen", "", "override server.listen: the shim's CRI socket")
	cmd.Flags().StringVar(&endpoint, "runtime-endpoint", "", "override runtime.endpoint: containerd's CRI socket")
	cmd.Flags().StringVar(&level, "log-level", "", "override log.level: debug, info, warn, error")
	cmd.RunE = runE(func(cmd *cobra.Command, _ []string) error {
		cfg, err := loadConfig(cmd, cfgPath, false)
		if err != nil {
			return err
		}
		if listen != "" {
			cfg.Server.Listen = listen
		}
		if endpoint != "" {
			cfg.Runtime.Endpoint = endpoint
		}
		if level != "" {
			cfg.Log.Level = level
		}
		if err := checkConfig(cfg); err != nil {
			return fmt.Errorf("invalid configuration:\n%w", err)
		}
		return serve(cfg, cfgPath)
	})
	return cmd
}

func serve(cfg config.Config, cfgPath string) error {
	log := newLogger(cfg.Log)
	procs := setMaxProcs(cfg.Server.MaxProcs)
	if err := setTimerSlack(cfg.Server.TimerSlack.Duration); err != nil {
		// Threads created from now on still inherit it from this one.
		log.Warn("server.timer_slack not applied to every thread (writing another thread's slack needs CAP_SYS_NICE)", "err", err)
	}
	memLimit := setMemoryLimit(cfg.Server.MemoryLimit)
	log.Info("starting", "version", version.String(), "config", cfgPath, "maxProcs", procs, "timerSlack", cfg.Server.TimerSlack.String(),
		"memoryLimit", memoryLimitString(memLimit))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	gid, err := server.LookupGroup(cfg.Server.SocketGroup)
	if err != nil {
		log.Error("exiting", "err", err)
		return exitError{1, nil}
	}
	sock, err := server.Listen(strings.TrimPrefix(cfg.Server.Listen, "unix://"), cfg.SocketModeBits(), gid)
	if err != nil {
		log.Error("exiting", "err", err)
		return exitError{1, nil}
	}
	defer sock.Close()
	upgrades := make(chan os.Signal, 1)
	signal.Notify(upgrades, syscall.SIGUSR2)
	for {
		upgrade, err := serveOnce(ctx, cfg, log, sock, upgrades)
		if err != nil {
			log.Error("exiting", "err", err)
			return exitError{1, nil} // logged
		}
		if !upgrade {
			log.Info("stopped")
			return nil
		}
		exe, err := os.Executable()
		if err == nil {
			log.Info("upgrading in place: the CRI socket stays open across the exec", "exe", exe)
			err = sock.Exec(exe, os.Args, os.Environ())
		}
		log.Error("in-place upgrade failed; serving on with this binary", "err", err)
	}
}

// serveOnce serves until ctx ends (false) or SIGUSR2 asks for an in-place
// upgrade (true): calls in flight finish, the features stop, the socket stays
// open for the binary exec'd next.
func serveOnce(ctx context.Context, cfg config.Config, log *slog.Logger, sock *server.Listener, upgrades <-chan os.Signal) (bool, error) {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var upgrade atomic.Bool
	go func() {
		select {
		case <-upgrades:
			upgrade.Store(true)
			cancel()
		case <-runCtx.Done():
		}
	}()
	err := server.Run(runCtx, cfg, log, server.Options{
		Listener: sock,
		Ready: func() {
			_, _ = daemon.SdNotify(false, daemon.SdNotifyReady)
			go watchdog(runCtx, cfg.Server.Listen, log)
			if cfg.Server.ReleaseStartupPages {
				if n, err := releaseStartupPages(); err != nil {
					log.Warn("server.release_startup_pages: start-up pages not all released", "released", n, "err", err)
				} else {
					log.Debug("start-up pages of the executable released", "bytes", n)
				}
			}
		},
	})
	return upgrade.Load() && ctx.Err() == nil, err
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

// setTimerSlack sets the kernel timer slack (PR_SET_TIMERSLACK) of every
// thread of the process to d; 0 leaves it alone. A thread created later
// inherits the slack of the thread that creates it, so once every thread has
// it, so do the runtime's future threads; threads that appear while the list
// is walked are caught by walking it again. The calling thread may set its own
// slack; another thread's needs CAP_SYS_NICE (proc(5), timerslack_ns).
func setTimerSlack(d time.Duration) error {
	if d <= 0 {
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(d.Nanoseconds()), 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_TIMERSLACK): %w", err)
	}
	val := []byte(strconv.FormatInt(d.Nanoseconds(), 10))
	done := map[string]bool{strconv.Itoa(unix.Gettid()): true}
	for pass := 0; pass < 10; pass++ {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		fresh := false
		for _, e := range ents {
			if done[e.Name()] {
				continue
			}
			// /proc/<tid> reaches a thread of this process by its id.
			err := os.WriteFile("/proc/"+e.Name()+"/timerslack_ns", val, 0)
			if err != nil && !errors.Is(err, os.ErrNotExist) { // a thread may end meanwhile
				return fmt.Errorf("thread %s: %w", e.Name(), err)
			}
			done[e.Name()], fresh = true, true
		}
		if !fresh {
			return nil
		}
	}
	return errors.New("threads kept appearing while their timer slack was set")
}

func newLogger(c config.LogConfig) *slog.Logger {
	lvl, _ := config.ParseLevel(c.Level) // validated
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "text" {
		return slog.New(slog.NewTextHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, opts))
}
