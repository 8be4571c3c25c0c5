package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestSettingsToldAtLoginFollowTheServer: the ParameterStatus set a client
// is told at login is what the server connections opened last reported,
// not what the pool's first one did: after ALTER ROLE … SET TimeZone and
// new server connections, a new client is told the new TimeZone, as a
// direct connection would be.
func TestSettingsToldAtLoginFollowTheServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const role, password = "params_follow", "params-secret"
	newRole(t, role, password)
	tp := startDriversPooler(t, 1)
	connect := func() *pgx.Conn {
		t.Helper()
		conn, err := tp.connectAs(ctx, role, password, appDB)
		if err != nil {
			t.Fatalf("connect as %s: %v", role, err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	first := connect()
	before := first.PgConn().ParameterStatus("TimeZone")
	want := "Asia/Kolkata"
	if before == want {
		want = "America/Sao_Paulo"
	}
	alterRole(t, role, "SET TimeZone = '"+want+"'")

	// The pool's server connection goes away (a failover, a restart); the
	// next query needs one and the pool opens it.
	super := direct(t, ctx)
	if _, err := super.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the role's backends to end", func() bool {
		return serverConnections(t, ctx, super, role) == 0
	})
	var shown string
	if err := first.QueryRow(ctx, "SHOW TimeZone").Scan(&shown); err != nil || shown != want {
		t.Fatalf("on the new server connection SHOW TimeZone = %q, %v; want %q", shown, err, want)
	}

	second := connect()
	if got := second.PgConn().ParameterStatus("TimeZone"); got != want {
		t.Errorf("a login after the change is told TimeZone = %q, want %q (before: %q)", got, want, before)
	}
	direct, err := pgx.Connect(ctx, pg.ConnString(role, password, appDB))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close(ctx)
	if got := direct.PgConn().ParameterStatus("TimeZone"); got != want {
		t.Errorf("straight to Postgres the login is told TimeZone = %q, want %q", got, want)
	}
}
