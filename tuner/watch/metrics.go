package watch

import "github.com/prometheus/client_golang/prometheus"

// Metrics is what Run exports about the tuned node.
type Metrics struct {
	drifted    prometheus.Gauge
	perSetting *prometheus.GaugeVec
	pending    prometheus.Gauge
	verify     *prometheus.CounterVec
	apply      *prometheus.CounterVec
	lastVerify prometheus.Gauge
}

// Verification and apply results, the values of the result label.
const (
	resultOK    = "ok"
	resultDrift = "drift"
	resultError = "error"
)

// NewMetrics makes the metrics and registers them with reg; it panics when they are
// registered already, as prometheus.MustRegister does.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		drifted: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodectl_tune_drifted_settings",
			Help: "Number of the profile's settings that differ from the desired value at the last verification.",
		}),
		// The setting label is the setting's id, which may hold a node path (a drop-in, a
		// swap file): bounded all the same, by the profile's settings, a dozen or so.
		perSetting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nodectl_tune_setting_drifted",
			Help: "1 when the setting differs from the desired value at the last verification, else 0.",
		}, []string{"setting", "backend"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodectl_tune_pending_restarts",
			Help: "Number of settings that take effect only when a daemon restarts and wait for it.",
		}),
		verify: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodectl_tune_verify_total",
			Help: "Verifications of the profile, by result: ok, drift, or error (a setting could not be read).",
		}, []string{"result"}),
		apply: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodectl_tune_apply_total",
			Help: "Applications of the profile, by result: ok or error (rolled back).",
		}, []string{"result"}),
		lastVerify: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodectl_tune_last_verify_timestamp_seconds",
			Help: "Unix time of the last verification that read every setting.",
		}),
	}
	// Every result exists from the start, so a rate over it is defined before the first one.
	for _, r := range []string{resultOK, resultDrift, resultError} {
		m.verify.WithLabelValues(r)
	}
	for _, r := range []string{resultOK, resultError} {
		m.apply.WithLabelValues(r)
	}
	reg.MustRegister(m.drifted, m.perSetting, m.pending, m.verify, m.apply, m.lastVerify)
	return m
}
