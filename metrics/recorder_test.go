package metrics

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgtender/pgtender/pooler"
)

func newRecorderRegistry(namespace string) (*LoginRecorder, *prometheus.Registry) {
	recorder := NewLoginRecorder(namespace)
	registry := prometheus.NewRegistry()
	registry.MustRegister(recorder)
	return recorder, registry
}

// TestLoginRecorderPrecreatesSeries checks that a scrape before any login
// shows every result and stage at 0, so a rate() has a starting point and
// an alert on a series that has never moved can fire.
func TestLoginRecorderPrecreatesSeries(t *testing.T) {
	_, registry := newRecorderRegistry("pgdog_")
	families := scrapeFamilies(t, registry)
	for _, result := range []string{"ok", "auth_failed", "rejected", "shed", "error"} {
		if v := value(t, families, "pgdog_logins_total", labels("result", result)); v != 0 {
			t.Errorf("logins_total{result=%q} = %v before any login", result, v)
		}
	}
	for _, stage := range []string{"startup", "auth", "ready"} {
		if v := value(t, families, "pgdog_logins_abandoned_total", labels("stage", stage)); v != 0 {
			t.Errorf("logins_abandoned_total{stage=%q} = %v before any login", stage, v)
		}
	}
	if v := value(t, families, "pgdog_logins_in_flight", nil); v != 0 {
		t.Errorf("logins_in_flight = %v before any login", v)
	}
	for _, phase := range []string{"startup", "auth", "ready", "total"} {
		m := find(families, "pgdog_login_duration_seconds", labels("phase", phase))
		if m == nil {
			t.Fatalf("no login_duration_seconds{phase=%q} before any login", phase)
		}
		if n := m.GetHistogram().GetSampleCount(); n != 0 {
			t.Errorf("login_duration_seconds{phase=%q} count = %d before any login", phase, n)
		}
	}
	if got := len(families["pgdog_logins_total"].GetMetric()); got != 5 {
		t.Errorf("logins_total has %d series, want 5", got)
	}
	if got := len(families["pgdog_logins_abandoned_total"].GetMetric()); got != 3 {
		t.Errorf("logins_abandoned_total has %d series, want 3", got)
	}
}

// TestLoginRecorderCounts drives the recorder as the pooler does and reads
// the counts back from the text exposition.
func TestLoginRecorderCounts(t *testing.T) {
	recorder, registry := newRecorderRegistry("")
	var r pooler.LoginRecorder = recorder // through the interface, as the pooler calls it

	ok := pooler.LoginTimings{Startup: 200 * time.Microsecond, Auth: 3 * time.Millisecond, Ready: 400 * time.Microsecond, Total: 3600 * time.Microsecond}
	const admitted = 7
	for range admitted {
		r.LoginStarted()
		r.LoginFinished(pooler.LoginOK, ok)
	}
	refused := map[pooler.LoginResult]int{pooler.LoginAuthFailed: 3, pooler.LoginRejected: 2, pooler.LoginShed: 5, pooler.LoginError: 1}
	for result, n := range refused {
		for range n {
			r.LoginStarted()
			r.LoginFinished(result, pooler.LoginTimings{Startup: time.Millisecond, Total: time.Millisecond})
		}
	}
	abandoned := map[pooler.LoginStage]int{pooler.StageStartup: 4, pooler.StageAuth: 6, pooler.StageReady: 1}
	for stage, n := range abandoned {
		for range n {
			r.LoginStarted()
			r.LoginAbandoned(stage)
		}
	}
	r.LoginStarted()
	r.LoginCancelRequest()
	const stillInFlight = 3
	for range stillInFlight {
		r.LoginStarted()
	}

	families := scrapeFamilies(t, registry)
	if v := value(t, families, "logins_total", labels("result", "ok")); v != admitted {
		t.Errorf(`logins_total{result="ok"} = %v, want %d`, v, admitted)
	}
	for result, n := range refused {
		if v := value(t, families, "logins_total", labels("result", string(result))); v != float64(n) {
			t.Errorf("logins_total{result=%q} = %v, want %d", result, v, n)
		}
	}
	for stage, n := range abandoned {
		if v := value(t, families, "logins_abandoned_total", labels("stage", string(stage))); v != float64(n) {
			t.Errorf("logins_abandoned_total{stage=%q} = %v, want %d", stage, v, n)
		}
	}
	if v := value(t, families, "logins_in_flight", nil); v != stillInFlight {
		t.Errorf("logins_in_flight = %v, want %d (a cancel request leaves it without being a login)", v, stillInFlight)
	}

	// Only admitted logins are timed: every phase's count is the ok count.
	phases := map[string]time.Duration{"startup": ok.Startup, "auth": ok.Auth, "ready": ok.Ready, "total": ok.Total}
	for phase, d := range phases {
		m := find(families, "login_duration_seconds", labels("phase", phase))
		if m == nil {
			t.Fatalf("no login_duration_seconds{phase=%q}", phase)
		}
		h := m.GetHistogram()
		if h.GetSampleCount() != admitted {
			t.Errorf("login_duration_seconds{phase=%q} count = %d, want %d", phase, h.GetSampleCount(), admitted)
		}
		if want := admitted * d.Seconds(); !near(h.GetSampleSum(), want) {
			t.Errorf("login_duration_seconds{phase=%q} sum = %v, want %v", phase, h.GetSampleSum(), want)
		}
		// Every observation is in the first bucket at or above it.
		for _, b := range h.GetBucket() {
			want := uint64(0)
			if b.GetUpperBound() >= d.Seconds() {
				want = admitted
			}
			if b.GetCumulativeCount() != want {
				t.Errorf("login_duration_seconds{phase=%q,le=%v} = %d, want %d", phase, b.GetUpperBound(), b.GetCumulativeCount(), want)
			}
		}
	}
	// The text format carries the +Inf bucket too.
	if got := bucketBounds(find(families, "login_duration_seconds", labels("phase", "total"))); !equalFloats(got, append(slices.Clone(LoginDurationBuckets), math.Inf(1))) {
		t.Errorf("login_duration_seconds buckets = %v, want %v and +Inf", got, LoginDurationBuckets)
	}
	if LoginDurationBuckets[0] != 0.0001 || LoginDurationBuckets[len(LoginDurationBuckets)-1] != 10 {
		t.Errorf("login_duration_seconds buckets run from %v to %v, want 100 µs to 10 s",
			LoginDurationBuckets[0], LoginDurationBuckets[len(LoginDurationBuckets)-1])
	}
}

