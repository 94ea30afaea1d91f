package config

import (
	"net"
	"strconv"
)

// validate refuses a metrics address net.Listen would not take, and
// profiling anywhere but on loopback: /debug/pprof hands out the process's
// memory profile and command line and lets anyone run a CPU profile.
func (m MetricsConfig) validate(bad func(field, format string, a ...any)) {
	if m.Address == "" {
		return
	}
	host, port, err := net.SplitHostPort(m.Address)
	if err != nil {
		bad("metrics.address", "must be host:port like \"127.0.0.1:9464\" or empty (disabled), got %q: %v", m.Address, err)
		return
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		bad("metrics.address", "port %q must be a number from 1 to 65535, got %q", port, m.Address)
	}
	if m.Profiling && !Loopback(host) {
		bad("metrics.profiling", "serves /debug/pprof on metrics.address %q, which is not a loopback address: use 127.0.0.1, [::1] or localhost as its host, or turn profiling off", m.Address)
	}
}

// Loopback reports whether host (no port) is localhost or a loopback
// address; "" (every interface) is not.
func Loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
