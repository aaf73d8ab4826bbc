// Command pause is the test cluster's only image content: with no argument it sleeps until
// signalled (a pod sandbox's pause container), with "burn" it spins on one CPU until signalled
// (a CPU-burning test pod). Static, so the image needs no libraries.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	if len(os.Args) > 1 && os.Args[1] == "burn" {
		go func() {
			for {
			}
		}()
	}
	<-stop
}
