//go:build tools

// Package tools pins the kubelet the test stack builds for the matrix's kubelet 1.34.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
