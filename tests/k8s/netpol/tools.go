//go:build tools

// Package tools pins the command build-netpol.sh compiles, so `go mod tidy` keeps its
// dependencies in go.sum. The build tag keeps this file out of every build.
package tools

import (
	_ "sigs.k8s.io/kube-network-policies/cmd"
)
