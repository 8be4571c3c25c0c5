package integration

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtender/pgtender/pooler"
)

// Network faults between pgtender and a real Postgres, through Toxiproxy
// (toxiproxy_test.go): a path that stops carrying data without a word, as
// when a NAT or firewall drops its state, or a host goes away.

// proxiedPooler is pgtender in front of pg through a Toxiproxy proxy named
// "postgres".
func proxiedPooler(t *testing.T, general, pool string) (*testPooler, *toxiproxy) {
	t.Helper()
	proxy := startToxiproxy(t)
	listen := proxy.proxy("postgres", net.JoinHostPort(pg.Host, strconv.Itoa(pg.Port)))
	host, port := splitAddr(t, listen)
	portNumber, _ := strconv.Atoi(port)
	tp := startPooler(t, poolerOptions{
		general: "passthrough_auth = \"enabled_plain\"\ntls_verify = \"disabled\"\n" + general,
		pool:    pool,
		host:    host,
		port:    portNumber,
	})
	return tp, proxy
}

// appPoolStats returns the app pool's figures.
func appPoolStats(t testing.TB, tp *testPooler) pooler.PoolStats {
	t.Helper()
	for _, s := range tp.PoolStats() {
		if s.User == appUser && s.Database == appDB {
			return s
		}
	}
	return pooler.PoolStats{}
}

// openServerConnections makes the pool open n server connections, by
// holding n transactions open at once, and leaves them idle.
func openServerConnections(t *testing.T, ctx context.Context, tp *testPooler, n int) []*pgx.Conn {
	t.Helper()
	clients := make([]*pgx.Conn, n)
	for i := range clients {
		clients[i] = tp.connect(t, ctx)
		if _, err := clients[i].Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		if _, err := clients[i].Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range clients {
		if _, err := c.Exec(ctx, "COMMIT"); err != nil {
			t.Fatal(err)
		}
	}
	if s := appPoolStats(t, tp); s.ServersIdle != n {
		t.Fatalf("sv_idle = %d after %d transactions at once, want %d", s.ServersIdle, n, n)
	}
	return clients
}

// eventuallyServed waits until a new client's SELECT 1 succeeds.
func eventuallyServed(t *testing.T, ctx context.Context, tp *testPooler, what string) {
	t.Helper()
	start := time.Now()
	defer func() { t.Logf("%s: first success after %v", what, time.Since(start).Round(time.Millisecond)) }()
	eventually(t, 30*time.Second, what, func() bool {
		c, err := tp.connectAs(ctx, appUser, appPassword, appDB)
		if err != nil {
			return false
		}
		defer c.Close(context.Background())
		_, err = c.Exec(ctx, "SELECT 1")
		return err == nil
	})
}

// TestIdleServerConnectionsOnAStalledPath: the background health checks
// find idle server connections whose network path stopped carrying data
// (no reset, no FIN: the peek at checkout sees an idle socket) and close
// them before a client gets one; while the path is down a client's request
// fails within connect_timeout with a clear error instead of hanging; once
// the path carries data again, service resumes without a restart.
func TestIdleServerConnectionsOnAStalledPath(t *testing.T) {
	const servers = 4
	tp, proxy := proxiedPooler(t, joinLines(
		"idle_healthcheck_interval = 500",
		"idle_healthcheck_delay = 0",
		"healthcheck_timeout = 500",
		"connect_timeout = 1000",
		"idle_timeout = 0",
	), "pool_size = "+itoa(servers))
	ctx, cancel := withTimeout(2 * time.Minute)
	defer cancel()
	clients := openServerConnections(t, ctx, tp, servers)

	// A healthy path: every idle connection is checked and passes.
	eventually(t, 20*time.Second, "a background check of every idle connection", func() bool {
		return appPoolStats(t, tp).HealthChecks >= servers
	})
	if s := appPoolStats(t, tp); s.HealthCheckFailures != 0 || s.ServersIdle+s.ServersTested != servers {
		t.Fatalf("on a healthy path: %d checks failed, sv_idle %d, sv_tested %d; want 0 failed and %d connections kept",
			s.HealthCheckFailures, s.ServersIdle, s.ServersTested, servers)
	}

	stalledAt := time.Now()
	restore := proxy.stall("postgres", "upstream")
	restored := false
	defer func() {
		if !restored {
			restore()
		}
	}()
	eventually(t, 20*time.Second, "the checks to close every idle connection of the stalled path", func() bool {
		s := appPoolStats(t, tp)
		return s.HealthCheckFailures == servers && s.ServersTotal == 0
	})
	t.Logf("all %d idle connections closed %v after the path stalled (idle_healthcheck_interval 500 ms, healthcheck_timeout 500 ms, maintenance tick 1 s)",
		servers, time.Since(stalledAt).Round(10*time.Millisecond))

	// A request now needs a new server connection, whose connect stalls:
	// connect_timeout ends it with an error the client can act on, long
	// before the client's own deadline.
	requestCtx, requestCancel := context.WithTimeout(ctx, 15*time.Second)
	defer requestCancel()
	start := time.Now()
	_, err := clients[0].Exec(requestCtx, "SELECT 1")
	elapsed := time.Since(start)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		t.Fatalf("a request on the stalled path ended with %v after %v, want an error from pgtender", err, elapsed)
	}
	switch pgErr.Code {
	case "08006", "57P03":
	default:
		t.Errorf("a request on the stalled path got %s %q, want 08006 or 57P03 (server unreachable)", pgErr.Code, pgErr.Message)
	}
	t.Logf("a request on the stalled path failed after %v (connect_timeout 1 s): %s %s", elapsed.Round(10*time.Millisecond), pgErr.Code, pgErr.Message)

	restore()
	restored = true
	eventuallyServed(t, ctx, tp, "service to resume once the path carries data again")
}

