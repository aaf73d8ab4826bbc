package rpc

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/nodectl/nodectl/internal/badvalue"
)

// listenUnix listens on the socket at path, root's alone: its directory is made 0700 when
// missing and the socket 0600.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, badvalue.New(FieldSocket, path, err)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, badvalue.New(FieldSocket, path, err)
	}
	// Listen made it with the umask's mode; a directory we did not make may let others in.
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, badvalue.New(FieldSocket, path, err)
	}
	return l, nil
}

// removeStale removes the socket at path that a previous agent left behind, and refuses to
// take the place of one that still answers or of anything not a socket.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return badvalue.New(FieldSocket, path, err)
	case fi.Mode().Type() != fs.ModeSocket:
		return badvalue.Errorf(FieldSocket, path, "exists and is not a socket; not removing it")
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	switch {
	case err == nil:
		c.Close()
		return badvalue.Errorf(FieldSocket, path, "another agent is listening on it: stop it first, or use another socket")
	case !errors.Is(err, syscall.ECONNREFUSED):
		return badvalue.Errorf(FieldSocket, path, "cannot tell whether an agent is listening on it: %w", err)
	}
	if err := os.Remove(path); err != nil {
		return badvalue.Errorf(FieldSocket, path, "removing the stale socket: %w", err)
	}
	return nil
}

// CheckLoopback refuses an address that is not on loopback (127.0.0.1:PORT, [::1]:PORT or
// localhost:PORT), for what is served without TLS or authentication: the plaintext API, the
// profiles.
func CheckLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return errors.New("must be a loopback address (127.0.0.1:PORT, [::1]:PORT or localhost:PORT): it is served without TLS or client certificates")
	}
	return nil
}

// listenLoopback listens on addr, which must be a loopback address: it is served without TLS.
func listenLoopback(addr string) (net.Listener, error) {
	if err := CheckLoopback(addr); err != nil {
		return nil, badvalue.New(FieldLoopback, addr, err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, badvalue.New(FieldLoopback, addr, err)
	}
	return l, nil
}

// serverTLS is the TCP listener's mTLS: TLS 1.3, and a client certificate signed by a CA of
// ClientCAFile required of every client.
func serverTLS(cfg Config) (credentials.TransportCredentials, error) {
	if err := requireFiles(cfg.TCP, map[string]string{
		FieldCertFile: cfg.CertFile, FieldKeyFile: cfg.KeyFile, FieldClientCAFile: cfg.ClientCAFile,
	}); err != nil {
		return nil, err
	}
	cert, err := loadKeyPair(cfg.CertFile, cfg.KeyFile)
	if err != nil {
		return nil, err
	}
	cas, err := loadCAs(FieldClientCAFile, cfg.ClientCAFile)
	if err != nil {
		return nil, err
	}
	return credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    cas,
		MinVersion:   tls.VersionTLS13,
	}), nil
}

// requireFiles says which of the files mTLS on the TCP address needs are not set, each as its
// own error so that the CLI names each flag.
func requireFiles(tcp string, files map[string]string) error {
	var errs []error
	for _, f := range []string{FieldCertFile, FieldKeyFile, FieldClientCAFile, FieldCAFile} {
		if v, ok := files[f]; ok && v == "" {
			errs = append(errs, badvalue.Errorf(f, "", "required with TCP %s: TCP is served with mTLS only", tcp))
		}
	}
	return errors.Join(errs...)
}

func loadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return cert, badvalue.New(FieldCertFile, certFile, fmt.Errorf("with %s %s: %w", FieldKeyFile, keyFile, err))
	}
	return cert, nil
}

func loadCAs(field, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, badvalue.New(field, file, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, badvalue.Errorf(field, file, "no PEM certificate in it")
	}
	return pool, nil
}
