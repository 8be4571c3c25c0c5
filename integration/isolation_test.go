package integration

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestSettingsIsolation runs scenes of session settings between two or
// three pgx clients (QueryExecModeExec: unnamed statements only, so that
// only settings are under test), once straight to Postgres, where each
// client is its own session, and once through pgtender over a pool of one
// (every client shares the one server connection) or two (a client's next
// transaction may land on the other). Every client must see exactly what it
// set and nothing another client set, as straight to Postgres.
func TestSettingsIsolation(t *testing.T) {
	for _, scene := range []settingsScene{
		{"set_not_seen_by_others", 1, []poolerFeature{sessionSettings}, sceneSetNotSeenByOthers},
		{"own_values_on_another_server", 2, []poolerFeature{sessionSettings}, sceneOwnValuesOnAnotherServer},
		{"reset_and_reset_all", 1, []poolerFeature{sessionSettings}, sceneReset},
		{"set_config", 1, []poolerFeature{sessionSettings}, sceneSetConfig},
		{"set_local_and_rolled_back_set", 1, []poolerFeature{sessionSettings}, sceneTransactions},
		{"startup_options", 1, []poolerFeature{startupOptions}, sceneStartupOptions},
		{"startup_refused", 1, []poolerFeature{startupOptions}, sceneStartupRefused},
		{"same_startup_settings", 1, []poolerFeature{startupOptions}, sceneSameStartupSettings},
	} {
		t.Run(scene.name, func(t *testing.T) {
			runDriverBothWays(t, driverCase{
				driver: "pgx", mode: "settings/" + scene.name, needs: scene.needs, poolSize: scene.poolSize,
				run: func(t *testing.T, dsn string, pooled bool) *driverRun {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					defer cancel()
					e := &settingsEnv{t: t, ctx: ctx, dsn: dsn, pooled: pooled, run: &driverRun{observed: map[string]string{}}}
					e.defaults = e.connect("defaults", nil).values(settingsUnderTest...)
					scene.run(e)
					return e.run
				},
			})
		})
	}
}

// settingsUnderTest are the settings the scenes set; their defaults are
// read from a fresh session at the start of each run.
var settingsUnderTest = []string{"statement_timeout", "search_path", "work_mem", "application_name"}

// settingsScene is one scene of TestSettingsIsolation.
type settingsScene struct {
	name     string
	poolSize int
	needs    []poolerFeature
	run      func(e *settingsEnv)
}

// settingsEnv is one run of a scene.
type settingsEnv struct {
	t        *testing.T
	ctx      context.Context
	dsn      string
	pooled   bool
	run      *driverRun
	defaults map[string]string
}

// settingsClient is one client of a scene. Every statement it sends is
// counted in the run; every failed statement or check is an error of the
// run and of the test.
type settingsClient struct {
	e    *settingsEnv
	name string
	conn *pgx.Conn
}

// connect opens a client with extra startup parameters (pgx RuntimeParams).
func (e *settingsEnv) connect(name string, params map[string]string) *settingsClient {
	e.t.Helper()
	conn, err := e.dial(params)
	if err != nil {
		e.t.Fatalf("client %s: connect: %v", name, err)
	}
	e.t.Cleanup(func() { conn.Close(context.Background()) })
	return &settingsClient{e: e, name: name, conn: conn}
}

