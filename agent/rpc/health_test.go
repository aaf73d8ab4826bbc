package rpc

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/internal/badvalue"
)

// The health-only listener answers as the API's health service does, in plaintext, and serves
// nothing of the API: it is for the kubelet's probe.
func TestHealthListener(t *testing.T) {
	s := start(t, Config{Health: "127.0.0.1:0"}, newFake())
	if s.HealthAddr() == nil {
		t.Fatal("no health address")
	}
	conn, err := grpc.NewClient(s.HealthAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h := healthpb.NewHealthClient(conn)
	want := func(st healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		r, err := h.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != st {
			t.Errorf("health: %v, want %v", r.Status, st)
		}
	}
	want(healthpb.HealthCheckResponse_NOT_SERVING)
	s.SetServing(true)
	want(healthpb.HealthCheckResponse_SERVING)

	_, err = agentv1.NewAgentClient(conn).GetStatus(context.Background(), &agentv1.GetStatusRequest{})
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("the API on the health listener: %v, want Unimplemented", err)
	}
}

func TestHealthListenerBadAddress(t *testing.T) {
	_, err := New(Config{Socket: t.TempDir() + "/agent.sock", Health: "256.0.0.1:x"}, newFake())
	var bv *badvalue.Error
	if !errors.As(err, &bv) || bv.Field != FieldHealth {
		t.Errorf("got %v, want a bad value of %s", err, FieldHealth)
	}
}

// The loopback listener serves the whole API in plaintext, and Dial reaches it by Loopback.
func TestLoopbackListener(t *testing.T) {
	s := start(t, Config{Loopback: "127.0.0.1:0"}, newFake())
	s.SetServing(true)
	c, closer, err := Dial(context.Background(), DialConfig{Loopback: s.LoopbackAddr().String()})
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	if _, err := c.GetStatus(context.Background(), &agentv1.GetStatusRequest{}); err != nil {
		t.Errorf("the API on the loopback listener: %v", err)
	}
}

// Only a loopback address is taken: the listener has no TLS.
func TestLoopbackListenerRefusesOtherAddresses(t *testing.T) {
	for _, addr := range []string{":9562", "0.0.0.0:9562", "192.0.2.1:9562", "example.com:9562", "9562"} {
		_, err := New(Config{Socket: t.TempDir() + "/agent.sock", Loopback: addr}, newFake())
		var bv *badvalue.Error
		if !errors.As(err, &bv) || bv.Field != FieldLoopback {
			t.Errorf("%s: got %v, want a bad value of %s", addr, err, FieldLoopback)
		}
	}
}
