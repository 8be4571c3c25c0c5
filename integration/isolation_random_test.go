package integration

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

var (
	isolationTransactions = flag.Int("isolation-transactions", 10000,
		"transactions in all of TestSettingsIsolationRandomized's clients, per run (issue 12 asks for 100000)")
	isolationSeed = flag.Uint64("isolation-seed", 0, "seed of TestSettingsIsolationRandomized's choices; 0: from the clock")
)

// isolationClients is how many clients TestSettingsIsolationRandomized runs.
const isolationClients = 40

// isolationTimeZones are the clients' time zones, one each.
var isolationTimeZones = []string{
	"America/New_York", "America/Chicago", "America/Denver", "America/Los_Angeles", "America/Anchorage",
	"Pacific/Honolulu", "America/Sao_Paulo", "America/Argentina/Buenos_Aires", "America/Bogota", "America/Mexico_City",
	"America/Toronto", "America/Halifax", "America/St_Johns", "Atlantic/Azores", "Europe/London",
	"Europe/Dublin", "Europe/Lisbon", "Europe/Paris", "Europe/Berlin", "Europe/Madrid",
	"Europe/Rome", "Europe/Warsaw", "Europe/Athens", "Europe/Helsinki", "Europe/Istanbul",
	"Europe/Moscow", "Africa/Cairo", "Africa/Johannesburg", "Africa/Lagos", "Africa/Nairobi",
	"Asia/Dubai", "Asia/Karachi", "Asia/Kolkata", "Asia/Kathmandu", "Asia/Dhaka",
	"Asia/Bangkok", "Asia/Shanghai", "Asia/Tokyo", "Australia/Sydney", "Pacific/Auckland",
}

// TestSettingsIsolationRandomized runs 40 clients over a pool of 4, each
// with its own search_path (its own schema, whose table t holds one row
// naming the client), TimeZone, statement_timeout (100000+i ms) and
// application_name (from the startup packet), set once at connect. In all
// they run -isolation-transactions transactions of randomly chosen shapes
// (an autocommit query, a transaction, a transaction with SET LOCAL
// search_path, a batch), and every one checks that the client sees exactly
// its own settings and its own row. Any mismatch is counted; there must be
// none, straight to Postgres (which validates the test) and through
// pgtender.
//
// The check query's text is the same for every client and means a
// different table for each (through search_path): a pooler that shared
// prepared statements by their text between clients would answer with
// another client's row. Each client also runs a statement of its own text.
func TestSettingsIsolationRandomized(t *testing.T) {
	seed := *isolationSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("-isolation-seed=%d -isolation-transactions=%d, %d clients", seed, *isolationTransactions, isolationClients)
	for _, m := range []struct {
		name  string
		mode  pgx.QueryExecMode
		needs []poolerFeature
	}{
		// pgx's default: every query a named statement (stmtcache_<hash of its text>).
		{"named_statements", pgx.QueryExecModeCacheStatement, []poolerFeature{sessionSettings, preparedStatements}},
		// Unnamed statements only: settings alone are under test.
		{"settings_only", pgx.QueryExecModeExec, []poolerFeature{sessionSettings}},
	} {
		t.Run(m.name, func(t *testing.T) {
			runDriverBothWays(t, driverCase{
				driver: "pgx", mode: "isolation-randomized/" + m.name, needs: m.needs,
				transactions: *isolationTransactions / isolationClients * isolationClients,
				run: func(t *testing.T, dsn string, pooled bool) *driverRun {
					return runIsolationClients(t, dsn, m.mode, seed)
				},
			})
		})
	}
}

// isolationClient is what one client must see.
type isolationClient struct {
	id                                                       int
	schema, row, timeZone, statementTimeout, applicationName string
}

func (c isolationClient) want() []string {
	return []string{c.row, c.schema, c.timeZone, c.statementTimeout, c.applicationName}
}

// isolationCheck is the query every client runs; its columns are what
// isolationClient.want lists.
const isolationCheck = `SELECT v, current_setting('search_path'), current_setting('TimeZone'),
	current_setting('statement_timeout'), current_setting('application_name') FROM t`

