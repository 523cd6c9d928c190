//go:build tools

// Package tools pins the command ../build.sh compiles, so `go mod tidy` keeps its dependencies in go.sum.
package tools

import _ "github.com/coredns/coredns"
