# Sourced by run.sh: the node before cri-shim, as an operator has it. Unit
# files and drop-ins are the upstream ones: containerd's containerd.service
# (containerd/containerd, containerd.service), the kubelet package's
# kubelet.service and kubeadm's 10-kubeadm.conf (kubernetes/release,
# cmd/krel/templates/latest/{kubelet/kubelet.service,kubeadm/10-kubeadm.conf};
# test/testdata/kubeadm), whose KUBELET_EXTRA_ARGS comes from
# /etc/default/kubelet, which the package ships as "KUBELET_EXTRA_ARGS=".
# The kubelet runs standalone (static pods; no API server in the guest), so
# a drop-in empties kubeadm's kubeconfig arguments.

node_setup() {
	install -m 0755 "$P"/bin/{containerd,containerd-shim-runc-v2,ctr,crictl} /usr/local/bin/
	install -m 0755 "$P/bin/runc" /usr/local/sbin/runc
	install -m 0755 "$P/bin/kubelet" /usr/bin/kubelet
	cp -a "$P/criu" /opt/criu
	cat >/usr/local/sbin/criu <<'SH'
#!/bin/sh
# CRIU from Debian trixie with its own glibc (test/stack/install.sh).
exec /opt/criu/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path /opt/criu/usr/lib/x86_64-linux-gnu:/opt/criu/lib/x86_64-linux-gnu /opt/criu/usr/sbin/criu "$@"
SH
	chmod 0755 /usr/local/sbin/criu
	install -d /opt/cni /etc/cni/net.d /etc/containerd /etc/kubernetes/manifests /var/lib/kubelet /etc/systemd/system/kubelet.service.d
	ln -sfn /usr/lib/cni /opt/cni/bin
	cat >/etc/cni/net.d/10-bridge.conflist <<'JSON'
{"cniVersion": "1.0.0", "name": "vmnet", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
JSON
	cat >/etc/systemd/system/containerd.service <<'UNIT'
[Unit]
Description=containerd container runtime
Documentation=https://containerd.io
After=network.target dbus.service
[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999
[Install]
WantedBy=multi-user.target
UNIT
	# containerd's stock config with the systemd cgroup driver, as the
	# Kubernetes container-runtimes guide says for systemd hosts.
	containerd config default >/etc/containerd/config.toml
	sed -i 's/SystemdCgroup = false/SystemdCgroup = true/' /etc/containerd/config.toml
	grep -q 'SystemdCgroup = true' /etc/containerd/config.toml
	# The kubelet package's files (test/testdata/kubeadm, shared with
	# TestInstallKubeletKubeadmUnit), where the package puts them.
	install -D -m 0644 "$P/kubeadm/kubelet.service" /usr/lib/systemd/system/kubelet.service
	install -D -m 0644 "$P/kubeadm/10-kubeadm.conf" /usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf
	# Standalone: no API server in the guest, so no kubeconfig (a drop-in
	# after kubeadm's, by name).
	printf '[Service]\nEnvironment="KUBELET_KUBECONFIG_ARGS="\n' >/etc/systemd/system/kubelet.service.d/15-standalone.conf
	echo "KUBELET_EXTRA_ARGS=" >/etc/default/kubelet
	echo 'KUBELET_KUBEADM_ARGS="--node-ip=10.0.2.15"' >/var/lib/kubelet/kubeadm-flags.env
	cat >/var/lib/kubelet/config.yaml <<'YAML'
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
staticPodPath: /etc/kubernetes/manifests
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
failSwapOn: false
resolvConf: /etc/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%"}
YAML
	touch /etc/resolv.conf
	ip link set lo up
	# No network in the guest: a default route for the CNI bridge's
	# gateway logic and the kubelet's node IP.
	ip link add dummy0 type dummy && ip addr add 10.0.2.15/24 dev dummy0 && ip link set dummy0 up && ip route add default dev dummy0
	systemctl daemon-reload
	systemctl enable --now containerd.service
	wait_for 60 containerd ctr version
	ctr -n k8s.io images import --local "$P/images/busybox.tar" >/dev/null
	ctr -n k8s.io images import --local "$P/images/pause.tar" >/dev/null
	local sandbox
	sandbox=$(containerd config dump | grep -m1 -o "registry.k8s.io/pause:[0-9.]*")
	ctr -n k8s.io images tag localhost/cri-shim/pause:1 "$sandbox" >/dev/null
	systemctl enable --now kubelet.service
	wait_for 120 "the kubelet's healthz" bash -c 'exec 3<>/dev/tcp/127.0.0.1/10248 && printf "GET /healthz HTTP/1.0\r\n\r\n" >&3 && grep -q ok <&3'
}

# node_versions: one line naming what the node runs (sed, not head: a
# writer cut off by head fails its pipeline under pipefail).
node_versions() {
	echo "containerd $(containerd --version | cut -d' ' -f3), kubelet $(kubelet --version | cut -d' ' -f2), runc $(runc --version | sed -n '1s/.* //p'), CRIU $(criu --version | sed -n '1s/.* //p')"
}
