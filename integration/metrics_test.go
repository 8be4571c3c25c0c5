package integration

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pgtender/pgtender/auth"
)

// namespace is the openmetrics_namespace the metrics tests configure.
const namespace = "pgtender_"

// metricsGeneral is the [general] lines that serve pgtender's metrics on
// loopback port, under the namespace the tests read.
func metricsGeneral(port int) string {
	return fmt.Sprintf("openmetrics_port = %d\nopenmetrics_host = \"127.0.0.1\"\nopenmetrics_namespace = %q", port, namespace)
}

// scrape fetches and parses a Prometheus text exposition.
func scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	families, err := scrapeWithin(5*time.Second, url)
	if err != nil {
		t.Fatal(err)
	}
	return families
}

// scrapeWithin is scrape with the error returned, the whole request bounded
// by timeout.
func scrapeWithin(timeout time.Duration, url string) (map[string]*dto.MetricFamily, error) {
	client := http.Client{Timeout: timeout}
	resp, err := client.Get(url)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse scrape of %s: %w", url, err)
	}
	return families, nil
}

// sample returns the value of the metric name whose labels include all of
// labels (counter, gauge or untyped), or the count of a histogram; ok is
// false when there is no such series.
func sample(families map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	family := families[name]
	if family == nil {
		return 0, false
	}
next:
	for _, m := range family.GetMetric() {
		have := map[string]string{}
		for _, pair := range m.GetLabel() {
			have[pair.GetName()] = pair.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func mustSample(t testing.TB, families map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	v, ok := sample(families, name, labels)
	if !ok {
		t.Fatalf("no series %s%v in the scrape", name, labels)
	}
	return v
}

// rawStartup dials addr and sends a StartupMessage for user and database.
func rawStartup(t testing.TB, addr, user, database string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	startup := &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: map[string]string{"user": user, "database": database}}
	b, err := startup.Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(b); err != nil {
		t.Fatal(err)
	}
	return conn
}

// readAuthRequest reads the server's first answer to a StartupMessage.
func readAuthRequest(t testing.TB, conn net.Conn) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var header [5]byte
	if _, err := io.ReadFull(conn, header[:]); err != nil {
		t.Fatalf("no authentication request: %v", err)
	}
	if header[0] != 'R' {
		t.Fatalf("got message %q, want an authentication request", header[0])
	}
	body := make([]byte, binary.BigEndian.Uint32(header[1:])-4)
	if _, err := io.ReadFull(conn, body); err != nil {
		t.Fatal(err)
	}
}

// blackhole accepts TCP connections and never answers: a database server
// that hangs, to hold a login in its ready stage.
func blackhole(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return l.Addr().(*net.TCPAddr).Port
}

// TestLoginReconciliation runs N complete logins and M logins abandoned at
// each stage, and checks that pgtender's counters moved by exactly N and M
// and that the login histogram counted N.
func TestLoginReconciliation(t *testing.T) {
	const complete, abandoned = 20, 5
	metricsPort := freePort(t)
	holePort := blackhole(t)
	pr := startProcessWith(t, processOptions{
		general:        fmt.Sprintf("openmetrics_port = %d\nopenmetrics_host = \"127.0.0.1\"\nopenmetrics_namespace = %q\nconnect_timeout = 1000\npassthrough_auth = \"disabled\"\nauth_type = \"plain\"", metricsPort, namespace),
		extraDatabases: fmt.Sprintf("[[databases]]\nname = \"hole\"\nhost = \"127.0.0.1\"\nport = %d\n", holePort),
		users: joinLines(
			`[[users]]`, `name = "`+appUser+`"`, `database = "`+appDB+`"`, `password = "`+appPassword+`"`,
			`[[users]]`, `name = "`+appUser+`"`, `database = "hole"`, `password = "`+appPassword+`"`,
		),
	})
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	before := scrape(t, url)

	for i := 0; i < complete; i++ {
		conn, err := pr.connect(ctx)
		if err != nil {
			t.Fatalf("login %d: %v", i, err)
		}
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		conn.Close(ctx)
	}
	for i := 0; i < abandoned; i++ {
		// startup: part of a startup packet, then gone.
		conn, err := net.Dial("tcp", pr.addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write([]byte{0, 0, 0})
		conn.Close()
		// auth: asked for a password, gone.
		conn = rawStartup(t, pr.addr, appUser, appDB)
		readAuthRequest(t, conn)
		conn.Close()
		// ready: authenticated, then gone while the cold pool's first
		// server connection hangs.
		conn = rawStartup(t, pr.addr, appUser, "hole")
		readAuthRequest(t, conn)
		password, _ := (&pgproto3.PasswordMessage{Password: appPassword}).Encode(nil)
		conn.Write(password)
		time.Sleep(100 * time.Millisecond) // let the login reach the server connect
		conn.Close()
	}

	var after map[string]*dto.MetricFamily
	delta := func(name string, labels map[string]string) float64 {
		v0, _ := sample(before, name, labels)
		return mustSample(t, after, name, labels) - v0
	}
	// Wait until every login has been seen (a connection may still sit in
	// the accept queue when the client is done) and none is in flight;
	// then the counts must be exact.
	eventually(t, 10*time.Second, "every login to be counted and none in flight", func() bool {
		after = scrape(t, url)
		seen := delta(namespace+"logins_total", map[string]string{"result": "ok"})
		for _, stage := range []string{"startup", "auth", "ready"} {
			seen += delta(namespace+"logins_abandoned_total", map[string]string{"stage": stage})
		}
		return seen >= complete+3*abandoned && mustSample(t, after, namespace+"logins_in_flight", nil) == 0
	})
	if got := delta(namespace+"logins_total", map[string]string{"result": "ok"}); got != complete {
		t.Errorf("logins_total{result=ok} moved by %v, want %d", got, complete)
	}
	for _, stage := range []string{"startup", "auth", "ready"} {
		if got := delta(namespace+"logins_abandoned_total", map[string]string{"stage": stage}); got != abandoned {
			t.Errorf("logins_abandoned_total{stage=%s} moved by %v, want %d", stage, got, abandoned)
		}
	}
	if got := delta(namespace+"login_duration_seconds", map[string]string{"phase": "total"}); got != complete {
		t.Errorf("login_duration_seconds{phase=total} count moved by %v, want %d", got, complete)
	}
	for _, result := range []string{"auth_failed", "rejected", "shed", "error"} {
		if got := delta(namespace+"logins_total", map[string]string{"result": result}); got != 0 {
			t.Errorf("logins_total{result=%s} moved by %v, want 0", result, got)
		}
	}
}

// TestListenOverflowIncident reproduces the invisible reconnect storm: the
// pooler's accept loop is held (SIGSTOP) while a wave of clients with a
// short deadline connects to a socket with listen_backlog = 8. The kernel
// drops what does not fit and the clients give up; the scrape after the
// wave must show the overflows, the abandoned logins with their stage, and
// no login left in flight.
func TestListenOverflowIncident(t *testing.T) {
	if _, err := os.Stat("/proc/net/netstat"); err != nil {
		t.Skipf("kernel counters unavailable here (%v): cannot reproduce the incident", err)
	}
	const clients = 64
	metricsPort := freePort(t)
	pr := startProcessWith(t, processOptions{
		general: fmt.Sprintf("openmetrics_port = %d\nopenmetrics_host = \"127.0.0.1\"\nopenmetrics_namespace = %q\nlisten_backlog = 8\nworkers = 1", metricsPort, namespace),
	})
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	before := scrape(t, url)
	if v, ok := sample(before, namespace+"listen_queue_capacity", nil); !ok || v != 8 {
		t.Fatalf("listen_queue_capacity = %v (present %v), want 8", v, ok)
	}
	overflowsBefore := mustSample(t, before, namespace+"listen_overflows_total", nil)

	pr.stop(t)
	stopped := true
	defer func() {
		if stopped {
			pr.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	// The wave: every client connects, sends its StartupMessage and waits
	// for an answer for at most 1.5 s, like a libpq connect_timeout.
	outcomes := wave(pr.addr, clients, 1500*time.Millisecond)
	pr.cmd.Process.Signal(syscall.SIGCONT)
	stopped = false
	t.Logf("client outcomes while the accept loop was held: %v", outcomes)

	// The connections the kernel queued reach pgtender once it runs again;
	// their clients are gone, so each is an abandoned login. Wait for them
	// (in flight alone is 0 before the first of them is accepted, too).
	var after map[string]*dto.MetricFamily
	var abandonedTotal float64
	byStage := map[string]float64{}
	abandonedSince := func() float64 {
		total := 0.0
		for _, stage := range []string{"startup", "auth", "ready"} {
			v0, _ := sample(before, namespace+"logins_abandoned_total", map[string]string{"stage": stage})
			v := mustSample(t, after, namespace+"logins_abandoned_total", map[string]string{"stage": stage}) - v0
			byStage[stage] = v
			total += v
		}
		return total
	}
	eventually(t, 15*time.Second, "the queued logins to be counted as abandoned and none left in flight", func() bool {
		after = scrape(t, url)
		abandonedTotal = abandonedSince()
		return abandonedTotal > 0 && mustSample(t, after, namespace+"logins_in_flight", nil) == 0
	})
	overflows := mustSample(t, after, namespace+"listen_overflows_total", nil) - overflowsBefore
	shed0, _ := sample(before, namespace+"logins_total", map[string]string{"result": "shed"})
	shed := mustSample(t, after, namespace+"logins_total", map[string]string{"result": "shed"}) - shed0
	t.Logf("listen_overflows_total +%v, logins_abandoned_total by stage %v, logins_total{result=shed} +%v", overflows, byStage, shed)
	if overflows <= 0 {
		t.Errorf("listen_overflows_total did not rise although %d clients hit a backlog of 8", clients)
	}

}

// wave runs clients waveClients at once against addr, each giving up after
// deadline, and counts what they saw.
func wave(addr string, clients int, deadline time.Duration) map[string]int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	outcomes := map[string]int{}
	for range clients {
		wg.Go(func() {
			outcome := waveClient(addr, deadline)
			mu.Lock()
			outcomes[outcome]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return outcomes
}

// waveClient is one client of the incident wave; it returns what it saw.
func waveClient(addr string, deadline time.Duration) string {
	conn, err := net.DialTimeout("tcp", addr, deadline)
	if err != nil {
		return "connect failed"
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(deadline))
	startup := &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: map[string]string{"user": appUser, "database": appDB}}
	b, _ := startup.Encode(nil)
	if _, err := conn.Write(b); err != nil {
		return "write failed"
	}
	var answer [1]byte
	if _, err := conn.Read(answer[:]); err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return "timed out"
		}
		return "closed"
	}
	return "answered"
}

// startMetricsProcess is startProcessWith with /metrics served on a free
// loopback port under namespace; it returns the process and the URL.
func startMetricsProcess(t *testing.T, opts processOptions) (*process, string) {
	t.Helper()
	port := freePort(t)
	opts.general = joinLines(opts.general, fmt.Sprintf(`openmetrics_port = %d`, port),
		`openmetrics_host = "127.0.0.1"`, fmt.Sprintf(`openmetrics_namespace = %q`, namespace))
	return startProcessWith(t, opts), fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
}

// login logs user in through the process and out again.
func (pr *process) login(ctx context.Context, user, password string) error {
	conn, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&connect_timeout=10", user, password, pr.addr, appDB))
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// TestPassthroughVerificationMetrics scrapes the pgtender binary's
// /metrics around passthrough logins: one right (a verification that
// Postgres accepts), one wrong twice (a rejection, then a refusal from the
// negative cache), then ten distinct wrong ones at once (rejected while the
// failure bucket has tokens, throttled after). passthrough_verifications_total
// must count each under its result, and logins_total{result="auth_failed"}
// every refused login, throttled ones included.
func TestPassthroughVerificationMetrics(t *testing.T) {
	const role, password = "metrics_passthrough", "metrics-password"
	newRole(t, role, password)
	pr, url := startMetricsProcess(t, processOptions{general: `passthrough_auth = "enabled_plain_allow_change"`})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	login := func(pw string) error { return pr.login(ctx, role, pw) }
	eventually(t, 10*time.Second, "pgtender to accept logins", func() bool { return login(password) == nil })
	before := scrape(t, url)

	if err := login(wrongPassword); sqlState(err) != "28P01" {
		t.Fatalf("wrong password: %v", err)
	}
	if err := login(wrongPassword); sqlState(err) != "28P01" {
		t.Fatalf("wrong password again: %v", err)
	}
	const distinct = 10
	errs := make(chan error, distinct)
	for range distinct {
		go func() { errs <- login(randomPassword()) }()
	}
	for range distinct {
		if err := <-errs; sqlState(err) != "28P01" {
			t.Fatalf("distinct wrong password: %v", err)
		}
	}

	var after map[string]*dto.MetricFamily
	delta := func(name string, labels map[string]string) float64 {
		return mustSample(t, after, namespace+name, labels) - mustSample(t, before, namespace+name, labels)
	}
	// The pooler counts a refused login after sending its error, so the
	// client may see the refusal before the counter does: poll.
	after = scrape(t, url)
	deadline := time.Now().Add(5 * time.Second)
	for delta("logins_total", map[string]string{"result": "auth_failed"}) < 2+distinct && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		after = scrape(t, url)
	}
	verifications := map[string]float64{}
	for _, result := range []string{"ok", "rejected", "error", "throttled", "cached_rejection"} {
		verifications[result] = mustSample(t, after, namespace+"passthrough_verifications_total", map[string]string{"result": result})
	}
	if typ := after[namespace+"passthrough_verifications_total"].GetType(); typ != dto.MetricType_COUNTER {
		t.Errorf("passthrough_verifications_total is a %s, want a counter", typ)
	}
	t.Logf("passthrough_verifications_total: %v; logins_total{auth_failed} +%v", verifications, delta("logins_total", map[string]string{"result": "auth_failed"}))
	// The first login, made before the first scrape, is the one verification
	// that succeeded; the failure bucket holds 5 tokens, and the one
	// verification that may wait for a token can take one more.
	limit := auth.DefaultFailureLimit
	if verifications["ok"] != 1 || verifications["cached_rejection"] != 1 || verifications["error"] != 0 {
		t.Errorf("ok %v, cached_rejection %v, error %v; want 1, 1, 0", verifications["ok"], verifications["cached_rejection"], verifications["error"])
	}
	if got := verifications["rejected"] + verifications["throttled"]; got != 1+distinct {
		t.Errorf("rejected + throttled = %v, want %d (each distinct wrong password once)", got, 1+distinct)
	}
	if verifications["rejected"] > float64(limit.Burst+1) || verifications["throttled"] < float64(distinct-limit.Burst) {
		t.Errorf("rejected %v, throttled %v; want at most %d rejected", verifications["rejected"], verifications["throttled"], limit.Burst+1)
	}
	if got := delta("logins_total", map[string]string{"result": "auth_failed"}); got != 2+distinct {
		t.Errorf("logins_total{result=auth_failed} grew by %v, want %d", got, 2+distinct)
	}
}
