package metrics

import (
	"bytes"
	"context"
	"net"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/pgtender/pgtender/pooler"
)

func TestAddresses(t *testing.T) {
	for _, c := range []struct {
		host                    string
		metricsPort, healthPort int
		metrics, health         string
	}{
		{"0.0.0.0", 0, 0, "", ""},
		{"0.0.0.0", 9930, 0, "0.0.0.0:9930", ""},
		{"127.0.0.1", 0, 8080, "", ":8080"},
		{"127.0.0.1", 9930, 8080, "127.0.0.1:9930", ":8080"},
		{"::1", 9930, 8080, "[::1]:9930", ":8080"},
		{"0.0.0.0", 9930, 9930, "0.0.0.0:9930", ""}, // one server answers both
	} {
		metrics, health := Addresses(c.host, c.metricsPort, c.healthPort)
		if metrics != c.metrics || health != c.health {
			t.Errorf("Addresses(%q, %d, %d) = %q, %q; want %q, %q", c.host, c.metricsPort, c.healthPort, metrics, health, c.metrics, c.health)
		}
	}
}

// loadedRegistry is the registry main builds, with figures as they are
// under load: logins of every outcome, some in flight, busy pools with
// waiting clients, and a real listening socket with connections queued.
func loadedRegistry(t *testing.T, namespace string) *prometheus.Registry {
	t.Helper()
	recorder := NewLoginRecorder(namespace)
	for i := range 500 {
		recorder.LoginStarted()
		d := time.Duration(i) * 37 * time.Microsecond
		switch i % 10 {
		case 0:
			recorder.LoginFinished(pooler.LoginAuthFailed, pooler.LoginTimings{})
		case 1:
			recorder.LoginFinished(pooler.LoginShed, pooler.LoginTimings{})
		case 2:
			recorder.LoginAbandoned(pooler.StageAuth)
		case 3:
			// still in flight
		default:
			recorder.LoginFinished(pooler.LoginOK, pooler.LoginTimings{Startup: d / 10, Auth: d / 2, Ready: d / 5, Total: d})
		}
	}
	listener, socket := listenWithBacklog(t, 16)
	for range 3 {
		c, err := net.DialTimeout("tcp", listener.Addr().String(), waitTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	source := &fakeSource{pools: samplePools(), clients: 350, sockets: []pooler.ListenSocket{socket}}
	return NewRegistry(recorder, NewCollector(namespace, source, nil))
}

func TestEndpoints(t *testing.T) {
	var ready atomic.Bool
	var reason atomic.Value
	reason.Store("")
	servers, err := Serve(Options{
		MetricsAddress: "127.0.0.1:0",
		HealthAddress:  "127.0.0.1:0",
		Gatherer:       loadedRegistry(t, "pgtender_"),
		Ready:          func() (bool, string) { return ready.Load(), reason.Load().(string) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer servers.Shutdown(context.Background())
	addrs := servers.Addrs()
	if len(addrs) != 2 {
		t.Fatalf("Serve started %d endpoints, want 2", len(addrs))
	}
	metricsURL, healthURL := "http://"+addrs[0].String(), "http://"+addrs[1].String()

	check := func(url string, wantStatus int, wantBody string) {
		t.Helper()
		status, body := get(t, url)
		if status != wantStatus || body != wantBody {
			t.Errorf("GET %s = %d %q, want %d %q", url, status, body, wantStatus, wantBody)
		}
	}
	for _, base := range []string{metricsURL, healthURL} {
		ready.Store(false)
		check(base+"/healthz", 200, "ok\n")
		reason.Store("not listening yet")
		check(base+"/readyz", 503, "not listening yet\n")
		reason.Store("")
		check(base+"/readyz", 503, "not ready\n")
		ready.Store(true)
		check(base+"/readyz", 200, "ready\n")
		ready.Store(false)
		reason.Store("draining")
		check(base+"/readyz", 503, "draining\n")
		check(base+"/healthz", 200, "ok\n") // alive while draining
		ready.Store(true)
	}
	// healthcheck_port answers "/" as PgDog does, and has no metrics.
	check(healthURL+"/", 200, "ready\n")
	if status, _ := get(t, healthURL+"/metrics"); status != 404 {
		t.Errorf("GET /metrics on the health port = %d, want 404", status)
	}

	status, body := get(t, metricsURL+"/metrics")
	if status != 200 {
		t.Fatalf("GET /metrics = %d %s", status, body)
	}
	families := parseExposition(t, body)
	for _, name := range []string{
		"pgtender_logins_total", "pgtender_login_duration_seconds", "pgtender_logins_in_flight", "pgtender_logins_abandoned_total",
		"pgtender_cl_waiting", "pgtender_checkout_wait_seconds", "pgtender_clients",
		"pgtender_listen_queue_length", "pgtender_listen_queue_capacity", "pgtender_listen_overflows_total", "pgtender_listen_drops_total",
		"go_goroutines", "process_open_fds",
	} {
		if families[name] == nil {
			t.Errorf("/metrics has no %s", name)
		}
	}
	if v := value(t, families, "pgtender_logins_in_flight", nil); v != 50 {
		t.Errorf("logins_in_flight = %v, want 50", v)
	}

	if err := servers.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for _, addr := range addrs {
		if c, err := net.DialTimeout("tcp", addr.String(), time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after Shutdown", addr)
		}
	}
}

// TestServeNothing checks that no port means no server.
func TestServeNothing(t *testing.T) {
	servers, err := Serve(Options{Ready: func() (bool, string) { return true, "" }})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(servers.Addrs()); n != 0 {
		t.Errorf("Serve with no address started %d endpoints", n)
	}
	if err := servers.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	servers.Close()
}

// TestServePortInUse checks that a port in use fails Serve and leaves no
// socket open.
func TestServePortInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()
	_, err = Serve(Options{
		MetricsAddress: freeAddr,
		HealthAddress:  taken.Addr().String(),
		Gatherer:       prometheus.NewRegistry(),
		Ready:          func() (bool, string) { return true, "" },
	})
	if err == nil || !strings.Contains(err.Error(), "health endpoint") {
		t.Fatalf("Serve on a port in use: %v, want a health endpoint error", err)
	}
	// The metrics socket opened first was closed again.
	l, err := net.Listen("tcp", freeAddr)
	if err != nil {
		t.Errorf("the metrics address stayed bound after Serve failed: %v", err)
	} else {
		l.Close()
	}
}

// TestPromtoolCheckMetrics runs `promtool check metrics` on a real scrape
// taken with figures as they are under load, with a namespace and without.
// promtool is Debian's prometheus package; .ci/run installs it.
func TestPromtoolCheckMetrics(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not on PATH, so the scrape cannot be checked: install it " +
			"(Debian/Ubuntu: apt-get install --no-install-recommends prometheus; .ci/run does)")
	}
	for _, namespace := range []string{"pgdog_", ""} {
		t.Run("namespace="+namespace, func(t *testing.T) {
			text := scrape(t, loadedRegistry(t, namespace))
			cmd := exec.Command(promtool, "check", "metrics")
			cmd.Stdin = strings.NewReader(text)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("promtool check metrics: %v\n%s", err, out.String())
			}
			if strings.TrimSpace(out.String()) != "" {
				t.Logf("promtool check metrics: %s", out.String())
			}
		})
	}
}

// TestPromlint runs client_golang's linter, which has rules newer than
// those of the promtool a distribution ships, on pgtender's own metrics.
func TestPromlint(t *testing.T) {
	for _, namespace := range []string{"pgdog_", ""} {
		problems, err := promlint.New(strings.NewReader(scrape(t, loadedRegistry(t, namespace)))).Lint()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("namespace %q: %s: %s", namespace, p.Metric, p.Text)
		}
	}
}
