package pooler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtender/pgtender/auth"
	"github.com/pgtender/pgtender/config"
)

var errUnreachable = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}

// The target's rules, step by step on a clock the test moves.
func TestServerTargetFailsAtOnceWhileDownAndLetsOneProbeThrough(t *testing.T) {
	target := &serverTarget{address: "db:5432"}
	now := time.Unix(1000, 0)

	probe, err := target.admit(now)
	if probe || err != nil {
		t.Fatalf("up: admit = %v, %v; want a plain attempt", probe, err)
	}
	if got := target.record(now, false, connectUnreachable, sqlstateConnectionFailure, errUnreachable); got != targetWentDown {
		t.Fatalf("first unreachable connect: transition %d, want targetWentDown", got)
	}
	// A connect in flight when the server went down fails too; it does not
	// lengthen the interval.
	if got := target.record(now, false, connectUnreachable, sqlstateConnectionFailure, errUnreachable); got != targetUnchanged {
		t.Fatalf("second failure: transition %d, want unchanged", got)
	}
	if target.retry != minServerRetry {
		t.Fatalf("retry after failures not probes = %v, want %v", target.retry, minServerRetry)
	}

	_, err = target.admit(now)
	var down *serverDownError
	if !errors.As(err, &down) || down.code != sqlstateConnectionFailure || !errors.Is(err, auth.ErrPasswordNotSent) {
		t.Fatalf("down, before the probe is due: err = %v; want a serverDownError (08006) that is ErrPasswordNotSent", err)
	}

	// The probe becomes due within the first interval; only one caller
	// gets it.
	now = now.Add(minServerRetry)
	if probe, err := target.admit(now); !probe || err != nil {
		t.Fatalf("probe due: admit = %v, %v; want the probe", probe, err)
	}
	if probe, err := target.admit(now); probe || err == nil {
		t.Fatalf("while the probe is in flight: admit = %v, %v; want an error", probe, err)
	}

	// Failed probes double the interval up to the ceiling; every interval
	// lies in its upper half.
	want := minServerRetry
	for i := range 8 {
		if got := target.record(now, true, connectUnreachable, sqlstateCannotConnectNow, errUnreachable); got != targetUnchanged {
			t.Fatalf("failed probe %d: transition %d", i, got)
		}
		want = min(2*want, maxServerRetry)
		if target.retry != want {
			t.Fatalf("after failed probe %d: retry %v, want %v", i, target.retry, want)
		}
		wait := target.nextProbe.Sub(now)
		if wait < want/2 || wait >= want {
			t.Fatalf("after failed probe %d: next probe in %v, want [%v, %v)", i, wait, want/2, want)
		}
		if _, err := target.admit(now.Add(wait - time.Nanosecond)); err == nil {
			t.Fatalf("after failed probe %d: admitted before the interval passed", i)
		}
		now = target.nextProbe
		if probe, err := target.admit(now); !probe || err != nil {
			t.Fatalf("after failed probe %d: admit at the interval's end = %v, %v", i, probe, err)
		}
	}
	// Postgres said it cannot take connections: clients are told so.
	if _, err := target.admit(now); !errors.As(err, &down) || down.code != sqlstateCannotConnectNow {
		t.Fatalf("after a 57P03 probe: err = %v, want code 57P03", err)
	}

	// A probe whose caller gave up teaches nothing and frees the probe.
	target.record(now, true, connectAbandoned, "", context.Canceled)
	if probe, err := target.admit(now); !probe || err != nil {
		t.Fatalf("after an abandoned probe: admit = %v, %v; want the next caller to probe", probe, err)
	}
	// A server that answers, even with a refusal, is up.
	if got := target.record(now, true, connectRefused, "", auth.ErrRejected); got != targetCameBack {
		t.Fatalf("refused probe: transition %d, want targetCameBack", got)
	}
	if probe, err := target.admit(now); probe || err != nil {
		t.Fatalf("back up: admit = %v, %v", probe, err)
	}
	if downFor, probes := target.downFor(now); probes != 10 || downFor <= 0 {
		t.Fatalf("downFor = %v, %d probes; want 10 probes", downFor, probes)
	}
	st := &target.stats
	if st.unreachable.Load() != 10 || st.refused.Load() != 1 || st.abandoned.Load() != 1 || st.notAttempted.Load() != 11 {
		t.Fatalf("stats: unreachable %d refused %d abandoned %d not attempted %d",
			st.unreachable.Load(), st.refused.Load(), st.abandoned.Load(), st.notAttempted.Load())
	}
}

