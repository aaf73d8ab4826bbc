package rpc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	agentv1 "github.com/nodectl/nodectl/api/agent/v1"
	"github.com/nodectl/nodectl/internal/badvalue"
)

// pki is a CA that signs certificates, written as PEM files in a test's directory.
type pki struct {
	t    *testing.T
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // the CA's certificate
}

func newPKI(t *testing.T, name string) *pki {
	p := &pki{t: t, dir: t.TempDir()}
	p.cert, p.key, p.file = p.issue(name, &x509.Certificate{IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign})
	return p
}

// issue makes a certificate from tmpl, signed by the CA (self-signed for the CA itself), and
// returns the certificate file, its key's file being file's name with .key.
func (p *pki) issue(name string, tmpl *x509.Certificate) (*x509.Certificate, *ecdsa.PrivateKey, string) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		p.t.Fatal(err)
	}
	if tmpl.SerialNumber, err = rand.Int(rand.Reader, big.NewInt(1<<62)); err != nil {
		p.t.Fatal(err)
	}
	tmpl.Subject = pkix.Name{CommonName: name}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	parent, signer := tmpl, key
	if p.cert != nil {
		parent, signer = p.cert, p.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		p.t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	keyDER, _ := x509.MarshalECPrivateKey(key)
	file := filepath.Join(p.dir, name+".crt")
	p.write(file, "CERTIFICATE", der)
	p.write(file+".key", "EC PRIVATE KEY", keyDER)
	return cert, key, file
}

func (p *pki) write(file, typ string, der []byte) {
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		p.t.Fatal(err)
	}
}

func (p *pki) server() string {
	_, _, f := p.issue("agent", &x509.Certificate{IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature})
	return f
}

func (p *pki) client(name string) string {
	_, _, f := p.issue(name, &x509.Certificate{ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		KeyUsage: x509.KeyUsageDigitalSignature})
	return f
}

func TestTCPWithMutualTLS(t *testing.T) {
	ca := newPKI(t, "ca")
	srv := ca.server()
	s := start(t, Config{TCP: "127.0.0.1:0", CertFile: srv, KeyFile: srv + ".key", ClientCAFile: ca.file}, newFake())
	addr := s.TCPAddr().String()
	ctx := context.Background()

	cl := ca.client("cli")
	c, closer, err := Dial(ctx, DialConfig{TCP: addr, CertFile: cl, KeyFile: cl + ".key", CAFile: ca.file})
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	if st, err := c.GetStatus(ctx, &agentv1.GetStatusRequest{}); err != nil || st.Node != "node-1" {
		t.Errorf("GetStatus over mTLS: %v, %v", st, err)
	}

	// The handshake fails, so does the call.
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	other := newPKI(t, "other-ca").client("intruder")
	for name, cfg := range map[string]*tls.Config{
		"no certificate":         {RootCAs: roots},
		"another CA certificate": {RootCAs: roots, GetClientCertificate: clientCert(t, other)},
		"TLS 1.2":                {RootCAs: roots, MaxVersion: tls.VersionTLS12, GetClientCertificate: clientCert(t, cl)},
	} {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := agentv1.NewAgentClient(conn).GetStatus(ctx, &agentv1.GetStatusRequest{}); err == nil {
			t.Errorf("%s: accepted", name)
		}
		conn.Close()
	}
}

func clientCert(t *testing.T, file string) func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(file, file+".key")
	if err != nil {
		t.Fatal(err)
	}
	return func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
}

// TCP without mTLS is refused, each missing file named, before anything listens.
func TestTCPNeedsEveryFile(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	_, err := New(Config{Socket: sock, TCP: "127.0.0.1:0", CertFile: "agent.crt"}, newFake())
	var bv *badvalue.Error
	if err == nil || !errors.As(err, &bv) || !strings.Contains(err.Error(), "KeyFile: required with TCP") ||
		!strings.Contains(err.Error(), "ClientCAFile: required with TCP") || strings.Contains(err.Error(), "CertFile:") {
		t.Errorf("New: %v", err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket was made: %v", err)
	}
	if _, _, err := Dial(context.Background(), DialConfig{TCP: "127.0.0.1:1", CertFile: "c", KeyFile: "k"}); err == nil ||
		!strings.Contains(err.Error(), "CAFile: required with TCP") {
		t.Errorf("Dial: %v", err)
	}
	if _, err := New(Config{Socket: sock, TCP: "127.0.0.1:0", CertFile: "missing.crt", KeyFile: "missing.key", ClientCAFile: "ca.crt"}, newFake()); err == nil ||
		!strings.HasPrefix(err.Error(), "CertFile missing.crt") {
		t.Errorf("New with missing files: %v", err)
	}
}
