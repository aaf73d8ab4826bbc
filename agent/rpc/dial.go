package rpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"path/filepath"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
)

// DialConfig says where the agent is: its unix socket, or a TCP address with the client's
// certificate for mTLS.
type DialConfig struct {
	// Socket is the agent's unix socket; DefaultSocket when neither Socket nor TCP is set.
	Socket string
	// TCP is the host:port of an agent serving mTLS; used instead of Socket when set.
	TCP string
	// CertFile and KeyFile are the client's certificate and key (PEM), for TCP.
	CertFile, KeyFile string
	// CAFile holds the CA certificates (PEM) the agent's certificate must chain to, for TCP.
	CAFile string
	// Loopback is a loopback host:port served in plaintext: the agent's Config.Loopback, or
	// the local end of a port-forward to it. Used instead of Socket and TCP when set.
	Loopback string
}

// Dial connects to the agent and checks that it answers (its health service, within ctx). The
// closer closes the connection.
func Dial(ctx context.Context, cfg DialConfig) (agentv1.AgentClient, io.Closer, error) {
	target, where, creds, err := dialTarget(cfg)
	if err != nil {
		return nil, nil, err
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, nil, fmt.Errorf("agent at %s: %w", where, err)
	}
	// NewClient connects lazily: check now, so that a missing agent or a refused certificate
	// is told here rather than as the first call's failure.
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("agent at %s: %w", where, err)
	}
	return agentv1.NewAgentClient(conn), conn, nil
}

// dialTarget is the gRPC target, where it is for errors, and the credentials to use.
func dialTarget(cfg DialConfig) (target, where string, creds credentials.TransportCredentials, err error) {
	if cfg.Loopback != "" {
		return cfg.Loopback, cfg.Loopback, insecure.NewCredentials(), nil
	}
	if cfg.TCP != "" {
		if err := requireFiles(cfg.TCP, map[string]string{
			FieldCertFile: cfg.CertFile, FieldKeyFile: cfg.KeyFile, FieldCAFile: cfg.CAFile,
		}); err != nil {
			return "", "", nil, err
		}
		cert, err := loadKeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return "", "", nil, err
		}
		cas, err := loadCAs(FieldCAFile, cfg.CAFile)
		if err != nil {
			return "", "", nil, err
		}
		creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: cas, MinVersion: tls.VersionTLS13})
		return cfg.TCP, cfg.TCP, creds, nil
	}
	sock := cfg.Socket
	if sock == "" {
		sock = DefaultSocket
	}
	abs, err := filepath.Abs(sock)
	if err != nil {
		return "", "", nil, err
	}
	// gRPC would say the same in a transport error; this says what to do about it.
	c, err := net.Dial("unix", abs)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED):
		return "", "", nil, fmt.Errorf("no agent listening on %s: is `nodectl agent` running?", sock)
	case err != nil:
		return "", "", nil, fmt.Errorf("agent socket %s: %w", sock, err)
	}
	c.Close()
	return "unix://" + abs, sock, insecure.NewCredentials(), nil
}
