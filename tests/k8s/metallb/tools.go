//go:build tools

// Package tools pins the commands ../build.sh compiles, so `go mod tidy` keeps their dependencies in go.sum.
package tools

import (
	_ "go.universe.tf/metallb/controller"
	_ "go.universe.tf/metallb/speaker"
)