func (e *settingsEnv) dial(params map[string]string) (*pgx.Conn, error) {
	cc, err := pgx.ParseConfig(e.dsn)
	if err != nil {
		return nil, err
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeExec
	maps.Copy(cc.RuntimeParams, params)
	return pgx.ConnectConfig(e.ctx, cc)
}

func (c *settingsClient) failf(format string, args ...any) {
	c.e.t.Helper()
	c.e.run.errors++
	c.e.t.Errorf("client %s: "+format, append([]any{c.name}, args...)...)
}

// exec runs sql (which may be several statements, sent as one simple query
// when args is empty and pgx's Exec mode allows).
func (c *settingsClient) exec(sql string, args ...any) {
	c.e.t.Helper()
	c.e.run.transactions++
	if _, err := c.conn.Exec(c.e.ctx, sql, args...); err != nil {
		c.failf("%s: %v", sql, err)
	}
}

// execFails runs sql, which must fail with SQLSTATE code.
func (c *settingsClient) execFails(sql, code string) {
	c.e.t.Helper()
	c.e.run.transactions++
	if _, err := c.conn.Exec(c.e.ctx, sql); sqlState(err) != code {
		c.failf("%s: %v, want SQLSTATE %s", sql, err, code)
	}
}

// show checks that the client sees want for setting. A statement_timeout
// of 1ms may cancel the SHOW itself (57014), which shows it in effect.
func (c *settingsClient) show(setting, want string) {
	c.e.t.Helper()
	c.e.run.transactions++
	var got string
	err := c.conn.QueryRow(c.e.ctx, "SHOW "+setting).Scan(&got)
	switch {
	case err != nil && sqlState(err) == "57014" && setting == "statement_timeout" && want == "1ms":
	case err != nil:
		c.failf("SHOW %s: %v", setting, err)
	case got != want:
		c.failf("SHOW %s = %q, want %q", setting, got, want)
	}
}

// showDefaults checks that the client sees every default but those in except.
func (c *settingsClient) showDefaults(except ...string) {
	c.e.t.Helper()
	for _, setting := range settingsUnderTest {
		if setting == "application_name" {
			continue // a client's own startup value, checked where set
		}
		skip := false
		for _, e := range except {
			skip = skip || e == setting
		}
		if !skip {
			c.show(setting, c.e.defaults[setting])
		}
	}
}

// values reads settings (to learn the defaults).
func (c *settingsClient) values(settings ...string) map[string]string {
	c.e.t.Helper()
	values := map[string]string{}
	for _, setting := range settings {
		var v string
		if err := c.conn.QueryRow(c.e.ctx, "SHOW "+setting).Scan(&v); err != nil {
			c.e.t.Fatalf("SHOW %s: %v", setting, err)
		}
		values[setting] = v
	}
	return values
}

// serverPID is the Postgres backend that ran the client's last query.
func (c *settingsClient) serverPID() int {
	c.e.t.Helper()
	c.e.run.transactions++
	var pid int
	if err := c.conn.QueryRow(c.e.ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		c.failf("pg_backend_pid(): %v", err)
	}
	return pid
}

// sceneSetNotSeenByOthers: A sets three settings (one a 200 ms statement
// timeout that would cancel B's 300 ms query if it leaked); B, on the same
// server connection, sees the defaults and can run that query; A still
// sees its own. The timeout is long enough that A's own statements do not
// hit it on a busy machine, as 1 ms did.
func sceneSetNotSeenByOthers(e *settingsEnv) {
	a, b := e.connect("A", nil), e.connect("B", nil)
	a.exec("SET statement_timeout = '200ms'")
	a.exec("SET search_path = pg_catalog")
	a.exec("SET work_mem = '77MB'")
	b.showDefaults()
	b.exec("SELECT pg_sleep(0.3)")
	a.show("statement_timeout", "200ms")
	a.show("search_path", "pg_catalog")
	a.show("work_mem", "77MB")
	b.showDefaults()
	a.execFails("SELECT pg_sleep(0.5)", "57014")
	b.exec("SELECT pg_sleep(0.3)")
}

// sceneOwnValuesOnAnotherServer: over a pool of two, B and C take turns
// holding a server connection in a transaction while A runs, so A's
// transactions land on both; A sees its values on each, B and C never do.
func sceneOwnValuesOnAnotherServer(e *settingsEnv) {
	a, b, c := e.connect("A", nil), e.connect("B", nil), e.connect("C", nil)
	a.exec("SET statement_timeout = '250s'")
	a.exec("SET search_path = pg_catalog")
	a.exec("SET work_mem = '77MB'")
	seen := map[int]bool{}
	for round := range 8 {
		holder := []*settingsClient{b, c}[round%2]
		if round%4 < 2 {
			holder.exec("BEGIN")
			holder.showDefaults()
		}
		seen[a.serverPID()] = true
		a.show("statement_timeout", "250s")
		a.show("search_path", "pg_catalog")
		a.show("work_mem", "77MB")
		if round%4 < 2 {
			holder.exec("COMMIT")
		}
		holder.showDefaults()
	}
	if e.pooled && len(seen) < 2 {
		a.failf("ran on %d server connections of the pool of two, want both: the scene did not move A", len(seen))
	}
	e.t.Logf("A ran on %d server connection(s)", len(seen))
}

// sceneReset: RESET one setting, then RESET ALL, which returns each
// setting to the session's default, the startup value for
// application_name.
func sceneReset(e *settingsEnv) {
	a, b := e.connect("A", map[string]string{"application_name": "settings-a"}), e.connect("B", nil)
	a.exec("SET statement_timeout = '200ms'") // long enough for A's own statements
	a.exec("SET search_path = pg_catalog")
	a.exec("SET work_mem = '77MB'")
	a.exec("SET application_name = 'settings-a-changed'")
	a.exec("RESET statement_timeout")
	a.show("statement_timeout", e.defaults["statement_timeout"])
	b.showDefaults()
	a.show("search_path", "pg_catalog")
	a.show("work_mem", "77MB")
	a.show("application_name", "settings-a-changed")
	a.exec("RESET ALL")
	b.showDefaults()
	a.showDefaults()
	a.show("application_name", "settings-a")
	b.show("application_name", e.defaults["application_name"])
}

// sceneSetConfig: set_config(..., false) is a session SET, set_config(...,
// true) lasts for its (implicit) transaction only.
func sceneSetConfig(e *settingsEnv) {
	a, b := e.connect("A", nil), e.connect("B", nil)
	a.exec("SELECT set_config('search_path', 'x', false)")
	a.exec("SELECT set_config('work_mem', '12MB', true)")
	b.showDefaults()
	a.show("search_path", "x")
	a.show("work_mem", e.defaults["work_mem"])
	a.exec("SELECT set_config('search_path', $1, false)", "pg_catalog, x")
	b.showDefaults()
	a.show("search_path", "pg_catalog, x")
}

// sceneTransactions: SET LOCAL ends with its transaction; a SET inside a
// transaction that is rolled back (or rolled back to a savepoint, or
// failed) does not last; one inside a committed transaction does.
func sceneTransactions(e *settingsEnv) {
	a, b := e.connect("A", nil), e.connect("B", nil)
	a.exec("BEGIN")
	a.exec("SET LOCAL statement_timeout = '7s'")
	a.show("statement_timeout", "7s")
	a.exec("COMMIT")
	a.showDefaults()
	b.showDefaults()

	a.exec("BEGIN")
	a.exec("SET search_path = pg_catalog")
	a.show("search_path", "pg_catalog")
	a.exec("ROLLBACK")
	a.showDefaults()
	b.showDefaults()

	a.exec("BEGIN")
	a.exec("SET work_mem = '33MB'")
	a.execFails("SELECT 1 / 0", "22012")
	a.exec("ROLLBACK")
	a.showDefaults()

	a.exec("BEGIN")
	a.exec("SAVEPOINT s")
	a.exec("SET search_path = pg_catalog")
	a.exec("ROLLBACK TO SAVEPOINT s")
	a.exec("SET work_mem = '33MB'")
	a.exec("COMMIT")
	a.show("search_path", e.defaults["search_path"])
	a.show("work_mem", "33MB")
	b.showDefaults()
	a.show("work_mem", "33MB")
}

// sceneStartupOptions: settings from the startup packet, as options=-c
// and as bare runtime parameters (pgjdbc sends extra_float_digits=3 this
// way), hold for the client, and only for it; RESET ALL returns to them.
func sceneStartupOptions(e *settingsEnv) {
	a := e.connect("A", map[string]string{"options": "-c search_path=foo -c statement_timeout=5s"})
	b := e.connect("B", nil)
	c := e.connect("C", map[string]string{"statement_timeout": "4s", "search_path": "bar", "extra_float_digits": "3"})
	a.show("search_path", "foo")
	a.show("statement_timeout", "5s")
	b.showDefaults()
	b.show("extra_float_digits", "1")
	c.show("statement_timeout", "4s")
	c.show("search_path", "bar")
	c.show("extra_float_digits", "3")
	a.show("search_path", "foo")
	a.exec("SET search_path = pg_catalog")
	a.exec("RESET ALL")
	a.show("search_path", "foo")
	a.show("statement_timeout", "5s")
	b.showDefaults()
}

// sceneSameStartupSettings: clients whose startup packets ask for the
// same settings (which pgtender keeps once for all of them) each keep
// them as their own: what one sets, and its RESET ALL, changes nothing for
// the others, nor for one that logs in afterwards with the same packet.
func sceneSameStartupSettings(e *settingsEnv) {
	same := map[string]string{"options": "-c search_path=foo", "statement_timeout": "4s"}
	a := e.connect("A", same)
	b := e.connect("B", same)
	a.exec("SET search_path = pg_catalog")
	a.exec("SET statement_timeout = '7s'")
	b.show("search_path", "foo")
	b.show("statement_timeout", "4s")
	c := e.connect("C", same)
	c.show("search_path", "foo")
	c.show("statement_timeout", "4s")
	a.show("search_path", "pg_catalog")
	a.show("statement_timeout", "7s")
	a.exec("RESET ALL")
	a.show("search_path", "foo")
	a.show("statement_timeout", "4s")
	b.exec("SET search_path = bar")
	c.show("search_path", "foo")
	a.show("search_path", "foo")
	b.show("search_path", "bar")
}

// sceneStartupRefused: an invalid startup setting is refused at login, with
// the SQLSTATE Postgres gives (compared between the runs).
func sceneStartupRefused(e *settingsEnv) {
	for _, bad := range []struct {
		name   string
		params map[string]string
	}{
		{"timezone_mars", map[string]string{"TimeZone": "Mars/Base"}},
		{"unknown_parameter", map[string]string{"no_such_setting": "1"}},
		{"options_bad_value", map[string]string{"options": "-c statement_timeout=forever"}},
		{"options_unknown_parameter", map[string]string{"options": "-c no_such_setting=1"}},
	} {
		e.run.transactions++
		conn, err := e.dial(bad.params)
		if err == nil {
			conn.Close(context.Background())
			e.run.errors++
			e.t.Errorf("%s: login with %v succeeded, want it refused", bad.name, bad.params)
			e.run.observed["refused_"+bad.name] = "not refused"
			continue
		}
		code := sqlState(err)
		if code == "" {
			e.run.errors++
			e.t.Errorf("%s: login with %v failed without a SQLSTATE: %v", bad.name, bad.params, err)
		}
		e.run.observed["refused_"+bad.name] = code
		e.t.Logf("%s: %v", bad.name, err)
	}
	// The pool still serves good logins.
	b := e.connect("B", nil)
	b.showDefaults()
}