// A refusal of TLS is remembered for plaintextMemory, and forgotten when
// the server goes down.
func TestServerTargetRemembersARefusalOfTLSForAWhile(t *testing.T) {
	target := &serverTarget{address: "db:5432"}
	now := time.Now()
	if target.plaintextOnly(now) {
		t.Fatal("plaintextOnly before any refusal")
	}
	target.rememberPlaintext(now)
	if !target.plaintextOnly(now.Add(plaintextMemory - time.Millisecond)) {
		t.Fatal("refusal forgotten before plaintextMemory")
	}
	if target.plaintextOnly(now.Add(plaintextMemory)) {
		t.Fatal("refusal remembered past plaintextMemory")
	}
	target.record(now, false, connectUnreachable, sqlstateConnectionFailure, errUnreachable)
	if target.plaintextOnly(now) {
		t.Fatal("refusal survived the server going down")
	}
}

func TestClassifyConnect(t *testing.T) {
	for _, tc := range []struct {
		name         string
		err          error
		shuttingDown bool
		outcome      connectOutcome
		code         string
	}{
		{"opened", nil, false, connectOK, ""},
		{"connection refused", fmt.Errorf("connect: %w", errUnreachable), false, connectUnreachable, sqlstateConnectionFailure},
		{"closed during login", fmt.Errorf("failed to receive message: %w", io.ErrUnexpectedEOF), false, connectUnreachable, sqlstateConnectionFailure},
		{"connect_timeout", fmt.Errorf("timeout: %w", context.DeadlineExceeded), false, connectUnreachable, sqlstateConnectionFailure},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), false, connectUnreachable, sqlstateConnectionFailure},
		{"starting up", &pgconn.PgError{Code: sqlstateCannotConnectNow}, false, connectUnreachable, sqlstateCannotConnectNow},
		{"shutting down", &pgconn.PgError{Code: sqlstateAdminShutdown}, false, connectUnreachable, sqlstateCannotConnectNow},
		{"wrong password", fmt.Errorf("%w: password authentication failed", auth.ErrRejected), false, connectRefused, ""},
		{"no such database", &pgconn.PgError{Code: sqlstateInvalidCatalogName}, false, connectRefused, ""},
		{"too many clients", &pgconn.PgError{Code: sqlstateTooManyConnections}, false, connectRefused, ""},
		{"TLS refused", errors.New("server refused TLS connection"), false, connectRefused, ""},
		{"TLS alert", &net.OpError{Op: "remote error", Err: errors.New("tls: bad certificate")}, false, connectRefused, ""},
		{"shutdown", fmt.Errorf("dial: %w", context.Canceled), true, connectAbandoned, ""},
		{"no answer while shutting down", fmt.Errorf("timeout: %w", context.DeadlineExceeded), true, connectAbandoned, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outcome, code := classifyConnect(tc.err, tc.shuttingDown)
			if outcome != tc.outcome || code != tc.code {
				t.Fatalf("classifyConnect(%v) = %d, %q; want %d, %q", tc.err, outcome, code, tc.outcome, tc.code)
			}
		})
	}
}

