package main

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// watchdog keeps systemd's watchdog (WatchdogSec= in the unit) fed while the
// CRI socket accepts connections: every half interval it connects to the
// socket and, if that works, sends WATCHDOG=1. A shim whose accept loop is
// wedged stops feeding it and systemd restarts it. containerd being down does
// not stop it: the shim then still serves, answering Unavailable. Without a
// watchdog configured it does nothing.
func watchdog(ctx context.Context, socket string, log *slog.Logger) {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil || interval <= 0 {
		return
	}
	path := strings.TrimPrefix(socket, "unix://")
	log.Info("systemd watchdog on", "interval", interval.String())
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		dctx, cancel := context.WithTimeout(ctx, interval/4)
		c, err := (&net.Dialer{}).DialContext(dctx, "unix", path)
		cancel()
		if err != nil {
			log.Warn("watchdog: the CRI socket does not accept connections; not feeding systemd's watchdog", "err", err)
			continue
		}
		c.Close()
		_, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog)
	}
}
