package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Custom parameters ("app.tenant", any name with a dot) are not listed in
// pg_settings: pgtender learns their names from the statements that set
// them (pooler/sqlscan) and asks for each by name. These tests run through
// pgtender in transaction mode.

// customClient is a pgx client of the pooler (unnamed statements only).
type customClient struct {
	t    *testing.T
	ctx  context.Context
	name string
	conn *pgx.Conn
}

func connectCustom(t *testing.T, ctx context.Context, tp *testPooler, name string) *customClient {
	t.Helper()
	return &customClient{t: t, ctx: ctx, name: name, conn: tp.connect(t, ctx)}
}

func (c *customClient) exec(sql string, args ...any) {
	c.t.Helper()
	if _, err := c.conn.Exec(c.ctx, sql, args...); err != nil {
		c.t.Fatalf("client %s: %s: %v", c.name, sql, err)
	}
}

// setting is current_setting(name, true), "<null>" for NULL.
func (c *customClient) setting(name string) string {
	c.t.Helper()
	var value *string
	if err := c.conn.QueryRow(c.ctx, "SELECT current_setting($1, true)", name).Scan(&value); err != nil {
		c.t.Fatalf("client %s: current_setting(%q): %v", c.name, name, err)
	}
	if value == nil {
		return "<null>"
	}
	return *value
}

// unset checks that the client does not see name set: NULL, or the empty
// string of a placeholder that another session's SET left on the backend
// and pgtender reset (docs/pooling.md, "Custom parameters").
func (c *customClient) unset(name string) {
	c.t.Helper()
	if got := c.setting(name); got != "<null>" && got != "" {
		c.t.Errorf("client %s sees %s = %q, set by another client", c.name, name, got)
	}
}

func (c *customClient) sees(name, want string) {
	c.t.Helper()
	if got := c.setting(name); got != want {
		c.t.Errorf("client %s: %s = %q, want %q", c.name, name, got, want)
	}
}

func (c *customClient) backendPID() int {
	c.t.Helper()
	var pid int
	if err := c.conn.QueryRow(c.ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		c.t.Fatalf("client %s: pg_backend_pid(): %v", c.name, err)
	}
	return pid
}

// TestCustomSettingsFollowTheClient: over a pool of one, a custom
// parameter client A sets with SET or set_config(…, false) reaches none of
// the clients that share its server connection, and A keeps it.
func TestCustomSettingsFollowTheClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tp := startDriversPooler(t, 1)
	a, b := connectCustom(t, ctx, tp, "A"), connectCustom(t, ctx, tp, "B")

	a.exec("SET app.tenant = '7'")
	if pa, pb := a.backendPID(), b.backendPID(); pa != pb {
		t.Fatalf("A on backend %d, B on %d: the pool of one is not shared", pa, pb)
	}
	b.unset("app.tenant")
	a.sees("app.tenant", "7")
	b.unset("app.tenant")

	a.exec("SELECT set_config('app.tenant2', '8', false)")
	b.unset("app.tenant2")
	a.sees("app.tenant2", "8")
	a.sees("app.tenant", "7")

	// A name in another case is the same parameter; RESET ends it for A.
	a.exec(`SET "APP".Tenant3 = 'x'`)
	b.unset("app.tenant3")
	a.sees("App.Tenant3", "x")
	a.exec("RESET app.tenant")
	a.unset("app.tenant")
	a.sees("app.tenant2", "8")

	// Nor does a client that comes after A has gone.
	a.conn.Close(ctx)
	c := connectCustom(t, ctx, tp, "C")
	c.unset("app.tenant2")
	c.unset("app.tenant3")
	b.unset("app.tenant2")

	// A named prepared statement (pgx's statement cache) that sets one,
	// run again from the cache with another value.
	cc, err := pgx.ParseConfig(tp.connString(appUser, appPassword, appDB))
	if err != nil {
		t.Fatal(err)
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	d := &customClient{t: t, ctx: ctx, name: "D", conn: conn}
	for _, value := range []string{"1", "2"} {
		d.exec("SELECT set_config('app.tenant4', $1, false)", value)
		b.unset("app.tenant4")
		d.sees("app.tenant4", value)
	}
}

