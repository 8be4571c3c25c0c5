package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtender/pgtender/pooler"
)

// TestClientIdleInTransactionIsDisconnected: under
// client_idle_in_transaction_timeout, a client that leaves a transaction
// (or a failed one) open and sends nothing is disconnected with Postgres's
// 25P03, its transaction is rolled back, and its server connection goes to
// the pool's next client. Clients that are busy inside a transaction, or
// idle outside one, for longer than the timeout are not touched.
func TestClientIdleInTransactionIsDisconnected(t *testing.T) {
	want := postgresIdleInTransactionError(t)
	for _, mode := range []string{"transaction", "session"} {
		t.Run(mode, func(t *testing.T) { clientIdleInTransaction(t, mode, want) })
	}
}

// postgresIdleInTransactionError is what a client of Postgres itself sees
// after idle_in_transaction_session_timeout: pgtender's clients must see
// the same.
func postgresIdleInTransactionError(t *testing.T) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := direct(t, ctx)
	for _, sql := range []string{"SET idle_in_transaction_session_timeout = 300", "BEGIN", "SELECT 1"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	_, err := conn.Exec(ctx, "COMMIT")
	if err == nil {
		t.Fatal("Postgres did not end a session idle in a transaction past idle_in_transaction_session_timeout")
	}
	return err
}

func clientIdleInTransaction(t *testing.T, mode string, want error) {
	const timeout = 300 * time.Millisecond
	tp := startPooler(t, poolerOptions{
		general: "passthrough_auth = \"enabled_plain\"\nclient_idle_in_transaction_timeout = 300",
		pool:    "pool_size = 1\npooler_mode = \"" + mode + "\"",
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	table := "idle_tx_rows_" + mode

	idle := tp.connect(t, ctx)
	for _, sql := range []string{"DROP TABLE IF EXISTS " + table, "CREATE TABLE " + table + " (v text)"} {
		if _, err := idle.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	backend := backendPID(t, ctx, idle)

	// Busy inside a transaction for longer than the timeout, then idle
	// outside one for longer: neither is cut.
	for _, sql := range []string{"BEGIN", "SELECT pg_sleep(0.6)", "SELECT 1", "COMMIT"} {
		if _, err := idle.Exec(ctx, sql); err != nil {
			t.Fatalf("%s in a transaction busier than the timeout: %v", sql, err)
		}
	}
	time.Sleep(2 * timeout)
	if _, err := idle.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("a client idle outside a transaction was cut: %v", err)
	}

	// Idle inside a transaction.
	for _, sql := range []string{"BEGIN", "INSERT INTO " + table + " VALUES ('left open')"} {
		if _, err := idle.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, "the idle client to be disconnected", func() bool {
		return tp.ClientTimeouts() == pooler.ClientTimeouts{IdleInTransaction: 1}
	})
	_, err := idle.Exec(ctx, "COMMIT")
	if sqlState(err) != sqlState(want) || errorMessage(err) != errorMessage(want) {
		t.Fatalf("COMMIT after the timeout through pgtender: %v; straight to Postgres: %v", err, want)
	}
	if !strings.Contains(tp.logs.String(), "client idle in a transaction for client_idle_in_transaction_timeout") {
		t.Error("no log line for the disconnected client")
	}

	// Idle in a failed transaction.
	failed := tp.connect(t, ctx)
	if _, err := failed.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := failed.Exec(ctx, "SELECT 1/0"); sqlState(err) != "22012" {
		t.Fatalf("SELECT 1/0: %v", err)
	}
	eventually(t, 10*time.Second, "the client idle in a failed transaction to be disconnected", func() bool {
		return tp.ClientTimeouts().IdleInTransaction == 2
	})

	// The one server connection was rolled back and handed on.
	next := tp.connect(t, ctx)
	var nextBackend int32
	var rows int
	if err := next.QueryRow(ctx, "SELECT pg_backend_pid(), (SELECT count(*) FROM "+table+")").Scan(&nextBackend, &rows); err != nil {
		t.Fatalf("the next client of the pool: %v", err)
	}
	if nextBackend != backend {
		t.Errorf("the next client ran on backend %d, want %d (the rolled-back connection)", nextBackend, backend)
	}
	if rows != 0 {
		t.Errorf("%d rows of the timed-out transaction are visible; want it rolled back", rows)
	}
	if _, err := next.Exec(ctx, "DROP TABLE "+table); err != nil {
		t.Fatal(err)
	}
}

// TestQueryTimeout: a request Postgres does not answer within
// query_timeout (pg_sleep, through the simple and the extended protocol)
// ends the client's session with 57014; the query is canceled on Postgres,
// and the server connection, drained and clean, goes to the next client.
func TestQueryTimeout(t *testing.T) {
	tp := startPooler(t, poolerOptions{
		general: "passthrough_auth = \"enabled_plain\"\nquery_timeout = 300",
		pool:    "pool_size = 1",
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := direct(t, ctx)

	for i, run := range []func(conn *pgx.Conn) error{
		func(conn *pgx.Conn) error { _, err := conn.Exec(ctx, "SELECT pg_sleep(30)"); return err },
		func(conn *pgx.Conn) error { var v any; return conn.QueryRow(ctx, "SELECT pg_sleep($1)", 30).Scan(&v) },
	} {
		client := tp.connect(t, ctx)
		backend := backendPID(t, ctx, client)
		err := run(client)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "57014" || pgErr.Severity != "FATAL" || !strings.Contains(pgErr.Message, "query_timeout") {
			t.Fatalf("run %d: pg_sleep(30) past query_timeout: %v; want FATAL 57014 naming query_timeout", i, err)
		}
		if got := tp.ClientTimeouts().Query; got != uint64(i+1) {
			t.Errorf("run %d: query timeouts counted %d, want %d", i, got, i+1)
		}
		next := tp.connect(t, ctx)
		if nextBackend := backendPID(t, ctx, next); nextBackend != backend {
			t.Errorf("run %d: the next client ran on backend %d, want %d (the drained connection)", i, nextBackend, backend)
		}
		var sleeping int
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'SELECT pg_sleep(%'").Scan(&sleeping); err != nil {
			t.Fatal(err)
		}
		if sleeping != 0 {
			t.Errorf("run %d: %d backends still sleep", i, sleeping)
		}
		next.Close(ctx)
	}
}
