package podmgmt

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The connector dials only an address inside the pod's own network
// namespace: the pod IP the runtime reports for a ready sandbox that has a
// network namespace of its own. Nothing else is a fallback: the shim runs as
// root and sends the pod's token, so an address that may belong to the host
// (loopback, the host's own addresses, a host-network pod) could hand the
// token and the pod's events to whatever local process listens on the port.

// errHostNetwork refuses the channel of a pod that shares the node's network
// namespace: any address it could be reached at is the host's.
var errHostNetwork = errors.New("the pod uses the host's network namespace (hostNetwork); the channel would reach the host, not the pod")

// refusal is a reason the channel is refused for good (not retried); reason
// is the metric label.
type refusal struct {
	reason string
	err    error
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

// hostNetwork reports whether a sandbox config asks for the node's network
// namespace (the kubelet's hostNetwork: true).
func hostNetwork(cfg *runtimeapi.PodSandboxConfig) bool {
	return cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE
}

// podAddr is the address to dial for a sandbox's status: its pod IP and the
// declared port. A sandbox that is not ready or has no IP yet is an error to
// retry; one on the host's network, or whose IP is not a pod address, is a
// refusal.
func (m *Manager) podAddr(st *runtimeapi.PodSandboxStatus, port int) (string, error) {
	if st.GetLinux().GetNamespaces().GetOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE {
		return "", &refusal{"host_network", errHostNetwork}
	}
	if st.GetState() != runtimeapi.PodSandboxState_SANDBOX_READY {
		return "", fmt.Errorf("sandbox is %s; waiting for it to be ready", st.GetState())
	}
	s := st.GetNetwork().GetIp()
	if s == "" {
		return "", errors.New("the runtime reports no pod IP yet; waiting for one")
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return "", &refusal{"bad_address", fmt.Errorf("pod IP %q: %w", s, err)}
	}
	if err := m.checkAddr(ip.Unmap()); err != nil {
		if r := (*refusal)(nil); errors.As(err, &r) {
			return "", &refusal{r.reason, fmt.Errorf("pod IP %s: %w", ip, r.err)}
		}
		return "", err
	}
	return net.JoinHostPort(ip.Unmap().String(), fmt.Sprint(port)), nil
}

// podAddressOK refuses addresses that are not a pod's: loopback, unspecified,
// multicast, and any address assigned to one of the host's interfaces (the
// shim runs in the host's network namespace). Refusals are *refusal; other
// errors are retried.
func podAddressOK(ip netip.Addr) error {
	switch {
	case ip.IsLoopback():
		return &refusal{"host_address", errors.New("a loopback address is the host's")}
	case ip.IsUnspecified(), ip.IsMulticast():
		return &refusal{"bad_address", errors.New("not a unicast address")}
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return fmt.Errorf("listing the host's addresses: %w", err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if h, ok := netip.AddrFromSlice(n.IP); ok && h.Unmap() == ip {
				return &refusal{"host_address", errors.New("the address is assigned to the host itself")}
			}
		}
	}
	return nil
}