func runIsolationClients(t *testing.T, dsn string, mode pgx.QueryExecMode, seed uint64) *driverRun {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	setup := connectMode(t, ctx, dsn, pgx.QueryExecModeExec)
	clients := make([]isolationClient, isolationClients)
	var ddl strings.Builder
	for i := range clients {
		c := isolationClient{
			id:               i,
			schema:           fmt.Sprintf("iso_%d", i),
			row:              fmt.Sprintf("client %d", i),
			timeZone:         isolationTimeZones[i%len(isolationTimeZones)],
			statementTimeout: fmt.Sprintf("%dms", 100000+i+1),
			applicationName:  fmt.Sprintf("iso-client-%d", i),
		}
		clients[i] = c
		fmt.Fprintf(&ddl, "DROP SCHEMA IF EXISTS %[1]s CASCADE; CREATE SCHEMA %[1]s; CREATE TABLE %[1]s.t (v text); INSERT INTO %[1]s.t VALUES ('%[2]s');\n", c.schema, c.row)
	}
	if _, err := setup.Exec(ctx, ddl.String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var drop strings.Builder
		for _, c := range clients {
			fmt.Fprintf(&drop, "DROP SCHEMA IF EXISTS %s CASCADE;", c.schema)
		}
		setup.Exec(context.Background(), drop.String())
	})

	perClient := *isolationTransactions / isolationClients
	var (
		transactions, errs, mismatches atomic.Int64
		shapes                         [4]atomic.Int64
		mu                             sync.Mutex
		firstProblems                  []string
		wg                             sync.WaitGroup
	)
	problem := func(counter *atomic.Int64, format string, args ...any) {
		counter.Add(1)
		mu.Lock()
		defer mu.Unlock()
		if len(firstProblems) < 10 {
			firstProblems = append(firstProblems, fmt.Sprintf(format, args...))
		}
	}
	start := time.Now()
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(c.id)))
			cc, err := pgx.ParseConfig(dsn)
			if err != nil {
				problem(&errs, "client %d: %v", c.id, err)
				return
			}
			cc.DefaultQueryExecMode = mode
			cc.RuntimeParams["application_name"] = c.applicationName
			conn, err := pgx.ConnectConfig(ctx, cc)
			if err != nil {
				problem(&errs, "client %d: connect: %v", c.id, err)
				return
			}
			defer conn.Close(context.Background())
			if _, err := conn.Exec(ctx, fmt.Sprintf("SET search_path = %s", c.schema)); err != nil {
				problem(&errs, "client %d: SET search_path: %v", c.id, err)
				return
			}
			if _, err := conn.Exec(ctx, fmt.Sprintf("SET TimeZone = '%s'", c.timeZone)); err != nil {
				problem(&errs, "client %d: SET TimeZone: %v", c.id, err)
				return
			}
			if _, err := conn.Exec(ctx, fmt.Sprintf("SET statement_timeout = %d", 100000+c.id+1)); err != nil {
				problem(&errs, "client %d: SET statement_timeout: %v", c.id, err)
				return
			}
			// A statement whose text only this client sends.
			own := fmt.Sprintf("SELECT $1::int + %d", c.id)
			for n := range perClient {
				shape := rng.IntN(len(shapes))
				shapes[shape].Add(1)
				transactions.Add(1)
				got, ownSum, err := isolationTransaction(ctx, conn, shape, own, n)
				switch {
				case err != nil:
					problem(&errs, "client %d transaction %d (shape %d): %v", c.id, n, shape, err)
				case !slices.Equal(got, c.want()) || ownSum != n+c.id:
					problem(&mismatches, "client %d transaction %d (shape %d): saw %q and %d, want %q and %d", c.id, n, shape, got, ownSum, c.want(), n+c.id)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, p := range firstProblems {
		t.Error(p)
	}
	if n := mismatches.Load(); n != 0 {
		t.Errorf("%d of %d transactions saw settings or a row not their own", n, transactions.Load())
	}
	t.Logf("%d transactions (shapes %d/%d/%d/%d) in %v (%.0f/s): %d errors, %d mismatches",
		transactions.Load(), shapes[0].Load(), shapes[1].Load(), shapes[2].Load(), shapes[3].Load(),
		elapsed.Round(time.Millisecond), float64(transactions.Load())/elapsed.Seconds(), errs.Load(), mismatches.Load())
	return &driverRun{transactions: int(transactions.Load()), errors: int(errs.Load() + mismatches.Load())}
}

// isolationTransaction runs one transaction of the given shape and returns
// what the check query saw and the client's own statement's answer.
func isolationTransaction(ctx context.Context, conn *pgx.Conn, shape int, own string, n int) (got []string, ownSum int, err error) {
	check := func(q interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) error {
		got = make([]string, 5)
		return q.QueryRow(ctx, isolationCheck).Scan(&got[0], &got[1], &got[2], &got[3], &got[4])
	}
	switch shape {
	case 0: // autocommit
		if err := check(conn); err != nil {
			return nil, 0, err
		}
		return got, ownSum, conn.QueryRow(ctx, own, n).Scan(&ownSum)
	case 1, 2: // a transaction; shape 2 changes search_path for its duration only
		tx, err := conn.Begin(ctx)
		if err != nil {
			return nil, 0, err
		}
		defer tx.Rollback(ctx)
		if shape == 2 {
			var local string
			if _, err := tx.Exec(ctx, "SET LOCAL search_path = pg_catalog"); err != nil {
				return nil, 0, err
			}
			if err := tx.QueryRow(ctx, "SELECT current_setting('search_path')").Scan(&local); err != nil {
				return nil, 0, err
			}
			if local != "pg_catalog" {
				return nil, 0, fmt.Errorf("SET LOCAL search_path = pg_catalog, then search_path %q", local)
			}
			if err := tx.Commit(ctx); err != nil {
				return nil, 0, err
			}
			if err := check(conn); err != nil {
				return nil, 0, err
			}
			return got, ownSum, conn.QueryRow(ctx, own, n).Scan(&ownSum)
		}
		if err := tx.QueryRow(ctx, own, n).Scan(&ownSum); err != nil {
			return nil, 0, err
		}
		if err := check(tx); err != nil {
			return nil, 0, err
		}
		return got, ownSum, tx.Commit(ctx)
	default: // a batch: an implicit transaction of both queries
		batch := &pgx.Batch{}
		got = make([]string, 5)
		batch.Queue(isolationCheck).QueryRow(func(row pgx.Row) error {
			return row.Scan(&got[0], &got[1], &got[2], &got[3], &got[4])
		})
		batch.Queue(own, n).QueryRow(func(row pgx.Row) error { return row.Scan(&ownSum) })
		return got, ownSum, conn.SendBatch(ctx, batch).Close()
	}
}