// TestQueryTimeoutOnAStalledPath: a request whose answer never comes back
// (Postgres's replies stop reaching pgtender) ends at query_timeout with
// 57014, and the server connection, whose rollback cannot be answered
// either, is closed after rollback_timeout instead of going back to the
// pool; the next client gets a fresh connection once the path is back.
func TestQueryTimeoutOnAStalledPath(t *testing.T) {
	tp, proxy := proxiedPooler(t, joinLines(
		"query_timeout = 1000",
		"rollback_timeout = 500",
		"connect_timeout = 1000",
		"idle_healthcheck_interval = 0",
	), "pool_size = 1")
	ctx, cancel := withTimeout(2 * time.Minute)
	defer cancel()
	client := tp.connect(t, ctx)
	if _, err := client.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	restore := proxy.stall("postgres", "downstream")
	var once sync.Once
	defer once.Do(restore)
	requestCtx, requestCancel := context.WithTimeout(ctx, 15*time.Second)
	defer requestCancel()
	start := time.Now()
	_, err := client.Exec(requestCtx, "SELECT 1")
	elapsed := time.Since(start)
	if code := sqlState(err); code != "57014" {
		t.Fatalf("a request whose answer is lost ended with %v after %v, want 57014 (query_timeout)", err, elapsed)
	}
	t.Logf("the request ended after %v (query_timeout 1 s): %s", elapsed.Round(10*time.Millisecond), errorMessage(err))
	eventually(t, 20*time.Second, "the unanswerable server connection to be closed, not pooled", func() bool {
		s := appPoolStats(t, tp)
		return s.ServersTotal == 0
	})

	once.Do(restore)
	eventuallyServed(t, ctx, tp, "a fresh server connection once the path is back")
}

// TestConnectTimeoutOnASlowPath: a path that delays every byte by more
// than connect_timeout makes a new server connection fail within
// connect_timeout with 08006, for a login that needs one (a cold pool
// verifying a passthrough password) and for a request on a logged-in
// client; once the delay is gone, service resumes.
func TestConnectTimeoutOnASlowPath(t *testing.T) {
	tp, proxy := proxiedPooler(t, joinLines(
		"connect_timeout = 1000",
		"idle_healthcheck_interval = 0",
		"idle_timeout = 0",
	), "pool_size = 2")
	ctx, cancel := withTimeout(2 * time.Minute)
	defer cancel()
	// The pool's first connection, held in a transaction so that the next
	// request needs a new one.
	client := tp.connect(t, ctx)
	if _, err := client.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	proxy.addToxic("postgres", "slow", "latency", "downstream", map[string]any{"latency": 3000})
	slowed := true
	defer func() {
		if slowed {
			proxy.removeToxic("postgres", "slow")
		}
	}()
	start := time.Now()
	other, err := tp.connectAs(ctx, appUser, appPassword, appDB)
	if err == nil {
		_, err = other.Exec(ctx, "SELECT 1")
		other.Close(ctx)
	}
	elapsed := time.Since(start)
	if code := sqlState(err); code != "08006" {
		t.Fatalf("a request needing a new server connection over a path slower than connect_timeout: %v after %v, want 08006", err, elapsed)
	}
	t.Logf("a request needing a new server connection over a 3 s path failed after %v (connect_timeout 1 s): %s", elapsed.Round(10*time.Millisecond), errorMessage(err))

	proxy.removeToxic("postgres", "slow")
	slowed = false
	eventuallyServed(t, ctx, tp, "service once the delay is gone")
}

// TestPathClosedMidRequest: the path to Postgres closing every connection
// while a request runs (the proxy disabled: a middlebox that dropped them,
// a Postgres host going away) ends that client's session with 08006 at
// once, not when the request would have finished; once the path is back,
// the next client is served on a fresh server connection.
func TestPathClosedMidRequest(t *testing.T) {
	tp, proxy := proxiedPooler(t, "idle_healthcheck_interval = 0", "pool_size = 2")
	ctx, cancel := withTimeout(2 * time.Minute)
	defer cancel()
	client := tp.connect(t, ctx)
	if _, err := client.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	result := make(chan error, 1)
	go func() {
		_, err := client.Exec(ctx, "SELECT pg_sleep(10)")
		result <- err
	}()
	eventually(t, 10*time.Second, "the request to be running", func() bool { return appPoolStats(t, tp).ServersActive == 1 })
	start := time.Now()
	proxy.setEnabled("postgres", false)
	var err error
	select {
	case err = <-result:
	case <-time.After(20 * time.Second):
		t.Fatal("the request on a closed path did not end within 20 s")
	}
	elapsed := time.Since(start)
	proxy.setEnabled("postgres", true)
	if code := sqlState(err); code != "08006" {
		t.Fatalf("the request on the closed path ended with %v after %v, want 08006 (server connection lost)", err, elapsed)
	}
	if elapsed > 5*time.Second {
		t.Errorf("the request ended %v after the path closed, as if it had waited for its answer (pg_sleep(10)); want at once", elapsed)
	}
	t.Logf("the request on the closed path ended %v after it closed: %s", elapsed.Round(time.Millisecond), errorMessage(err))
	eventuallyServed(t, ctx, tp, "service once the path is back")
}
