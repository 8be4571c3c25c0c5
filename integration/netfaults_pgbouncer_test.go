package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestNetworkFaultsPgBouncer runs the network faults of netfaults_test.go
// against PgBouncer through Toxiproxy, with the PgBouncer keys that do what
// pgtender's do in each of those tests, and reports what its clients saw;
// nothing is asserted of the peer. With -faults-pgbouncer (make
// test-faults-full), so that docs/RELIABILITY.md's table has both poolers
// from the same run.
func TestNetworkFaultsPgBouncer(t *testing.T) {
	if !*faultsWithPgBouncer {
		t.Skip("-faults-pgbouncer runs it (make test-faults-full)")
	}
	t.Run("idle connections on a stalled path", pgbouncerIdleConnectionsOnAStalledPath)
	t.Run("query timeout on a stalled path", pgbouncerQueryTimeoutOnAStalledPath)
	t.Run("connect timeout on a slow path", pgbouncerConnectTimeoutOnASlowPath)
	t.Run("path closed mid-request", pgbouncerPathClosedMidRequest)
}

// networkFaultDeadline is each client operation's deadline in these runs:
// an operation that reaches it is reported as hung.
const networkFaultDeadline = 15 * time.Second

// proxiedPgBouncer is PgBouncer in front of pg through a Toxiproxy proxy
// named "postgres"; it returns a DSN of the app user through PgBouncer.
func proxiedPgBouncer(t *testing.T, poolSize int, settings ...string) (string, *toxiproxy) {
	t.Helper()
	proxy := startToxiproxy(t)
	listen := proxy.proxy("postgres", net.JoinHostPort(pg.Host, strconv.Itoa(pg.Port)))
	host, port := splitAddr(t, listen)
	portNumber, _ := strconv.Atoi(port)
	addr := startPgBouncer(t, host, portNumber, poolSize, settings...)
	return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&connect_timeout=10", appUser, appPassword, addr, appDB), proxy
}

// timedExec runs sql on conn within networkFaultDeadline and says how long
// it took.
func timedExec(ctx context.Context, conn *pgx.Conn, sql string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, networkFaultDeadline)
	defer cancel()
	start := time.Now()
	_, err := conn.Exec(ctx, sql)
	return time.Since(start), err
}

// faultOutcome describes what a client saw: the error's SQLSTATE and
// message, or that it waited to its deadline.
func faultOutcome(err error) string {
	switch {
	case err == nil:
		return "success"
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("no answer within the %v deadline (hung)", networkFaultDeadline)
	case sqlState(err) != "":
		return sqlState(err) + " " + errorMessage(err)
	}
	return "no SQLSTATE: " + err.Error()
}

