package integration

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestDriversPgxExecModes runs pgx in each of its five query exec modes:
// 32 goroutines, each with its own pgx.Conn, repeat parameterized queries
// (so that statements and descriptions are cached and, through pgtender,
// reused on other server connections), a pgx.Batch and a transaction per
// round. Halfway, with every client idle, a column is added to the table a
// cached `SELECT *` reads; what each mode's next three `SELECT *` do is
// recorded straight to Postgres and must be the same through pgtender.
func TestDriversPgxExecModes(t *testing.T) {
	for _, m := range []struct {
		name  string
		mode  pgx.QueryExecMode
		needs []poolerFeature
	}{
		{"cache_statement", pgx.QueryExecModeCacheStatement, []poolerFeature{preparedStatements}}, // pgx's default
		{"cache_describe", pgx.QueryExecModeCacheDescribe, nil},
		// Describe and execute are two Syncs on the unnamed statement, which
		// through a pooler may be two server connections (pgx's docs warn).
		{"describe_exec", pgx.QueryExecModeDescribeExec, []poolerFeature{preparedStatements}},
		{"exec", pgx.QueryExecModeExec, nil},
		{"simple_protocol", pgx.QueryExecModeSimpleProtocol, nil},
	} {
		t.Run(m.name, func(t *testing.T) {
			runDriverBothWays(t, driverCase{
				driver: "pgx", mode: m.name, needs: m.needs,
				transactions: pgxClients * pgxRounds * pgxPerRound,
				run: func(t *testing.T, dsn string, pooled bool) *driverRun {
					table := "drivers_pgx_" + m.name
					if pooled {
						table += "_pooled"
					}
					return runPgxMix(t, dsn, m.mode, table)
				},
			})
		})
	}
}

const (
	pgxClients  = 32
	pgxRounds   = 12 // the schema change comes after round pgxRounds/2
	pgxPerRound = 5  // three queries, a batch, a transaction
	pgxRows     = 64
)

// runPgxMix is one run of TestDriversPgxExecModes against dsn.
func runPgxMix(t *testing.T, dsn string, mode pgx.QueryExecMode, table string) *driverRun {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	setup := connectMode(t, ctx, dsn, pgx.QueryExecModeExec)
	log := table + "_log"
	if _, err := setup.Exec(ctx, fmt.Sprintf(`DROP TABLE IF EXISTS %[1]s, %[2]s;
CREATE TABLE %[1]s (id int PRIMARY KEY, name text);
INSERT INTO %[1]s SELECT i, 'row-' || i FROM generate_series(0, %[3]d) i;
CREATE TABLE %[2]s (worker int, round int, note text)`, table, log, pgxRows-1)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		setup.Exec(context.Background(), fmt.Sprintf("DROP TABLE IF EXISTS %s, %s", table, log))
	})

	var (
		transactions, failures atomic.Int64
		mu                     sync.Mutex
		firstErrors            []string
		schemaOutcomes         = map[string]int{}
		halfway                sync.WaitGroup
		altered                = make(chan struct{})
		wg                     sync.WaitGroup
	)
	fail := func(worker, round int, what string, err error) {
		failures.Add(1)
		mu.Lock()
		defer mu.Unlock()
		if len(firstErrors) < 10 {
			firstErrors = append(firstErrors, fmt.Sprintf("worker %d round %d %s: %v", worker, round, what, err))
		}
	}
	halfway.Add(pgxClients)
	for w := 0; w < pgxClients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var arrived sync.Once
			defer arrived.Do(halfway.Done)
			conn, err := connectModeErr(ctx, dsn, mode)
			if err != nil {
				fail(w, -1, "connect", err)
				return
			}
			defer conn.Close(context.Background())
			committed := 0 // this worker's rows in the log
			for r := 0; r < pgxRounds; r++ {
				if r == pgxRounds/2 {
					arrived.Do(halfway.Done)
					select {
					case <-altered:
					case <-ctx.Done():
						return
					}
					outcome := schemaChangeOutcome(ctx, conn, table, w%pgxRows)
					mu.Lock()
					schemaOutcomes[outcome]++
					mu.Unlock()
				}
				for _, step := range pgxRound(table, log, w, r, &committed, r >= pgxRounds/2) {
					transactions.Add(1)
					if err := step.run(ctx, conn); err != nil {
						fail(w, r, step.what, err)
					}
				}
			}
		}()
	}
	halfway.Wait()
	_, err := setup.Exec(ctx, fmt.Sprintf("ALTER TABLE %s ADD COLUMN extra int DEFAULT 7", table))
	close(altered)
	wg.Wait()
	if err != nil {
		t.Fatalf("ALTER TABLE: %v", err)
	}
	for _, e := range firstErrors {
		t.Error(e)
	}
	var rows int
	if err := setup.QueryRow(ctx, "SELECT count(*) FROM "+log).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	// Every round's batch row stays; the transaction's row stays in even rounds.
	wantRows := pgxClients * (pgxRounds + (pgxRounds+1)/2)
	if rows != wantRows {
		t.Errorf("%s holds %d rows, want %d", log, rows, wantRows)
	}
	t.Logf("the first three SELECT * after ALTER TABLE ADD COLUMN, per client: %s", formatOutcomes(schemaOutcomes))
	return &driverRun{
		transactions: int(transactions.Load()),
		errors:       int(failures.Load()),
		observed: map[string]string{
			"select_star_after_add_column": formatOutcomes(schemaOutcomes),
			"log_rows":                     itoa(rows),
		},
	}
}

