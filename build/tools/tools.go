//go:build tools

// Package tools pins the packager `make release` builds.
package tools

import _ "github.com/goreleaser/nfpm/v2/cmd/nfpm"
