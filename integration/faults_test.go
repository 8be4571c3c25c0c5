package integration

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtender/pgtender/internal/testpg"
	"github.com/pgtender/pgtender/pooler"
)

var faultsWithPgBouncer = flag.Bool("faults-pgbouncer", false,
	"TestPostgresStopsAndStarts runs each fault against PgBouncer too, in the same run (make test-faults-full)")

// TestPostgresStopsAndStarts stops a Postgres of the test's own under load
// and starts it again, for each workload: per-request logins (login,
// SELECT 1, close) and clients holding their connections and running
// transactions. What the clients saw is asserted: every failure carries a
// connection SQLSTATE and none waits for its deadline; pgtender makes a
// bounded number of connects to the stopped server rather than one per
// request; and service comes back by itself once Postgres accepts
// connections. With -faults-pgbouncer each fault is run against PgBouncer
// too, right after, and what its clients saw is reported beside (not
// asserted: it is the peer).
func TestPostgresStopsAndStarts(t *testing.T) {
	for _, mode := range []testpg.ShutdownMode{testpg.ShutdownFast, testpg.ShutdownImmediate} {
		for _, workload := range []faultWorkload{perRequest, holding} {
			name := string(mode)
			if workload == holding {
				name += "/holding"
			}
			t.Run(name, func(t *testing.T) { postgresStopsAndStarts(t, mode, workload) })
			if *faultsWithPgBouncer {
				t.Run(name+"/pgbouncer", func(t *testing.T) { pgbouncerStopsAndStarts(t, mode, workload) })
			}
		}
	}
}

// TestServerConnectionsTerminated ends every server connection of the app
// user with pg_terminate_backend under load, busy and idle alike, for each
// workload. Postgres itself stays up: clients whose transaction was on a
// terminated connection see its error, the others nothing, and every
// client is served again at once. With -faults-pgbouncer, PgBouncer beside.
func TestServerConnectionsTerminated(t *testing.T) {
	for _, workload := range []faultWorkload{perRequest, holding} {
		t.Run(string(workload), func(t *testing.T) {
			server := faultServer(t)
			tp := startPooler(t, poolerOptions{server: server, general: `passthrough_auth = "enabled_plain"`, pool: "pool_size = 4"})
			run := runFault(t, tp.addr, workload, terminateBackends(t, server), faultAfter)
			run.report(t, "pgtender", "terminate")
			run.assertConnectionErrorsOnly(t)
			if run.firstSuccessAfter.IsZero() {
				t.Fatalf("no operation succeeded in the %v after the terminate", faultAfter)
			}
			// Postgres never went away: nothing begun 1 s after the
			// terminate may fail.
			if late := run.lastFailureEnd.Sub(run.readyAt); late > time.Second {
				t.Errorf("failures went on for %v after the terminate", late.Round(time.Millisecond))
			}
		})
		if *faultsWithPgBouncer {
			t.Run(string(workload)+"/pgbouncer", func(t *testing.T) {
				server := faultServer(t)
				addr := startPgBouncer(t, server.Host, server.Port, 4)
				runFault(t, addr, workload, terminateBackends(t, server), faultAfter).report(t, "PgBouncer", "terminate")
			})
		}
	}
}

// The shape of every fault run.
const (
	faultClients  = 8
	faultDeadline = 5 * time.Second // each client operation's
	faultUp       = time.Second     // before the fault
	faultDown     = 2 * time.Second
	faultAfter    = 2 * time.Second // after the dependency is back
	// PgBouncer retries a server login after server_login_retry (15 s by
	// default): its clients are watched long enough to see it back.
	pgbouncerAfter = 20 * time.Second
)

// faultWorkload is how the clients of a fault run use the pooler.
type faultWorkload string

const (
	// perRequest clients log in, run SELECT 1 and close, as a Django fleet
	// without persistent connections.
	perRequest faultWorkload = "per-request"
	// holding clients keep one connection each and run a transaction per
	// operation (BEGIN, SELECT 1, COMMIT); after a failure they close it and
	// log in again at the next operation, as a driver's pool does with a
	// broken connection.
	holding faultWorkload = "holding"
)

// faultServer starts a Postgres of the test's own with the app role and
// database.
func faultServer(t *testing.T) *testpg.Server {
	t.Helper()
	server := testpg.StartTB(t, testpg.Options{})
	setup, cancelSetup := context.WithTimeout(context.Background(), time.Minute)
	defer cancelSetup()
	if err := server.CreateRole(setup, appUser, appPassword); err != nil {
		t.Fatal(err)
	}
	if err := server.CreateDatabase(setup, appDB, appUser); err != nil {
		t.Fatal(err)
	}
	return server
}

