// Package metricserver serves Prometheus metrics at /metrics: the one HTTP server of `nodectl
// tune watch` and the node agent.
package metricserver

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Path is where the metrics are served.
const Path = "/metrics"

// Server serves one registry until Close.
type Server struct {
	ln   net.Listener
	srv  *http.Server
	errc chan error
}

// Listen starts serving g's metrics on addr (host:port; port 0 picks one). A slow or stuck
// scraper cannot hold the server: reading its request and writing the answer have deadlines.
func Listen(addr string, g prometheus.Gatherer) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	s := &Server{ln: ln, errc: make(chan error, 1),
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second}}
	go func() {
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.errc <- fmt.Errorf("serving metrics: %w", err)
		}
		close(s.errc)
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// URL is where the metrics can be scraped.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() + Path }

// Err delivers the error that stopped the server, if it stops before Close; it is closed when
// the server stops.
func (s *Server) Err() <-chan error { return s.errc }

// Close stops the server.
func (s *Server) Close() error { return s.srv.Close() }