// TestCustomSettingUnknownNamePins: set_config with a name the text does
// not show (a parameter) may set any custom parameter, which no probe can
// ask for: the client keeps its server connection for good, counted in
// cl_pinned, and the connection is closed when it leaves, never handed to
// another client.
func TestCustomSettingUnknownNamePins(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tp := startDriversPooler(t, 2)
	a, b := connectCustom(t, ctx, tp, "A"), connectCustom(t, ctx, tp, "B")

	a.exec("SELECT set_config($1, '9', false)", "app.hidden")
	pid := a.backendPID()
	pinned := func() int {
		n := 0
		for _, s := range tp.PoolStats() {
			n += s.ClientsPinned
		}
		return n
	}
	eventually(t, 10*time.Second, "A to be counted as pinned", func() bool { return pinned() == 1 })
	for range 5 {
		if got := a.backendPID(); got != pid {
			t.Fatalf("A moved from backend %d to %d", pid, got)
		}
		if b.backendPID() == pid {
			t.Fatalf("B ran on A's pinned backend %d", pid)
		}
		b.unset("app.hidden")
	}
	a.sees("app.hidden", "9")
	if !strings.Contains(tp.logs.String(), "server connection pinned to its client") {
		t.Error("the pin is not logged")
	}

	a.conn.Close(ctx)
	eventually(t, 10*time.Second, "the pin to end", func() bool { return pinned() == 0 })
	super := direct(t, ctx)
	eventually(t, 10*time.Second, "A's backend to be closed", func() bool {
		var n int
		if err := super.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	// Two more clients use both server connections of the pool: neither
	// is A's.
	c := connectCustom(t, ctx, tp, "C")
	if _, err := b.conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if c.backendPID() == pid {
		t.Error("C ran on A's backend")
	}
	c.unset("app.hidden")
	b.exec("COMMIT")
}

// TestCustomSettingSetInsideAFunction: a custom parameter set inside a
// function, where no text pgtender reads shows it, is found by the probe
// once any client of the pool showed the name (docs/pooling.md, "Custom
// parameters"): the client that called the function keeps the value, and
// no client after it on the same server connection sees it. That holds for
// the client that showed the name itself, and for one that never did.
//
// The function also sets application_name, which Postgres reports: that
// report is what marks the transaction for a probe. A function that sets
// only parameters Postgres does not report is not noticed at all
// (docs/pooling.md, "Limitations").
func TestCustomSettingSetInsideAFunction(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	super := direct(t, ctx)
	if _, err := super.Exec(ctx, `CREATE OR REPLACE FUNCTION customnames_set_tenant(tenant text) RETURNS void LANGUAGE sql AS $$
		SELECT pg_catalog.set_config('app.tenant', tenant, false), pg_catalog.set_config('application_name', 'tenant ' || tenant, false)
	$$`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := super.Exec(context.Background(), "DROP FUNCTION customnames_set_tenant(text)"); err != nil {
			t.Errorf("drop the test's function: %v", err)
		}
	})
	tp := startDriversPooler(t, 1)
	a, b := connectCustom(t, ctx, tp, "A"), connectCustom(t, ctx, tp, "B")

	a.exec("SET app.tenant = 'a'")
	a.exec("SELECT customnames_set_tenant('b')")
	if pa, pb := a.backendPID(), b.backendPID(); pa != pb {
		t.Fatalf("A on backend %d, B on %d: the pool of one is not shared", pa, pb)
	}
	b.unset("app.tenant")
	a.sees("app.tenant", "b")

	// C never showed the name: the pool's list, learnt from A, makes
	// C's probe ask for it.
	c := connectCustom(t, ctx, tp, "C")
	c.exec("SELECT customnames_set_tenant('c')")
	b.unset("app.tenant")
	c.sees("app.tenant", "c")
	a.sees("app.tenant", "b")
}