// faultRun is what the clients of one fault run saw.
type faultRun struct {
	workload faultWorkload
	outcomes []operation
	// faultAt is when the fault was injected, readyAt when the dependency
	// was back (for a terminate, the same moment: Postgres stayed up).
	faultAt, readyAt time.Time
	// Over the run: failures by SQLSTATE, the slowest failure, operations
	// that ran to their deadline, the first success after readyAt (zero:
	// none), the slowest success begun after it and the end of the last
	// failure.
	codes                        map[string]int
	slowestFailure, slowestAfter time.Duration
	hung                         int
	firstSuccessAfter            time.Time
	lastFailureEnd               time.Time
	after                        time.Duration // how long the clients ran after readyAt
}

// faultInjector injects a fault when called and returns once the
// dependency is back, with the moment it was.
type faultInjector func() (faultAt, readyAt time.Time, err error)

// stopStart stops server with mode, calls whileDown just before starting
// it again after faultDown, and returns once it accepts connections.
func stopStart(server *testpg.Server, mode testpg.ShutdownMode, whileDown func()) faultInjector {
	return func() (time.Time, time.Time, error) {
		stoppedAt := time.Now()
		if err := server.Down(mode); err != nil {
			return stoppedAt, time.Time{}, err
		}
		time.Sleep(faultDown)
		whileDown()
		if err := server.Up(); err != nil {
			return stoppedAt, time.Time{}, err
		}
		return stoppedAt, time.Now(), nil // pg_ctl start -w returns once Postgres accepts connections
	}
}

// terminateBackends ends every backend of the app user at once.
func terminateBackends(t *testing.T, server *testpg.Server) faultInjector {
	return func() (time.Time, time.Time, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		at := time.Now()
		err := server.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '"+appUser+"'")
		t.Logf("terminated the %s backends in %v", appUser, time.Since(at).Round(time.Millisecond))
		return at, at, err
	}
}

// runFault runs faultClients clients of workload against addr, injects the
// fault after faultUp, and stops the clients after once the dependency is
// back.
func runFault(t *testing.T, addr string, workload faultWorkload, inject faultInjector, after time.Duration) *faultRun {
	t.Helper()
	// The exec mode (unnamed statements), as tp.connectAs: PgBouncer 1.18
	// does not follow named prepared statements in transaction mode.
	dsn := fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&connect_timeout=10&default_query_exec_mode=exec", appUser, appPassword, addr, appDB)
	var (
		mu  sync.Mutex
		run = &faultRun{workload: workload, codes: map[string]int{}}
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range faultClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var conn *pgx.Conn // holding's
			defer func() {
				if conn != nil {
					conn.Close(context.Background())
				}
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
				var err error
				if workload == perRequest {
					err = loginAndSelect(ctx, dsn)
				} else {
					conn, err = transactOn(ctx, conn, dsn)
				}
				cancel()
				o := operation{at: start, took: time.Since(start)}
				if err != nil {
					o.code, o.errMsg = sqlState(err), err.Error()
					if o.code == "" {
						o.code = "no SQLSTATE"
					}
				}
				mu.Lock()
				run.outcomes = append(run.outcomes, o)
				mu.Unlock()
			}
		}()
	}
	time.Sleep(faultUp)
	var err error
	run.faultAt, run.readyAt, err = inject()
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	run.after = after
	time.Sleep(after)
	close(stop)
	wg.Wait()

	for _, o := range run.outcomes {
		if o.took >= faultDeadline-100*time.Millisecond {
			run.hung++
		}
		end := o.at.Add(o.took)
		if o.code != "" {
			run.codes[o.code]++
			run.slowestFailure = max(run.slowestFailure, o.took)
			if end.After(run.lastFailureEnd) {
				run.lastFailureEnd = end
			}
			continue
		}
		if end.After(run.readyAt) && (run.firstSuccessAfter.IsZero() || end.Before(run.firstSuccessAfter)) {
			run.firstSuccessAfter = end
		}
		if !o.at.Before(run.readyAt) {
			run.slowestAfter = max(run.slowestAfter, o.took)
		}
	}
	return run
}

// transactOn runs one transaction on conn, logging in first when conn is
// nil; after a failure it closes the connection and returns nil, so the
// next operation logs in again.
func transactOn(ctx context.Context, conn *pgx.Conn, dsn string) (*pgx.Conn, error) {
	if conn == nil {
		var err error
		if conn, err = pgx.Connect(ctx, dsn); err != nil {
			return nil, err
		}
	}
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var one int
		if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			return err
		}
		if one != 1 {
			return errors.New("SELECT 1 did not return 1")
		}
		return nil
	})
	if err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// firstSuccess is how long after the dependency was back the first
