// pause holds a pod sandbox's namespaces: the first process of every pod. It reaps orphaned
// children (it is PID 1 of a shared PID namespace) and exits on SIGTERM or SIGINT, as the
// upstream pause container does. Built static (CGO_ENABLED=0) and run FROM scratch.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
