package workload

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// DefaultBootRounds sizes the wake sandbox's boot: rounds of the victim's CPU work, about
// 150 ms of one CPU on this project's machines (40M rounds take 60 ms there), the order of a
// sandbox runtime's own start-up.
const DefaultBootRounds = 100_000_000

// bootChunk is how many rounds the boot does between looks at ctx, so that a sandbox stopped
// while it boots stops within about a millisecond of CPU, even under a small quota.
const bootChunk = 1_000_000

// Wake stands in for a sandbox woken by a request: it boots (bootRounds of CPU-bound
// initialisation), then reads the request that has been pending on in since its launch (one
// line) and answers it by emitting how long it took from its go to the answer. Then it idles
// until ctx is done, as a sandbox stays up after its first request.
func Wake(ctx context.Context, bootRounds int, in io.Reader, e *Emitter) error {
	if bootRounds < 1 {
		return fmt.Errorf("wake: %d boot rounds: want at least 1", bootRounds)
	}
	start := time.Now()
	for left := bootRounds; left > 0; left -= bootChunk {
		if ctx.Err() != nil {
			return nil
		}
		cpuWork(min(left, bootChunk))
	}
	// The read cannot be interrupted, so it runs aside and a stop does not wait for it.
	got := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(in).ReadString('\n')
		if errors.Is(err, io.EOF) && line != "" {
			err = nil // a last line without its newline is still a request
		}
		got <- err
	}()
	select {
	case <-ctx.Done():
		return nil
	case err := <-got:
		if errors.Is(err, io.EOF) {
			return errors.New("wake: no request arrived on standard input")
		}
		if err != nil {
			return fmt.Errorf("wake: reading the request: %w", err)
		}
	}
	now := time.Now()
	if err := e.Emit(now, rundir.MetricWakeBoot, now.Sub(start).Seconds()); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
