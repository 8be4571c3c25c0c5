package metrics

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgtender/pgtender/pooler"
)

// LoginDurationBuckets are the upper bounds, in seconds, of
// login_duration_seconds: from 100 µs (a trust or cached-SCRAM login on
// loopback) to 10 s (a login stuck behind a cold pool or a slow Postgres).
var LoginDurationBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// LoginRecorder is the Prometheus implementation of pooler.LoginRecorder.
// It is also a prometheus.Collector: register it on the registry that
// /metrics serves (NewRegistry does).
//
// Every labelled series is created once, in NewLoginRecorder (so a scrape
// shows each result and stage at 0 before its first event), and a login
// costs only atomic operations on series that already exist, and no
// allocation: LoginStarted one atomic add; a finished login one add for the
// in-flight count, one for its result and, for an admitted login, four
// histogram observations (about four atomic operations each); an abandoned
// login two adds.
type LoginRecorder struct {
	// inFlight is read at scrape time by a GaugeFunc: an integer add is
	// cheaper than a float gauge's compare-and-swap loop.
	inFlight      atomic.Int64
	inFlightGauge prometheus.GaugeFunc

	duration                                       *prometheus.HistogramVec
	startupPhase, authPhase, readyPhase, totalTime prometheus.Observer

	logins                                          *prometheus.CounterVec
	loginsOK, authFailed, rejected, shed, loginsErr prometheus.Counter

	abandoned                                       *prometheus.CounterVec
	abandonedStartup, abandonedAuth, abandonedReady prometheus.Counter
}

var _ pooler.LoginRecorder = (*LoginRecorder)(nil)

// NewLoginRecorder returns a recorder whose metric names are prefixed by
// namespace (openmetrics_namespace, verbatim: "pgdog_" gives
// "pgdog_logins_total"; "" gives no prefix).
func NewLoginRecorder(namespace string) *LoginRecorder {
	r := &LoginRecorder{}
	r.inFlightGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: namespace + "logins_in_flight",
		Help: "Logins in progress: connections that sent their first byte and have not reached ReadyForQuery, been refused or gone away.",
	}, func() float64 { return float64(r.inFlight.Load()) })

	r.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: namespace + "login_duration_seconds",
		Help: "Duration of admitted logins, by phase: startup (first byte to StartupMessage parsed), auth (password exchange and verification), " +
			"ready (pool parameters to ReadyForQuery written), total (first byte to ReadyForQuery).",
		Buckets: LoginDurationBuckets,
	}, []string{"phase"})
	r.startupPhase = r.duration.WithLabelValues("startup")
	r.authPhase = r.duration.WithLabelValues("auth")
	r.readyPhase = r.duration.WithLabelValues("ready")
	r.totalTime = r.duration.WithLabelValues("total")

	r.logins = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: namespace + "logins_total",
		Help: "Logins pgtender ended, by result: ok (admitted), auth_failed, rejected (by policy), shed (by admission control under overload), error.",
	}, []string{"result"})
	r.loginsOK = r.logins.WithLabelValues(string(pooler.LoginOK))
	r.authFailed = r.logins.WithLabelValues(string(pooler.LoginAuthFailed))
	r.rejected = r.logins.WithLabelValues(string(pooler.LoginRejected))
	r.shed = r.logins.WithLabelValues(string(pooler.LoginShed))
	r.loginsErr = r.logins.WithLabelValues(string(pooler.LoginError))

	r.abandoned = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: namespace + "logins_abandoned_total",
		Help: "Logins the client left, or that ran out of client_login_timeout, before ReadyForQuery, by the stage they were in.",
	}, []string{"stage"})
	r.abandonedStartup = r.abandoned.WithLabelValues(string(pooler.StageStartup))
	r.abandonedAuth = r.abandoned.WithLabelValues(string(pooler.StageAuth))
	r.abandonedReady = r.abandoned.WithLabelValues(string(pooler.StageReady))
	return r
}

// LoginStarted implements pooler.LoginRecorder.
func (r *LoginRecorder) LoginStarted() { r.inFlight.Add(1) }

// LoginFinished implements pooler.LoginRecorder. Only admitted logins are
// timed: a refused login's later phases did not run, and its duration would
// mix refusals into the latency an admitted client sees. So the histogram's
// count of each phase equals logins_total{result="ok"}.
func (r *LoginRecorder) LoginFinished(result pooler.LoginResult, timings pooler.LoginTimings) {
	r.inFlight.Add(-1)
	switch result {
	case pooler.LoginOK:
		r.loginsOK.Inc()
		r.startupPhase.Observe(timings.Startup.Seconds())
		r.authPhase.Observe(timings.Auth.Seconds())
		r.readyPhase.Observe(timings.Ready.Seconds())
		r.totalTime.Observe(timings.Total.Seconds())
	case pooler.LoginAuthFailed:
		r.authFailed.Inc()
	case pooler.LoginRejected:
		r.rejected.Inc()
	case pooler.LoginShed:
		r.shed.Inc()
	default: // pooler.LoginError, and any result this version does not know
		r.loginsErr.Inc()
	}
}

// LoginAbandoned implements pooler.LoginRecorder.
func (r *LoginRecorder) LoginAbandoned(stage pooler.LoginStage) {
	r.inFlight.Add(-1)
	switch stage {
	case pooler.StageAuth:
		r.abandonedAuth.Inc()
	case pooler.StageReady:
		r.abandonedReady.Inc()
	default: // pooler.StageStartup, and any stage this version does not know
		r.abandonedStartup.Inc()
	}
}

// LoginCancelRequest implements pooler.LoginRecorder: the connection leaves
// the in-flight count without being counted as a login.
func (r *LoginRecorder) LoginCancelRequest() { r.inFlight.Add(-1) }

// Describe implements prometheus.Collector.
func (r *LoginRecorder) Describe(ch chan<- *prometheus.Desc) {
	r.inFlightGauge.Describe(ch)
	r.duration.Describe(ch)
	r.logins.Describe(ch)
	r.abandoned.Describe(ch)
}

// Collect implements prometheus.Collector.
func (r *LoginRecorder) Collect(ch chan<- prometheus.Metric) {
	r.inFlightGauge.Collect(ch)
	r.duration.Collect(ch)
	r.logins.Collect(ch)
	r.abandoned.Collect(ch)
}

// Figures are the recorder's counts now, for the admin console's SHOW
// LOGINS: logins in flight, logins ended by result, logins abandoned by
// stage. They are the series logins_in_flight, logins_total and
// logins_abandoned_total export.
func (r *LoginRecorder) Figures() []pooler.LoginFigure {
	figures := []pooler.LoginFigure{{Name: "logins_in_flight", Value: r.inFlight.Load()}}
	for _, c := range []struct {
		name    string
		counter prometheus.Counter
	}{
		{"logins_ok", r.loginsOK}, {"logins_auth_failed", r.authFailed}, {"logins_rejected", r.rejected},
		{"logins_shed", r.shed}, {"logins_error", r.loginsErr},
		{"logins_abandoned_startup", r.abandonedStartup}, {"logins_abandoned_auth", r.abandonedAuth},
		{"logins_abandoned_ready", r.abandonedReady},
	} {
		figures = append(figures, pooler.LoginFigure{Name: c.name, Value: int64(counterValue(c.counter))})
	}
	return figures
}

// counterValue reads a counter's value.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0 // Write fails only for a metric whose description is broken
	}
	return m.GetCounter().GetValue()
}