// pgxStep is one counted transaction of a round.
type pgxStep struct {
	what string
	run  func(ctx context.Context, conn *pgx.Conn) error
}

// pgxRound is worker w's round r: three parameterized queries (one the
// cached SELECT * of the schema change), a batch, and a transaction that
// commits in even rounds and rolls back in odd ones. *committed is the
// worker's rows in log so far.
func pgxRound(table, log string, w, r int, committed *int, afterAlter bool) []pgxStep {
	id := (w + r) % pgxRows
	wantCols := 2
	if afterAlter {
		wantCols = 3
	}
	return []pgxStep{
		{"sum", func(ctx context.Context, conn *pgx.Conn) error {
			var sum int
			if err := conn.QueryRow(ctx, "SELECT $1::int + $2::int", w, r).Scan(&sum); err != nil {
				return err
			}
			return expectEqual("sum", sum, w+r)
		}},
		{"name", func(ctx context.Context, conn *pgx.Conn) error {
			var name string
			if err := conn.QueryRow(ctx, "SELECT name FROM "+table+" WHERE id = $1", id).Scan(&name); err != nil {
				return err
			}
			return expectEqual("name", name, fmt.Sprintf("row-%d", id))
		}},
		{"select *", func(ctx context.Context, conn *pgx.Conn) error {
			values, err := selectStar(ctx, conn, table, id)
			if err != nil {
				return err
			}
			if len(values) != wantCols {
				return fmt.Errorf("SELECT * returned %d columns %v, want %d", len(values), values, wantCols)
			}
			return expectEqual("SELECT * name", values[1], any(fmt.Sprintf("row-%d", id)))
		}},
		{"batch", func(ctx context.Context, conn *pgx.Conn) error {
			batch := &pgx.Batch{}
			batch.Queue("INSERT INTO "+log+" (worker, round, note) VALUES ($1, $2, $3)", w, r, "batch")
			batch.Queue("SELECT count(*) FROM "+log+" WHERE worker = $1", w)
			batch.Queue("SELECT $1::text || '/' || $2::text", "w"+itoa(w), "r"+itoa(r))
			results := conn.SendBatch(ctx, batch)
			if _, err := results.Exec(); err != nil {
				results.Close()
				return err
			}
			*committed++
			var n int
			var s string
			if err := results.QueryRow().Scan(&n); err != nil {
				results.Close()
				return err
			}
			if err := results.QueryRow().Scan(&s); err != nil {
				results.Close()
				return err
			}
			if err := results.Close(); err != nil {
				return err
			}
			if err := expectEqual("batch count", n, *committed); err != nil {
				return err
			}
			return expectEqual("batch concat", s, fmt.Sprintf("w%d/r%d", w, r))
		}},
		{"transaction", func(ctx context.Context, conn *pgx.Conn) error {
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(ctx)
			if _, err := tx.Exec(ctx, "INSERT INTO "+log+" (worker, round, note) VALUES ($1, $2, $3)", w, r, "tx"); err != nil {
				return err
			}
			var n int
			if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+log+" WHERE worker = $1", w).Scan(&n); err != nil {
				return err
			}
			if err := expectEqual("count in transaction", n, *committed+1); err != nil {
				return err
			}
			if r%2 == 1 {
				return tx.Rollback(ctx)
			}
			if err := tx.Commit(ctx); err != nil {
				return err
			}
			*committed++
			return nil
		}},
	}
}

func selectStar(ctx context.Context, conn *pgx.Conn, table string, id int) ([]any, error) {
	rows, err := conn.Query(ctx, "SELECT * FROM "+table+" WHERE id = $1", id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var values []any
	for rows.Next() {
		if values, err = rows.Values(); err != nil {
			return nil, err
		}
	}
	return values, rows.Err()
}

// schemaChangeOutcome runs the cached SELECT * three times right after the
// ALTER TABLE and says what each did: "ok:<columns>" or "err:<SQLSTATE or
// error text>".
func schemaChangeOutcome(ctx context.Context, conn *pgx.Conn, table string, id int) string {
	var outcomes []string
	for range 3 {
		values, err := selectStar(ctx, conn, table, id)
		switch {
		case err == nil:
			outcomes = append(outcomes, fmt.Sprintf("ok:%d", len(values)))
		case sqlState(err) != "":
			outcomes = append(outcomes, "err:"+sqlState(err))
		default:
			outcomes = append(outcomes, "err:"+err.Error())
		}
	}
	return strings.Join(outcomes, ",")
}

// formatOutcomes renders a count of outcomes as "N×outcome; ..." sorted.
func formatOutcomes(outcomes map[string]int) string {
	var parts []string
	for outcome, n := range outcomes {
		parts = append(parts, fmt.Sprintf("%d×%s", n, outcome))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

func expectEqual[T comparable](what string, got, want T) error {
	if got != want {
		return fmt.Errorf("%s: got %v, want %v", what, got, want)
	}
	return nil
}

// connectMode opens a pgx connection to dsn whose queries use mode; it is
// closed at the end of the test.
func connectMode(t testing.TB, ctx context.Context, dsn string, mode pgx.QueryExecMode) *pgx.Conn {
	t.Helper()
	conn, err := connectModeErr(ctx, dsn, mode)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func connectModeErr(ctx context.Context, dsn string, mode pgx.QueryExecMode) (*pgx.Conn, error) {
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cc.DefaultQueryExecMode = mode
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return conn, nil
}