// operation succeeded, as text ("none" when none did).
func (r *faultRun) firstSuccess() string {
	if r.firstSuccessAfter.IsZero() {
		return fmt.Sprintf("none within %v", r.after)
	}
	return r.firstSuccessAfter.Sub(r.readyAt).Round(time.Millisecond).String()
}

// lastFailure is how long after the fault the last failure ended, as text.
func (r *faultRun) lastFailure() string {
	if r.lastFailureEnd.IsZero() {
		return "no failure"
	}
	return r.lastFailureEnd.Sub(r.faultAt).Round(time.Millisecond).String()
}

// report logs what the clients saw in one line.
func (r *faultRun) report(t *testing.T, pooler, fault string) {
	t.Helper()
	t.Logf("%s, %s, %s clients: %d operations; errors by SQLSTATE %v; slowest failure %v; %d hung; "+
		"last failure ended %s after the fault; first success %s after the dependency was back; slowest success after %v",
		pooler, fault, r.workload, len(r.outcomes), r.codes, r.slowestFailure.Round(time.Millisecond), r.hung,
		r.lastFailure(), r.firstSuccess(), r.slowestAfter.Round(time.Millisecond))
}

// assertConnectionErrorsOnly fails the test for an operation that ran to
// its deadline or a failure whose SQLSTATE is not a connection's.
func (r *faultRun) assertConnectionErrorsOnly(t *testing.T) {
	t.Helper()
	if r.hung > 0 {
		t.Errorf("%d operations ran to their %v deadline", r.hung, faultDeadline)
	}
	for code := range r.codes {
		switch code {
		case "08006", "57P01", "57P03", "08P01":
		default:
			t.Errorf("%d failures with %q; want connection SQLSTATEs only (first: %s)", r.codes[code], code, firstError(r.outcomes, code))
		}
	}
}

func postgresStopsAndStarts(t *testing.T, mode testpg.ShutdownMode, workload faultWorkload) {
	server := faultServer(t)
	tp := startPooler(t, poolerOptions{server: server, general: `passthrough_auth = "enabled_plain"`, pool: "pool_size = 4"})
	var targetsDown []pooler.ServerTarget
	run := runFault(t, tp.addr, workload, stopStart(server, mode, func() { targetsDown = tp.ServerTargets() }), faultAfter)

	var unreachable, notAttempted uint64
	for _, target := range targetsDown {
		unreachable += target.Unreachable
		notAttempted += target.NotAttempted
	}
	run.report(t, "pgtender", string(mode)+" stop, "+faultDown.String()+" down")
	t.Logf("pgtender: connects to the stopped server %d, not attempted %d", unreachable, notAttempted)

	run.assertConnectionErrorsOnly(t)
	// At most one probe every maxServerRetry/2 (50 ms) once the backoff
	// reached its ceiling, plus the connects in flight when Postgres
	// stopped (bounded by the pool sizes); without the backoff, thousands.
	if bound := uint64(faultDown/(50*time.Millisecond)) + 4*faultClients; unreachable > bound {
		t.Errorf("%d connects to the stopped server in %v (bound %d): the backoff does not hold", unreachable, time.Since(run.faultAt), bound)
	}
	if notAttempted == 0 {
		t.Error("no connect was failed at once while Postgres was stopped")
	}
	if run.firstSuccessAfter.IsZero() {
		t.Fatalf("no operation succeeded in the %v after Postgres was ready", faultAfter)
	}
}

// pgbouncerStopsAndStarts is postgresStopsAndStarts's fault against
// PgBouncer, reported, not asserted.
func pgbouncerStopsAndStarts(t *testing.T, mode testpg.ShutdownMode, workload faultWorkload) {
	server := faultServer(t)
	addr := startPgBouncer(t, server.Host, server.Port, 4)
	runFault(t, addr, workload, stopStart(server, mode, func() {}), pgbouncerAfter).
		report(t, "PgBouncer", string(mode)+" stop, "+faultDown.String()+" down")
}

// loginAndSelect is one per-request client of dsn: login, SELECT 1, close.
func loginAndSelect(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		return err
	}
	if one != 1 {
		return errors.New("SELECT 1 did not return 1")
	}
	return nil
}

// operation is one client operation of a fault test and how it ended.
type operation struct {
	at     time.Time
	took   time.Duration
	code   string // SQLSTATE; "" on success
	errMsg string
}

// firstError is the message of the first operation failing with code.
func firstError(operations []operation, code string) string {
	for _, o := range operations {
		if o.code == code {
			return o.errMsg
		}
	}
	return ""
}