// The errors a real connect makes are classified as their kind says.
func TestClassifyConnectOfRealFailures(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := closed.Addr().(*net.TCPAddr).Port
	closed.Close()

	hangUp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hangUp.Close()
	go func() {
		for {
			conn, err := hangUp.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()

	for _, tc := range []struct {
		name string
		port int
	}{
		{"nothing listening", closedPort},
		{"closed at once", hangUp.Addr().(*net.TCPAddr).Port},
	} {
		t.Run(tc.name, func(t *testing.T) {
			endpoint := serverEndpoint{host: "127.0.0.1", port: tc.port, user: "u", database: "d",
				connectTimeout: 2 * time.Second, tlsVerify: config.TLSVerifyDisabled}
			_, _, err := openServerConn(context.Background(), endpoint, nil, false)
			if outcome, code := classifyConnect(err, false); outcome != connectUnreachable || code != sqlstateConnectionFailure {
				t.Fatalf("%v: classified %d, %q; want unreachable, 08006", err, outcome, code)
			}
		})
	}
}

// Postgres stops: the clients get a clear error at once, pgtender dials a
// bounded number of probes instead of one connect per request, and service
// resumes by itself once Postgres listens again.
func TestServerDownFailsClientsAtOnceAndProbesWithBackoff(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) { cfg.General.DefaultPoolSize = 4 })
	const clients = 4
	conns := make([]*pgconn.PgConn, clients)
	for i := range conns {
		conns[i] = h.connect()
		mustExec(t, conns[i], "WHOAMI")
	}
	h.fake.stopListening()
	acceptsBefore := h.fake.accepts.Load()

	// Each client asks again and again for a while; without the backoff
	// each request would be a connect.
	const hammer = 300 * time.Millisecond
	var (
		mu       sync.Mutex
		requests int
		codes    = map[string]int{}
		messages = map[string]bool{}
	)
	var wg sync.WaitGroup
	deadline := time.Now().Add(hammer)
	for _, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				_, err := execSQL(conn, "WHOAMI")
				mu.Lock()
				requests++
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) {
					codes[pgErr.Code]++
					messages[pgErr.Message] = true
				} else {
					codes[fmt.Sprint(err)]++
				}
				mu.Unlock()
				if conn.IsClosed() {
					return
				}
			}
		}()
	}
	wg.Wait()

	targets := h.p.ServerTargets()
	if len(targets) != 1 {
		t.Fatalf("targets: %+v", targets)
	}
	target := targets[0]
	t.Logf("%d requests in %v while the server was down: codes %v; connects unreachable %d, not attempted %d",
		requests, hammer, codes, target.Unreachable, target.NotAttempted)
	if codes[sqlstateConnectionFailure] != requests {
		t.Fatalf("codes %v: want every request to fail with 08006", codes)
	}
	if !messages["the database server for pool "+testUser+"@"+testDatabase+" is unreachable; pgtender is retrying"] {
		t.Fatalf("messages %v: none says the server is unreachable", messages)
	}
	if target.Reachable {
		t.Fatal("the target is reported reachable while the server is down")
	}
	// Probes come at most every minServerRetry/2 at first and every
	// maxServerRetry/2 at the ceiling; the connects in flight when the
	// server went down (one per client) add to them.
	bound := clients + 4 + int(hammer/(maxServerRetry/2)) + 1
	if int(target.Unreachable) > bound || target.NotAttempted == 0 {
		t.Fatalf("%d unreachable connects (bound %d) and %d not attempted in %d requests: the down server is not protected",
			target.Unreachable, bound, target.NotAttempted, requests)
	}
	if accepts := h.fake.accepts.Load() - acceptsBefore; accepts != 0 {
		t.Fatalf("the fake accepted %d connections while not listening", accepts)
	}

	// With no client asking, the maintenance loop's probe finds the
	// server back.
	h.fake.listenAgain()
	waitFor(t, "the maintenance loop to find the server back", func() bool { return h.p.ServerTargets()[0].Reachable })
	client := h.connect()
	mustExec(t, client, "WHOAMI")
	if back := h.logs.FilterMessage("database server reachable again").Len(); back != 1 {
		t.Fatalf("logged %d 'reachable again' lines, want 1", back)
	}
	if down := h.logs.FilterMessageSnippet("database server unreachable").Len(); down != 1 {
		t.Fatalf("logged %d 'unreachable' lines, want 1", down)
	}
}

// Postgres starting up answers every login with 57P03: clients are told it
// is not accepting connections, with its code, until it does.
func TestServerStartingUpIsReportedAs57P03(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.refuseStartups(sqlstateCannotConnectNow)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var last *pgconn.PgError
	for range 3 {
		_, err := pgconn.Connect(ctx, h.connString(testDatabase))
		if !errors.As(err, &last) || last.Code != sqlstateCannotConnectNow {
			t.Fatalf("login while the server starts up: %v; want 57P03", err)
		}
	}
	if !strings.Contains(last.Message, "not accepting connections") {
		t.Fatalf("message %q does not say the server is not accepting connections", last.Message)
	}
	h.fake.refuseStartups("")
	waitFor(t, "a login once the server accepts them", func() bool {
		conn, err := pgconn.Connect(ctx, h.connString(testDatabase))
		if err != nil {
			return false
		}
		closeClient(conn)
		return true
	})
}

// Under tls_verify = "prefer", a server that refused TLS once is dialled
// once per connection after that, not twice.
func TestPreferDialsOnceAfterTheServerRefusedTLS(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) {
		cfg.General.TLSVerify = config.TLSVerifyPrefer
		cfg.General.DefaultPoolSize = 3
	})
	waitForReadinessProbe(t, h)
	before := h.fake.accepts.Load()
	first := h.connect() // the login opens the pool's first server connection
	if got := h.fake.accepts.Load() - before; got != 2 {
		t.Fatalf("first server connection: %d dials, want 2 (TLS refused, then plaintext)", got)
	}
	mustExec(t, first, "BEGIN")
	second := h.connect()
	mustExec(t, second, "BEGIN") // needs a second server connection
	third := h.connect()
	mustExec(t, third, "BEGIN")
	if got := h.fake.accepts.Load() - before; got != 4 {
		t.Fatalf("three server connections: %d dials, want 4", got)
	}
	for _, conn := range []*pgconn.PgConn{first, second, third} {
		mustExec(t, conn, "COMMIT")
	}
}

