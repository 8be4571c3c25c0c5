package metrics

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgtender/pgtender/pooler"
)

// fakeSource is a Source whose figures a test sets.
type fakeSource struct {
	mu            sync.Mutex
	pools         []pooler.PoolStats
	clients       int64
	parking       pooler.ClientParking
	sockets       []pooler.ListenSocket
	verifications pooler.PassthroughVerifications
	cancels       pooler.CancelRequests
	timeouts      pooler.ClientTimeouts
	protocolErrs  pooler.ClientProtocolErrors
	targets       []pooler.ServerTarget
}

func (f *fakeSource) ServerTargets() []pooler.ServerTarget {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]pooler.ServerTarget(nil), f.targets...)
}

func (f *fakeSource) PoolStats() []pooler.PoolStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]pooler.PoolStats(nil), f.pools...)
}

func (f *fakeSource) ClientCount() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.clients
}

func (f *fakeSource) ClientParking() pooler.ClientParking {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.parking
}

func (f *fakeSource) PassthroughVerifications() pooler.PassthroughVerifications {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.verifications
}

func (f *fakeSource) CancelRequests() pooler.CancelRequests {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cancels
}

func (f *fakeSource) ClientTimeouts() pooler.ClientTimeouts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.timeouts
}

func (f *fakeSource) ClientProtocolErrors() pooler.ClientProtocolErrors {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.protocolErrs
}

func (f *fakeSource) ListenSockets() []pooler.ListenSocket {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]pooler.ListenSocket(nil), f.sockets...)
}

// brokenRawConn is a listening socket whose TCP_INFO cannot be read.
type brokenRawConn struct{ err error }

func (b brokenRawConn) Control(func(uintptr)) error    { return b.err }
func (b brokenRawConn) Read(func(uintptr) bool) error  { return b.err }
func (b brokenRawConn) Write(func(uintptr) bool) error { return b.err }

var _ syscall.RawConn = brokenRawConn{}

// checkoutWait builds a snapshot as the pooler's histogram does: bounds of
// pooler.CheckoutWaitBuckets, cumulative counts, and observations above the
// last bound in Count only.
func checkoutWait(observations ...time.Duration) pooler.HistogramSnapshot {
	snap := pooler.HistogramSnapshot{Bounds: pooler.CheckoutWaitBuckets, Cumulative: make([]uint64, len(pooler.CheckoutWaitBuckets))}
	for _, d := range observations {
		for i, bound := range snap.Bounds {
			if d.Seconds() <= bound {
				snap.Cumulative[i]++
			}
		}
		snap.Count++
		snap.SumSeconds += d.Seconds()
	}
	return snap
}

func samplePools() []pooler.PoolStats {
	return []pooler.PoolStats{
		{
			User: "app", Database: "shop", Size: 20,
			ClientsActive: 5, ClientsWaiting: 3,
			ServersActive: 4, ServersIdle: 2, ServersIdleInTransaction: 1, ServersTotal: 7,
			MaxWait:      1500 * time.Millisecond,
			Transactions: 1200, Queries: 3400, BytesReceived: 56000, BytesSent: 789000,
			WaitTime: 2500 * time.Millisecond, ServerConnections: 9, CheckoutTimeouts: 2,
			ServersTested: 1, HealthChecks: 30, HealthCheckFailures: 3,
			CheckoutWait: checkoutWait(50*time.Microsecond, 3*time.Millisecond, 700*time.Millisecond, 30*time.Second),
		},
		{User: "report", Database: "shop", Size: 5, CheckoutWait: checkoutWait()},
	}
}

