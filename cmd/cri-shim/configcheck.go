package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/cri-shim/cri-shim/internal/config"
	"github.com/cri-shim/cri-shim/internal/ociartifact"
	"github.com/cri-shim/cri-shim/internal/server"
)

// checkConfig is what 'serve' refuses to start with and 'config check'
// reports: every value (config.Validate), then what the values name on this
// host: the socket group, the metrics host name, the files the shim reads
// (each registry's ca_file, registry_auth_file). kubernetes.kubeconfig may be
// missing: the shim waits for it (the kubelet's TLS bootstrap writes it
// after the shim has to be up).
func checkConfig(cfg config.Config) error {
	errs := []error{cfg.Validate()}
	if _, err := server.LookupGroup(cfg.Server.SocketGroup); err != nil {
		errs = append(errs, err)
	}
	if host, _, err := net.SplitHostPort(cfg.Metrics.Address); err == nil && host != "" && net.ParseIP(host) == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := net.DefaultResolver.LookupHost(ctx, host)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("metrics.address: host %q: %w", host, err))
		}
	}
	for i, r := range cfg.Checkpoint.Registries {
		if r.CAFile == "" {
			continue
		}
		if err := ociartifact.AppendCAFile(x509.NewCertPool(), r.CAFile); err != nil {
			errs = append(errs, fmt.Errorf("checkpoint.registries[%d].ca_file: %w", i, err))
		}
	}
	if f := cfg.Checkpoint.RegistryAuthFile; f != "" {
		if _, err := ociartifact.LoadKeychain(f); err != nil {
			errs = append(errs, fmt.Errorf("checkpoint.registry_auth_file: %w", err))
		}
	}
	return errors.Join(errs...)
}