// A server that accepts and never answers is marked down by the connect
// that waited connect_timeout for it, even though the client that asked
// gave up first: with checkout_timeout equal to connect_timeout (as by
// default) the client's wait, which began earlier, always ends first.
func TestServerThatNeverAnswersIsMarkedDown(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) {
		cfg.General.DefaultPoolSize = 2
		cfg.General.ConnectTimeout = 300
		// Well past connect_timeout, so that under load the checkout does
		// not run out before the connect it waits for.
		cfg.General.CheckoutTimeout = 3000
	})
	holder := h.connect()
	mustExec(t, holder, "BEGIN") // holds the pool's first server connection
	h.fake.answerNothing(true)

	waiter := h.connect()
	if _, err := execSQL(waiter, "WHOAMI"); err == nil {
		t.Fatal("a query needing a connection to a silent server succeeded")
	}
	waitFor(t, "the connect to reach connect_timeout", func() bool {
		return !h.p.ServerTargets()[0].Reachable
	})
	target := h.p.ServerTargets()[0]
	if target.Unreachable != 1 || target.Abandoned != 0 {
		t.Fatalf("target %+v: want the unanswered connect counted unreachable, not abandoned", target)
	}
	// The next client is told at once, without another connect.
	start := time.Now()
	_, err := execSQL(waiter, "WHOAMI")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != sqlstateConnectionFailure || !strings.Contains(pgErr.Message, "unreachable") {
		t.Fatalf("query while the server is down: %v; want 08006 saying it is unreachable", err)
	}
	t.Logf("told in %v while the server was down", time.Since(start))
	if target := h.p.ServerTargets()[0]; target.NotAttempted == 0 {
		t.Fatalf("target %+v: the second query dialed the silent server", target)
	}

	h.fake.answerNothing(false)
	waitFor(t, "a probe to find the server back", func() bool { return h.p.ServerTargets()[0].Reachable })
	mustExec(t, waiter, "WHOAMI")
	mustExec(t, holder, "COMMIT")
}

// Only an SSLRequest answered 'N' is remembered: a TLS attempt that failed
// otherwise leaves the next connection to ask again.
func TestPreferRemembersOnlyARefusedSSLRequest(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) {
		cfg.General.TLSVerify = config.TLSVerifyPrefer
		cfg.General.DefaultPoolSize = 3
	})
	waitForReadinessProbe(t, h)
	h.fake.breakTLSAttempts(true)
	before := h.fake.accepts.Load()
	first := h.connect()
	mustExec(t, first, "BEGIN")
	second := h.connect()
	mustExec(t, second, "BEGIN")
	if got := h.fake.accepts.Load() - before; got != 4 {
		t.Fatalf("two server connections after broken TLS attempts: %d dials, want 4 (each asks for TLS again)", got)
	}
	for _, conn := range []*pgconn.PgConn{first, second} {
		mustExec(t, conn, "COMMIT")
	}
}

// waitForReadinessProbe waits for the readiness probe's first check, which
// dials the server too (an SSLRequest alone), so that tests counting dials
// start after it.
func waitForReadinessProbe(t *testing.T, h *harness) {
	t.Helper()
	waitFor(t, "the readiness probe", func() bool {
		health := h.p.health(testDatabase)
		health.mu.Lock()
		defer health.mu.Unlock()
		return health.checked
	})
}

// A connect whose client gave up keeps its place in the pool until it
// ends: against a server that stalls, a pool never has more connects in
// flight than its size, however often its clients ask again.
func TestConnectThatOutlivesItsClientKeepsThePoolsCapacity(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) {
		cfg.General.DefaultPoolSize = 1
		cfg.General.ConnectTimeout = 600
		cfg.General.CheckoutTimeout = 50
	})
	client := h.connect()
	mustExec(t, client, "WHOAMI")
	// The next query needs a new connect. The connection WHOAMI ran on
	// may still be on its way back to the pool.
	waitFor(t, "the pool to have no server connection", func() bool {
		h.p.poolsMu.Lock()
		defer h.p.poolsMu.Unlock()
		empty := true
		for _, pool := range h.p.pools {
			for sc := pool.TryAcquireIdle(); sc != nil; sc = pool.TryAcquireIdle() {
				pool.Discard(sc)
			}
			pool.mu.Lock()
			empty = empty && pool.total == 0
			pool.mu.Unlock()
		}
		return empty
	})
	h.fake.answerNothing(true)
	before := h.fake.accepts.Load()
	var timeouts int
	for range 5 {
		_, err := execSQL(client, "WHOAMI")
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			t.Fatalf("query against a silent server: %v", err)
		}
		if pgErr.Code == sqlstateTooManyConnections {
			timeouts++
		}
	}
	if dials := h.fake.accepts.Load() - before; dials != 1 {
		t.Fatalf("5 checkouts of %v each against a silent server made %d connects; want 1 (the pool's size)", 50*time.Millisecond, dials)
	}
	if timeouts == 0 {
		t.Fatal("no checkout timed out while the connect ran")
	}
	h.fake.answerNothing(false)
	waitFor(t, "the server to be found back", func() bool {
		_, err := execSQL(client, "WHOAMI")
		return err == nil
	})
}
