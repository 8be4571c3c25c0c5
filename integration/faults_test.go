package integration

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgtender/pgtender/internal/testpg"
)

// TestPostgresStopsAndStarts stops a Postgres of the test's own under
// per-request logins (login, SELECT 1, close) and starts it again. What the
// clients saw is asserted: every failure carries a connection SQLSTATE and
// none waits for its deadline; pgtender makes a bounded number of connects
// to the stopped server rather than one per request; and service comes
// back by itself once Postgres accepts connections.
func TestPostgresStopsAndStarts(t *testing.T) {
	for _, mode := range []testpg.ShutdownMode{testpg.ShutdownFast, testpg.ShutdownImmediate} {
		t.Run(string(mode), func(t *testing.T) { postgresStopsAndStarts(t, mode) })
	}
}

func postgresStopsAndStarts(t *testing.T, mode testpg.ShutdownMode) {
	server := testpg.StartTB(t, testpg.Options{})
	setup, cancelSetup := context.WithTimeout(context.Background(), time.Minute)
	defer cancelSetup()
	if err := server.CreateRole(setup, appUser, appPassword); err != nil {
		t.Fatal(err)
	}
	if err := server.CreateDatabase(setup, appDB, appUser); err != nil {
		t.Fatal(err)
	}
	tp := startPooler(t, poolerOptions{server: server, general: `passthrough_auth = "enabled_plain"`, pool: "pool_size = 4"})

	const (
		clients   = 8
		deadline  = 5 * time.Second // each client operation's
		up        = time.Second     // before the stop
		down      = 2 * time.Second
		afterward = 2 * time.Second // after the start
	)
	var (
		mu       sync.Mutex
		outcomes []operation
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range clients {
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
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				err := loginAndSelect(ctx, tp)
				cancel()
				o := operation{at: start, took: time.Since(start)}
				if err != nil {
					o.code, o.errMsg = sqlState(err), err.Error()
					if o.code == "" {
						o.code = "no SQLSTATE"
					}
				}
				mu.Lock()
				outcomes = append(outcomes, o)
				mu.Unlock()
			}
		}()
	}

	time.Sleep(up)
	stoppedAt := time.Now()
	if err := server.Down(mode); err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	time.Sleep(down)
	targetsDown := tp.ServerTargets()
	if err := server.Up(); err != nil {
		close(stop)
		wg.Wait()
		t.Fatal(err)
	}
	readyAt := time.Now() // pg_ctl start -w returns once Postgres accepts connections
	time.Sleep(afterward)
	close(stop)
	wg.Wait()

	codes := map[string]int{}
	var slowestFailure, slowestAfter time.Duration
	var firstSuccessAfter time.Time
	hung := 0
	for _, o := range outcomes {
		if o.took >= deadline-100*time.Millisecond {
			hung++
		}
		if o.code != "" {
			codes[o.code]++
			slowestFailure = max(slowestFailure, o.took)
			continue
		}
		if end := o.at.Add(o.took); end.After(readyAt) && (firstSuccessAfter.IsZero() || end.Before(firstSuccessAfter)) {
			firstSuccessAfter = end
		}
		if !o.at.Before(readyAt) {
			slowestAfter = max(slowestAfter, o.took)
		}
	}
	var unreachable, notAttempted uint64
	for _, target := range targetsDown {
		unreachable += target.Unreachable
		notAttempted += target.NotAttempted
	}
	t.Logf("%s stop, %v down: %d operations; errors by SQLSTATE %v; slowest failure %v; %d hung; "+
		"connects to the stopped server %d, not attempted %d; first success %v after Postgres was ready; slowest success after %v",
		mode, down, len(outcomes), codes, slowestFailure.Round(time.Millisecond), hung, unreachable, notAttempted,
		firstSuccessAfter.Sub(readyAt).Round(time.Millisecond), slowestAfter.Round(time.Millisecond))

	if hung > 0 {
		t.Errorf("%d operations ran to their %v deadline", hung, deadline)
	}
	for code := range codes {
		switch code {
		case "08006", "57P01", "57P03", "08P01":
		default:
			t.Errorf("%d failures with %q; want connection SQLSTATEs only (first: %s)", codes[code], code, firstError(outcomes, code))
		}
	}
	// At most one probe every maxServerRetry/2 (50 ms) once the backoff
	// reached its ceiling, plus the connects in flight when Postgres
	// stopped (bounded by the pool sizes); without the backoff, thousands.
	if bound := uint64(down/(50*time.Millisecond)) + 4*clients; unreachable > bound {
		t.Errorf("%d connects to the stopped server in %v (bound %d): the backoff does not hold", unreachable, time.Since(stoppedAt), bound)
	}
	if notAttempted == 0 {
		t.Error("no connect was failed at once while Postgres was stopped")
	}
	if firstSuccessAfter.IsZero() {
		t.Fatalf("no operation succeeded in the %v after Postgres was ready", afterward)
	}
}

// loginAndSelect is one per-request client: login, SELECT 1, close.
func loginAndSelect(ctx context.Context, tp *testPooler) error {
	conn, err := tp.connectAs(ctx, appUser, appPassword, appDB)
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