// reportServiceBack logs how long after the path was restored a new
// client's SELECT 1 first succeeded, trying every 50 ms for 30 s.
func reportServiceBack(t *testing.T, ctx context.Context, dsn string) {
	t.Helper()
	restored := time.Now()
	for time.Since(restored) < 30*time.Second {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := loginAndSelect(attempt, dsn)
		cancel()
		if err == nil {
			t.Logf("PgBouncer: first success %v after the path was restored", time.Since(restored).Round(time.Millisecond))
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("PgBouncer: no success within 30 s of the path being restored")
}

func connectPgBouncer(t *testing.T, ctx context.Context, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// pgbouncerIdleConnectionsOnAStalledPath is
// TestIdleServerConnectionsOnAStalledPath's fault. PgBouncer has no
// background check of idle connections; its check at checkout
// (server_check_delay 0: every time) is the nearest, and
// server_connect_timeout bounds a new connection as connect_timeout does.
func pgbouncerIdleConnectionsOnAStalledPath(t *testing.T) {
	const servers = 4
	dsn, proxy := proxiedPgBouncer(t, servers, "server_check_delay = 0", "server_connect_timeout = 1")
	ctx, cancel := withTimeout(2 * time.Minute)
	defer cancel()
	clients := make([]*pgx.Conn, servers)
	for i := range clients {
		clients[i] = connectPgBouncer(t, ctx, dsn)
		if _, err := clients[i].Exec(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range clients {
		if _, err := c.Exec(ctx, "COMMIT"); err != nil {
			t.Fatal(err)
		}
	}
	restore := proxy.stall("postgres", "upstream")
	// pgtender had closed all four idle connections 1.5 s after the stall.
	time.Sleep(2 * time.Second)
	took, err := timedExec(ctx, clients[0], "SELECT 1")
	t.Logf("PgBouncer, a request on the stalled path (server_check_delay 0, server_connect_timeout 1 s): %s after %v",
		faultOutcome(err), took.Round(10*time.Millisecond))
	restore()
	reportServiceBack(t, ctx, dsn)
}

// pgbouncerQueryTimeoutOnAStalledPath is TestQueryTimeoutOnAStalledPath's
// fault, with PgBouncer's query_timeout.
func pgbouncerQueryTimeoutOnAStalledPath(t *testing.T) {
	dsn, proxy := proxiedPgBouncer(t, 1, "query_timeout = 1", "server_connect_timeout = 1")
	ctx, cancel := withTimeout(2 * time.Minute)
	defer cancel()
	client := connectPgBouncer(t, ctx, dsn)
	if _, err := client.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	restore := proxy.stall("postgres", "downstream")
	took, err := timedExec(ctx, client, "SELECT 1")
	t.Logf("PgBouncer, a request whose answer is lost (query_timeout 1 s): %s after %v", faultOutcome(err), took.Round(10*time.Millisecond))
	restore()
	reportServiceBack(t, ctx, dsn)
}

// pgbouncerConnectTimeoutOnASlowPath is TestConnectTimeoutOnASlowPath's
// fault, with server_connect_timeout.
func pgbouncerConnectTimeoutOnASlowPath(t *testing.T) {
	dsn, proxy := proxiedPgBouncer(t, 2, "server_connect_timeout = 1")
	ctx, cancel := withTimeout(2 * time.Minute)
	defer cancel()
	holder := connectPgBouncer(t, ctx, dsn)
	if _, err := holder.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	proxy.addToxic("postgres", "slow", "latency", "downstream", map[string]any{"latency": 3000})
	start := time.Now()
	var err error
	requestCtx, requestCancel := context.WithTimeout(ctx, networkFaultDeadline)
	other, err := pgx.Connect(requestCtx, dsn)
	if err == nil {
		_, err = other.Exec(requestCtx, "SELECT 1")
		other.Close(context.Background())
	}
	requestCancel()
	t.Logf("PgBouncer, a request needing a new server connection over a 3 s path (server_connect_timeout 1 s): %s after %v",
		faultOutcome(err), time.Since(start).Round(10*time.Millisecond))
	proxy.removeToxic("postgres", "slow")
	reportServiceBack(t, ctx, dsn)
}

// pgbouncerPathClosedMidRequest is TestPathClosedMidRequest's fault.
func pgbouncerPathClosedMidRequest(t *testing.T) {
	dsn, proxy := proxiedPgBouncer(t, 2)
	ctx, cancel := withTimeout(2 * time.Minute)
	defer cancel()
	client := connectPgBouncer(t, ctx, dsn)
	if _, err := client.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	type result struct {
		took time.Duration
		err  error
	}
	done := make(chan result, 1)
	go func() {
		took, err := timedExec(ctx, client, "SELECT pg_sleep(10)")
		done <- result{took, err}
	}()
	time.Sleep(500 * time.Millisecond) // the request is running
	closed := time.Now()
	proxy.setEnabled("postgres", false)
	r := <-done
	t.Logf("PgBouncer, the request on the closed path (pg_sleep(10)): %s %v after the path closed",
		faultOutcome(r.err), time.Since(closed).Round(time.Millisecond))
	proxy.setEnabled("postgres", true)
	reportServiceBack(t, ctx, dsn)
}
