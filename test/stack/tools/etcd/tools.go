//go:build tools

// Package tools pins etcd (the package go.etcd.io/etcd/server/v3 is etcd's main).
package tools

import _ "go.etcd.io/etcd/server/v3"
