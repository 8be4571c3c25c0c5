package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestUnnamedStatementNeverRunsAnotherClients: a client that parses the
// unnamed statement in one batch and binds it in a later one (pgx's
// describe-exec mode) may find its server connection's unnamed statement
// made by another client meanwhile. Straight to Postgres the client runs
// its own statement, and through pgtender too: pgtender prepares the
// client's unnamed statement again before its Bind, and never runs the
// other client's. Pool of 1, so both clients share the server connection.
func TestUnnamedStatementNeverRunsAnotherClients(t *testing.T) {
	tp := startPooler(t, poolerOptions{
		general: `passthrough_auth = "enabled_plain"`,
		pool:    "pool_size = 1",
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	connect := func(dsn string) *pgconn.PgConn {
		conn, err := pgconn.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	run := func(dsn string) (result string, code string) {
		a, b := connect(dsn), connect(dsn)
		// Parse+Describe+Sync of the unnamed statement, each client its
		// own text with one int parameter, A first.
		if _, err := a.Prepare(ctx, "", "SELECT 'a:' || $1::int", nil); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Prepare(ctx, "", "SELECT 'b:' || $1::int", nil); err != nil {
			t.Fatal(err)
		}
		// A binds "its" unnamed statement in a batch of its own.
		rr := a.ExecPrepared(ctx, "", [][]byte{[]byte("1")}, nil, nil).Read()
		if rr.Err != nil {
			return "", sqlState(rr.Err)
		}
		if len(rr.Rows) != 1 {
			t.Fatalf("%d rows", len(rr.Rows))
		}
		// A's own statement works again once it parses it again.
		if _, err := a.Prepare(ctx, "", "SELECT 'a:' || $1::int", nil); err != nil {
			t.Fatal(err)
		}
		again := a.ExecPrepared(ctx, "", [][]byte{[]byte("2")}, nil, nil).Read()
		if again.Err != nil || len(again.Rows) != 1 || string(again.Rows[0][0]) != "a:2" {
			t.Fatalf("after parsing again: %v %q", again.Err, again.Rows)
		}
		return string(rr.Rows[0][0]), ""
	}
	if result, code := run(pg.ConnString(appUser, appPassword, appDB)); result != "a:1" || code != "" {
		t.Fatalf("direct: %q, SQLSTATE %q; want a:1", result, code)
	}
	result, code := run(tp.connString(appUser, appPassword, appDB))
	if result != "a:1" || code != "" {
		t.Fatalf("through pgtender: %q, SQLSTATE %q; want a:1 as straight to Postgres (never b:1)", result, code)
	}
}