func TestCollectorPools(t *testing.T) {
	source := &fakeSource{pools: samplePools(), clients: 42, parking: pooler.ClientParking{Parked: 30, Parks: 77, MemoryReleases: 3}}
	collector := NewCollector("pgdog_", source, nil)
	collector.netstatPath = "/nonexistent" // kernel figures are tested on their own
	registry := prometheus.NewRegistry()
	registry.MustRegister(collector)
	families := scrapeFamilies(t, registry)

	if v := value(t, families, "pgdog_clients", nil); v != 42 {
		t.Errorf("clients = %v, want 42", v)
	}
	if typ := typeOf(t, families, "pgdog_clients"); typ != dto.MetricType_GAUGE {
		t.Errorf("clients is a %s, want a gauge", typ)
	}
	for _, c := range []struct {
		name string
		typ  dto.MetricType
		want float64
	}{
		{"pgdog_clients_parked", dto.MetricType_GAUGE, 30},
		{"pgdog_client_parks_total", dto.MetricType_COUNTER, 77},
		{"pgdog_client_park_memory_releases_total", dto.MetricType_COUNTER, 3},
	} {
		if v := value(t, families, c.name, nil); v != c.want {
			t.Errorf("%s = %v, want %v", c.name, v, c.want)
		}
		if typ := typeOf(t, families, c.name); typ != c.typ {
			t.Errorf("%s is a %s, want a %s", c.name, typ, c.typ)
		}
	}
	app := labels("user", "app", "database", "shop")
	for _, c := range []struct {
		name string
		typ  dto.MetricType
		want float64
	}{
		{"pgdog_cl_active", dto.MetricType_GAUGE, 5},
		{"pgdog_cl_waiting", dto.MetricType_GAUGE, 3},
		{"pgdog_sv_active", dto.MetricType_GAUGE, 4},
		{"pgdog_sv_idle", dto.MetricType_GAUGE, 2},
		{"pgdog_sv_idle_xact", dto.MetricType_GAUGE, 1},
		{"pgdog_sv_total", dto.MetricType_UNTYPED, 7},
		{"pgdog_maxwait", dto.MetricType_GAUGE, 1.5},
		{"pgdog_total_xact_count", dto.MetricType_UNTYPED, 1200},
		{"pgdog_total_query_count", dto.MetricType_UNTYPED, 3400},
		{"pgdog_total_received", dto.MetricType_UNTYPED, 56000},
		{"pgdog_total_sent", dto.MetricType_UNTYPED, 789000},
		{"pgdog_total_wait_time", dto.MetricType_UNTYPED, 2.5},
		{"pgdog_total_server_connections", dto.MetricType_UNTYPED, 9},
		{"pgdog_checkout_timeouts_total", dto.MetricType_COUNTER, 2},
		{"pgdog_sv_tested", dto.MetricType_GAUGE, 1},
		{"pgdog_server_health_checks_total", dto.MetricType_COUNTER, 30},
		{"pgdog_server_health_check_failures_total", dto.MetricType_COUNTER, 3},
	} {
		if typ := typeOf(t, families, c.name); typ != c.typ {
			t.Errorf("%s is a %s, want a %s", c.name, typ, c.typ)
		}
		if v := value(t, families, c.name, app); !near(v, c.want) {
			t.Errorf("%s{user=app,database=shop} = %v, want %v", c.name, v, c.want)
		}
		if v := value(t, families, c.name, labels("user", "report", "database", "shop")); v != 0 {
			t.Errorf("%s{user=report,database=shop} = %v, want 0", c.name, v)
		}
	}

	m := find(families, "pgdog_checkout_wait_seconds", app)
	if m == nil {
		t.Fatal("no checkout_wait_seconds{user=app,database=shop}")
	}
	h := m.GetHistogram()
	if h.GetSampleCount() != 4 {
		t.Errorf("checkout_wait_seconds count = %d, want 4 (one above the last bound)", h.GetSampleCount())
	}
	if want := 0.00005 + 0.003 + 0.7 + 30; !near(h.GetSampleSum(), want) {
		t.Errorf("checkout_wait_seconds sum = %v, want %v", h.GetSampleSum(), want)
	}
	wantCumulative := map[float64]uint64{0.0001: 1, 0.0005: 1, 0.001: 1, 0.005: 2, 0.01: 2, 0.05: 2, 0.1: 2, 0.5: 2, 1: 3, 2.5: 3, 5: 3, 10: 3}
	for _, b := range h.GetBucket() {
		want, ok := wantCumulative[b.GetUpperBound()]
		if b.GetUpperBound() > 10 { // +Inf
			want, ok = 4, true
		}
		if !ok {
			t.Errorf("checkout_wait_seconds has an unexpected bucket le=%v", b.GetUpperBound())
			continue
		}
		if b.GetCumulativeCount() != want {
			t.Errorf("checkout_wait_seconds{le=%v} = %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
		}
	}
	if n := len(h.GetBucket()); n != len(pooler.CheckoutWaitBuckets)+1 {
		t.Errorf("checkout_wait_seconds has %d buckets, want %d and +Inf", n, len(pooler.CheckoutWaitBuckets))
	}
}

// TestCollectorResultCounters checks that every result of the passthrough
// verification, cancel request and client timeout counters is served, as a
// counter, from the start.
func TestCollectorResultCounters(t *testing.T) {
	source := &fakeSource{
		verifications: pooler.PassthroughVerifications{OK: 3, Rejected: 5, Error: 1, Throttled: 40},
		cancels:       pooler.CancelRequests{Forwarded: 7, UnknownKey: 2},
		timeouts:      pooler.ClientTimeouts{Write: 4, IdleInTransaction: 6, Query: 8},
		protocolErrs:  pooler.ClientProtocolErrors{Malformed: 9, TooLarge: 11, UnknownType: 13},
	}
	collector := NewCollector("pgdog_", source, nil)
	collector.netstatPath = "/nonexistent"
	registry := prometheus.NewRegistry()
	registry.MustRegister(collector)
	families := scrapeFamilies(t, registry)
	for _, family := range []struct {
		name, label string
		values      map[string]float64
	}{
		{"pgdog_passthrough_verifications_total", "result", map[string]float64{"ok": 3, "rejected": 5, "error": 1, "throttled": 40, "cached_rejection": 0}},
		{"pgdog_cancel_requests_total", "result", map[string]float64{"forwarded": 7, "no_server": 0, "error": 0, "unknown_key": 2, "while_waiting": 0}},
		{"pgdog_client_timeouts_total", "timeout", map[string]float64{"write": 4, "idle_in_transaction": 6, "query": 8}},
		{"pgdog_client_protocol_errors_total", "reason", map[string]float64{"malformed": 9, "too_large": 11, "unknown_type": 13}},
	} {
		if typ := typeOf(t, families, family.name); typ != dto.MetricType_COUNTER {
			t.Errorf("%s is a %s, want a counter", family.name, typ)
		}
		for label, want := range family.values {
			if v := value(t, families, family.name, labels(family.label, label)); v != want {
				t.Errorf("%s{%s=%s} = %v, want %v", family.name, family.label, label, v, want)
			}
		}
	}
}

// TestCollectorServerTargets checks that each server pgtender connects to
// has its reachability gauge and every result of its connect counter.
func TestCollectorServerTargets(t *testing.T) {
	source := &fakeSource{targets: []pooler.ServerTarget{
		{Address: "10.0.0.1:5432", Reachable: true, OK: 20, Refused: 1},
		{Address: "10.0.0.2:5432", Unreachable: 9, NotAttempted: 4000, Abandoned: 2},
	}}
	collector := NewCollector("pgtender_", source, nil)
	collector.netstatPath = "/nonexistent"
	registry := prometheus.NewRegistry()
	registry.MustRegister(collector)
	families := scrapeFamilies(t, registry)
	if typ := typeOf(t, families, "pgtender_server_reachable"); typ != dto.MetricType_GAUGE {
		t.Errorf("server_reachable is a %s, want a gauge", typ)
	}
	if typ := typeOf(t, families, "pgtender_server_connects_total"); typ != dto.MetricType_COUNTER {
		t.Errorf("server_connects_total is a %s, want a counter", typ)
	}
	for server, want := range map[string]float64{"10.0.0.1:5432": 1, "10.0.0.2:5432": 0} {
		if v := value(t, families, "pgtender_server_reachable", labels("server", server)); v != want {
			t.Errorf("server_reachable{server=%s} = %v, want %v", server, v, want)
		}
	}
	for server, results := range map[string]map[string]float64{
		"10.0.0.1:5432": {"ok": 20, "refused": 1, "unreachable": 0, "abandoned": 0, "not_attempted": 0},
		"10.0.0.2:5432": {"ok": 0, "refused": 0, "unreachable": 9, "abandoned": 2, "not_attempted": 4000},
	} {
		for result, want := range results {
			if v := value(t, families, "pgtender_server_connects_total", labels("server", server, "result", result)); v != want {
				t.Errorf("server_connects_total{server=%s,result=%s} = %v, want %v", server, result, v, want)
			}
		}
	}
}

// TestCollectorNamespace checks that the namespace is put in front of every
// name verbatim, and that an empty one adds nothing.
func TestCollectorNamespace(t *testing.T) {
	for _, namespace := range []string{"", "pgdog_", "pgtender_"} {
		source := &fakeSource{pools: samplePools()}
		collector := NewCollector(namespace, source, nil)
		collector.netstatPath = "/nonexistent"
		registry := prometheus.NewRegistry()
		registry.MustRegister(collector, NewLoginRecorder(namespace))
		families := scrapeFamilies(t, registry)
		for _, name := range []string{"clients", "cl_waiting", "total_xact_count", "checkout_wait_seconds", "logins_total", "login_duration_seconds"} {
			if families[namespace+name] == nil {
				t.Errorf("namespace %q: no family %s", namespace, namespace+name)
			}
		}
	}
}

// TestCollectorUnreadableKernelFigures checks that figures the kernel does
// not give are left out of the scrape, not reported as 0, and that the
// problem is logged once, however many scrapes follow.
func TestCollectorUnreadableKernelFigures(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 6432}
	source := &fakeSource{
		clients: 1,
		sockets: []pooler.ListenSocket{
			{Worker: 0, Addr: addr, Conn: brokenRawConn{errors.New("getsockopt: operation not supported")}},
			{Worker: 1, Addr: addr, Conn: brokenRawConn{&net.OpError{Op: "raw-control", Err: net.ErrClosed}}},
		},
	}
	collector := NewCollector("", source, zap.New(core))
	collector.netstatPath = t.TempDir() + "/netstat"
	collector.conntrackPath = t.TempDir() + "/nf_conntrack"
	registry := prometheus.NewRegistry()
	registry.MustRegister(collector)
	for range 3 {
		families := scrapeFamilies(t, registry)
		for _, name := range []string{"listen_queue_length", "listen_queue_capacity", "listen_overflows_total", "listen_drops_total",
			"conntrack_drops_total", "conntrack_early_drops_total", "conntrack_insert_failed_total"} {
			if families[name] != nil {
				t.Errorf("%s is in the scrape although the kernel did not give it", name)
			}
		}
		if families["clients"] == nil {
			t.Error("clients is missing: an unreadable kernel figure must not hide the rest")
		}
	}
	if n := logs.FilterMessageSnippet("TCP_INFO").Len(); n != 1 {
		t.Errorf("the unreadable TCP_INFO was logged %d times, want once (and not for the closed socket)", n)
	}
	if n := logs.FilterMessageSnippet("listen counters").Len(); n != 1 {
		t.Errorf("the unreadable netstat was logged %d times, want once", n)
	}
}
