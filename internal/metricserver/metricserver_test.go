package metricserver

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestServesTheRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "nodectl_test_gauge", Help: "a test gauge"})
	reg.MustRegister(g)
	g.Set(42)
	s, err := Listen("127.0.0.1:0", reg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "nodectl_test_gauge 42") {
		t.Errorf("GET %s: %s\n%s", s.URL(), resp.Status, body)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err, open := <-s.Err(); open || err != nil {
		t.Errorf("after Close the error channel gave %v (open %v), want it closed", err, open)
	}
}

func TestListenNamesTheAddress(t *testing.T) {
	if _, err := Listen("256.0.0.1:x", prometheus.NewRegistry()); err == nil || !strings.Contains(err.Error(), "256.0.0.1:x") {
		t.Errorf("got %v, want an error naming the address", err)
	}
}
