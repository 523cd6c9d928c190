//go:build tools

// Package tools pins the command ../local-path.sh compiles, so `go mod tidy` keeps its dependencies in go.sum.
package tools

import (
	_ "github.com/rancher/local-path-provisioner"
)
