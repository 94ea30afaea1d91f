#!/usr/bin/env bash
# Certificates and kubeconfigs of the test control plane, made with openssl:
# a CA; the API server's and the TLS registry's serving certificates
# (127.0.0.1, localhost); an admin
# client (O=system:masters); the PodCheckpoint router's (its service
# account's user name and groups); the kubelet's client (system:node:<node>, so the
# Node authorizer and NodeRestriction confine it to its node; one per node
# name, so a second node with CRI_SHIM_PKI set to the first's gets its own,
# signed by the same CA); the service-account key pair.
#   pki.sh   (sourced env.sh gives the paths; idempotent)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
umask 077
mkdir -p "$PKI"
cd "$PKI"

if [[ ! -f ca.crt ]]; then
	openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 365 \
		-subj "/CN=cri-shim-test-ca" 2>/dev/null
fi
# cert NAME SUBJECT [SAN]: a key and a certificate signed by the CA.
cert() {
	local name=$1 subj=$2 san=${3:-}
	[[ -f $name.crt ]] && return 0
	openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" -subj "$subj" 2>/dev/null
	local ext
	ext=$(mktemp)
	if [[ -n $san ]]; then
		printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" >"$ext"
	else
		printf 'extendedKeyUsage=clientAuth\n' >"$ext"
	fi
	openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$name.crt" -days 365 \
		-extfile "$ext" 2>/dev/null
	rm -f "$name.csr" "$ext"
}
cert apiserver "/CN=kube-apiserver" "IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"
cert registry "/CN=cri-shim-test-registry" "IP:127.0.0.1,DNS:localhost"
cert admin "/O=system:masters/CN=cri-shim-test-admin"
cert "kubelet-$NODE_NAME" "/O=system:nodes/CN=system:node:$NODE_NAME"
# The PodCheckpoint router, as the service account deploy/rbac/router.yaml
# binds, with the groups the service account token authenticator gives it
# (deploy/admission identifies the router by name and group). Named apart
# from the earlier group-less "router" certificate, which a kept PKI holds.
cert router-sa "/O=system:serviceaccounts/O=system:serviceaccounts:cri-shim-system/CN=system:serviceaccount:cri-shim-system:cri-shim-router"
if [[ ! -f sa.key ]]; then
	openssl genrsa -out sa.key 2048 2>/dev/null
	openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
fi

# kubeconfig FILE USER: a kubeconfig for the local API server.
kubeconfig() {
	cat >"$1" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: test
  context: {cluster: test, user: $2}
current-context: test
YAML
	chmod 600 "$1"
}
kubeconfig "$ADMIN_KUBECONFIG" admin
kubeconfig "$KUBELET_KUBECONFIG" "kubelet-$NODE_NAME"
kubeconfig "$ROUTER_KUBECONFIG" router-sa
