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

// TestPostgresStopsAndStarts stops a Postgres of the test's own under
// per-request logins (login, SELECT 1, close) and starts it again. What the
// clients saw is asserted: every failure carries a connection SQLSTATE and
// none waits for its deadline; pgtender makes a bounded number of connects
// to the stopped server rather than one per request; and service comes
// back by itself once Postgres accepts connections. With -faults-pgbouncer
// each fault is run against PgBouncer too, right after, and what its
// clients saw is reported beside (not asserted: it is the peer).
func TestPostgresStopsAndStarts(t *testing.T) {
	for _, mode := range []testpg.ShutdownMode{testpg.ShutdownFast, testpg.ShutdownImmediate} {
		t.Run(string(mode), func(t *testing.T) { postgresStopsAndStarts(t, mode) })
		if *faultsWithPgBouncer {
			t.Run(string(mode)+"/pgbouncer", func(t *testing.T) { pgbouncerStopsAndStarts(t, mode) })
		}
	}
}

// The shape of every stop-and-start run.
const (
	faultClients  = 8
	faultDeadline = 5 * time.Second // each client operation's
	faultUp       = time.Second     // before the stop
	faultDown     = 2 * time.Second
	faultAfter    = 2 * time.Second // after the start
	// PgBouncer retries a server login after server_login_retry (15 s by
	// default): its clients are watched long enough to see it back.
	pgbouncerAfter = 20 * time.Second
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

// stopStartRun is what the clients of one stop-and-start saw.
type stopStartRun struct {
	outcomes           []operation
	stoppedAt, readyAt time.Time
	// Over the run: failures by SQLSTATE, the slowest failure, operations
	// that ran to their deadline, the first success after Postgres was
	// ready (zero: none) and the slowest success begun after it.
	codes                        map[string]int
	slowestFailure, slowestAfter time.Duration
	hung                         int
	firstSuccessAfter            time.Time
	after                        time.Duration // how long the clients ran after Postgres was ready
}

// runStopStart runs faultClients per-request clients against addr (a
// pooler in front of server), stops server with mode after faultUp, calls
// whileDown just before starting it again after faultDown, and stops the
// clients after once it is ready.
func runStopStart(t *testing.T, server *testpg.Server, mode testpg.ShutdownMode, addr string, after time.Duration, whileDown func()) *stopStartRun {
	t.Helper()
	// The exec mode (unnamed statements), as tp.connectAs: PgBouncer 1.18
	// does not follow named prepared statements in transaction mode.
	dsn := fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&connect_timeout=10&default_query_exec_mode=exec", appUser, appPassword, addr, appDB)
	var (
		mu  sync.Mutex
		run = &stopStartRun{codes: map[string]int{}}
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range faultClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), faultDeadline)
				err := loginAndSelect(ctx, dsn)
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
	run.stoppedAt = time.Now()
	if err := server.Down(mode); err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	time.Sleep(faultDown)
	whileDown()
	if err := server.Up(); err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	run.readyAt = time.Now() // pg_ctl start -w returns once Postgres accepts connections
	run.after = after
	time.Sleep(after)
	close(stop)
	wg.Wait()

	for _, o := range run.outcomes {
		if o.took >= faultDeadline-100*time.Millisecond {
			run.hung++
		}
		if o.code != "" {
			run.codes[o.code]++
			run.slowestFailure = max(run.slowestFailure, o.took)
			continue
		}
		if end := o.at.Add(o.took); end.After(run.readyAt) && (run.firstSuccessAfter.IsZero() || end.Before(run.firstSuccessAfter)) {
			run.firstSuccessAfter = end
		}
		if !o.at.Before(run.readyAt) {
			run.slowestAfter = max(run.slowestAfter, o.took)
		}
	}
	return run
}

// firstSuccess is how long after Postgres was ready the first operation
// succeeded, as text ("none" when none did).
func (r *stopStartRun) firstSuccess() string {
	if r.firstSuccessAfter.IsZero() {
		return fmt.Sprintf("none within %v", r.after)
	}
	return r.firstSuccessAfter.Sub(r.readyAt).Round(time.Millisecond).String()
}

func postgresStopsAndStarts(t *testing.T, mode testpg.ShutdownMode) {
	server := faultServer(t)
	tp := startPooler(t, poolerOptions{server: server, general: `passthrough_auth = "enabled_plain"`, pool: "pool_size = 4"})
	var targetsDown []pooler.ServerTarget
	run := runStopStart(t, server, mode, tp.addr, faultAfter, func() { targetsDown = tp.ServerTargets() })

	var unreachable, notAttempted uint64
	for _, target := range targetsDown {
		unreachable += target.Unreachable
		notAttempted += target.NotAttempted
	}
	t.Logf("pgtender, %s stop, %v down: %d operations; errors by SQLSTATE %v; slowest failure %v; %d hung; "+
		"connects to the stopped server %d, not attempted %d; first success %s after Postgres was ready; slowest success after %v",
		mode, faultDown, len(run.outcomes), run.codes, run.slowestFailure.Round(time.Millisecond), run.hung, unreachable, notAttempted,
		run.firstSuccess(), run.slowestAfter.Round(time.Millisecond))

	if run.hung > 0 {
		t.Errorf("%d operations ran to their %v deadline", run.hung, faultDeadline)
	}
	for code := range run.codes {
		switch code {
		case "08006", "57P01", "57P03", "08P01":
		default:
			t.Errorf("%d failures with %q; want connection SQLSTATEs only (first: %s)", run.codes[code], code, firstError(run.outcomes, code))
		}
	}
	// At most one probe every maxServerRetry/2 (50 ms) once the backoff
	// reached its ceiling, plus the connects in flight when Postgres
	// stopped (bounded by the pool sizes); without the backoff, thousands.
	if bound := uint64(faultDown/(50*time.Millisecond)) + 4*faultClients; unreachable > bound {
		t.Errorf("%d connects to the stopped server in %v (bound %d): the backoff does not hold", unreachable, time.Since(run.stoppedAt), bound)
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
func pgbouncerStopsAndStarts(t *testing.T, mode testpg.ShutdownMode) {
	server := faultServer(t)
	addr := startPgBouncer(t, server, 4)
	run := runStopStart(t, server, mode, addr, pgbouncerAfter, func() {})
	t.Logf("PgBouncer, %s stop, %v down: %d operations; errors by SQLSTATE %v; slowest failure %v; %d hung; "+
		"first success %s after Postgres was ready; slowest success after %v",
		mode, faultDown, len(run.outcomes), run.codes, run.slowestFailure.Round(time.Millisecond), run.hung,
		run.firstSuccess(), run.slowestAfter.Round(time.Millisecond))
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
