package workload

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nodectl/nodectl/rundir"
)

// wakeAnswers runs Wake on stdin and returns the channel of its answers and of its result.
func wakeAnswers(ctx context.Context, t *testing.T, rounds int, stdin io.Reader) (<-chan Measurement, <-chan error) {
	t.Helper()
	outR, outW := io.Pipe()
	answers := make(chan Measurement, 4)
	done := make(chan error, 1)
	go func() {
		err := Wake(ctx, rounds, stdin, NewEmitter(outW))
		outW.Close()
		done <- err
	}()
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			var m Measurement
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Errorf("bad line %q: %v", sc.Text(), err)
			}
			answers <- m
		}
		close(answers)
	}()
	return answers, done
}

func TestWakeAnswersThePendingRequestAfterBooting(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	answers, done := wakeAnswers(ctx, t, 2*bootChunk+1, strings.NewReader("wake\n"))
	var m Measurement
	select {
	case m = <-answers:
	case err := <-done:
		t.Fatalf("wake returned before answering: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10s")
	}
	if m.Metric != rundir.MetricWakeBoot || m.Value <= 0 || m.T.IsZero() {
		t.Errorf("answer %+v, want a positive %s", m, rundir.MetricWakeBoot)
	}
	select {
	case err := <-done:
		t.Fatalf("wake exited after answering (%v); a sandbox stays up until stopped", err)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("stopped wake returned %v", err)
	}
	if _, more := <-answers; more {
		t.Error("wake answered more than once")
	}
}

func TestWakeWaitsForTheRequest(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	inR, inW := io.Pipe()
	defer inW.Close()
	answers, _ := wakeAnswers(ctx, t, 1, inR)
	select {
	case m := <-answers:
		t.Fatalf("wake answered %+v before any request", m)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := io.WriteString(inW, "wake\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-answers:
	case <-time.After(5 * time.Second):
		t.Fatal("no answer within 5s of the request")
	}
}

func TestWakeWithoutARequestFails(t *testing.T) {
	err := Wake(context.Background(), 1, strings.NewReader(""), NewEmitter(io.Discard))
	if err == nil || !strings.Contains(err.Error(), "no request") {
		t.Errorf("wake with an empty standard input returned %v, want an error saying no request arrived", err)
	}
	if err := Wake(context.Background(), 0, strings.NewReader("x\n"), NewEmitter(io.Discard)); err == nil {
		t.Error("wake with 0 boot rounds did not fail")
	}
}

func BenchmarkWakeBoot(b *testing.B) {
	for b.Loop() {
		cpuWork(DefaultBootRounds)
	}
}