// TestLoginRecorderUnknownLabels checks that a result or stage this
// version does not know (a pooler bug) is still counted, under error and
// startup, and still leaves the in-flight count.
func TestLoginRecorderUnknownLabels(t *testing.T) {
	recorder, registry := newRecorderRegistry("")
	recorder.LoginStarted()
	recorder.LoginFinished("surprise", pooler.LoginTimings{})
	recorder.LoginStarted()
	recorder.LoginAbandoned("elsewhere")
	families := scrapeFamilies(t, registry)
	if v := value(t, families, "logins_total", labels("result", "error")); v != 1 {
		t.Errorf(`logins_total{result="error"} = %v, want 1`, v)
	}
	if v := value(t, families, "logins_abandoned_total", labels("stage", "startup")); v != 1 {
		t.Errorf(`logins_abandoned_total{stage="startup"} = %v, want 1`, v)
	}
	if v := value(t, families, "logins_in_flight", nil); v != 0 {
		t.Errorf("logins_in_flight = %v, want 0", v)
	}
	if n := len(families["logins_total"].GetMetric()); n != 5 {
		t.Errorf("logins_total has %d series, want the 5 known results only", n)
	}
}

// TestLoginRecorderAllocs checks the login path allocates nothing.
func TestLoginRecorderAllocs(t *testing.T) {
	recorder := NewLoginRecorder("")
	timings := pooler.LoginTimings{Startup: time.Millisecond, Auth: time.Millisecond, Ready: time.Millisecond, Total: 3 * time.Millisecond}
	allocs := testing.AllocsPerRun(1000, func() {
		recorder.LoginStarted()
		recorder.LoginFinished(pooler.LoginOK, timings)
		recorder.LoginStarted()
		recorder.LoginAbandoned(pooler.StageAuth)
		recorder.LoginStarted()
		recorder.LoginFinished(pooler.LoginShed, timings)
	})
	if allocs != 0 {
		t.Errorf("a login allocates %v times, want 0", allocs)
	}
}

// nopRecorder is the pooler's default (unexported there), for the baseline.
type nopRecorder struct{}

func (nopRecorder) LoginStarted()                                         {}
func (nopRecorder) LoginFinished(pooler.LoginResult, pooler.LoginTimings) {}
func (nopRecorder) LoginAbandoned(pooler.LoginStage)                      {}
func (nopRecorder) LoginCancelRequest()                                   {}

// BenchmarkLoginRecorder measures what one admitted login costs the
// recorder (LoginStarted, then LoginFinished with four phase timings), on
// every core at once, against the pooler's no-op default.
func BenchmarkLoginRecorder(b *testing.B) {
	timings := pooler.LoginTimings{Startup: 150 * time.Microsecond, Auth: 2 * time.Millisecond, Ready: 300 * time.Microsecond, Total: 2450 * time.Microsecond}
	for _, bc := range []struct {
		name     string
		recorder pooler.LoginRecorder
	}{
		{"nop", nopRecorder{}},
		{"prometheus", NewLoginRecorder("pgtender_")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			r := bc.recorder
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r.LoginStarted()
					r.LoginFinished(pooler.LoginOK, timings)
				}
			})
		})
	}
}

func bucketBounds(m *dto.Metric) []float64 {
	var bounds []float64
	for _, b := range m.GetHistogram().GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
	}
	return bounds
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] && !near(a[i], b[i]) {
			return false
		}
	}
	return true
}

func near(a, b float64) bool {
	d := a - b
	if d < 0 {
		d = -d
	}
	return d <= 1e-9*max(1, a, b)
}
