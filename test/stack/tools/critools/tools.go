//go:build tools

// Package tools keeps critest's test-only dependencies (ginkgo, the validate
// suite) in this module's go.sum, since critest is built with `go test -c`.
package tools

import _ "sigs.k8s.io/cri-tools/pkg/validate"
