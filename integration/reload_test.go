package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reload as an operator expects it, on the binary through the console's
// RELOAD (the path SIGHUP takes too): what changes and what must not.

// reloadProcess is a pgtender process with the console open and a second
// database, appdb2 (the same Postgres database as appdb, a pool of its
// own), whose configuration a test rewrites and reloads.
type reloadProcess struct {
	*process
	port    int
	console *pgx.Conn
}

// consoleSection opens the console in a process's configuration.
const consoleSection = "\n[admin]\npassword = \"" + consolePassword + "\"\n"

// secondDatabase is appdb2's entry, with extra lines.
func secondDatabase(extra string) string {
	return fmt.Sprintf("\n[[databases]]\nname = \"appdb2\"\nhost = %q\nport = %d\ndatabase_name = %q\n%s\n", pg.Host, pg.Port, appDB, extra)
}

func startReloadProcess(t *testing.T, ctx context.Context, general, pool, second string) *reloadProcess {
	t.Helper()
	pr := startProcessWith(t, processOptions{general: general, pool: pool, extraDatabases: secondDatabase(second) + consoleSection})
	console, err := consoleConnect(ctx, pr.addr, consoleUser, consolePassword, "pgbouncer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { console.Close(context.Background()) })
	return &reloadProcess{process: pr, port: atoi(t, strings.TrimPrefix(pr.addr, "127.0.0.1:")), console: console}
}

// reload rewrites the configuration with these entries and runs RELOAD.
func (rp *reloadProcess) reload(t *testing.T, ctx context.Context, general, pool, second string, withSecond bool) {
	t.Helper()
	config := processConfig(rp.port, general, pool)
	if withSecond {
		config += secondDatabase(second)
	}
	writeFile(t, rp.configPath, config+consoleSection)
	if err := consoleExec(ctx, rp.console, "RELOAD"); err != nil {
		t.Fatalf("RELOAD: %v", err)
	}
}

// connectTo logs in to database through rp.
func (rp *reloadProcess) connectTo(t *testing.T, ctx context.Context, database string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&connect_timeout=5", appUser, appPassword, rp.addr, database))
	if err != nil {
		t.Fatalf("login to %s: %v", database, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestReloadLeavesOtherPools: a RELOAD of the unchanged files keeps every
// backend; one that changes a pool (appdb2's pooler_mode, which replaces
// it) gives that pool's client a new backend and leaves the other pool's
// backend alone.
func TestReloadLeavesOtherPools(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rp := startReloadProcess(t, ctx, "", "pool_size = 1", "pool_size = 1")
	first, second := rp.connectTo(t, ctx, appDB), rp.connectTo(t, ctx, "appdb2")
	firstPID, secondPID := backendPID(t, ctx, first), backendPID(t, ctx, second)

	rp.reload(t, ctx, "", "pool_size = 1", "pool_size = 1", true)
	if got := backendPID(t, ctx, first); got != firstPID {
		t.Errorf("appdb's backend changed across a RELOAD of unchanged files: %d -> %d", firstPID, got)
	}
	if got := backendPID(t, ctx, second); got != secondPID {
		t.Errorf("appdb2's backend changed across a RELOAD of unchanged files: %d -> %d", secondPID, got)
	}

	rp.reload(t, ctx, "", "pool_size = 1", "pool_size = 1\npooler_mode = \"session\"", true)
	if got := backendPID(t, ctx, first); got != firstPID {
		t.Errorf("appdb's backend changed when only appdb2 changed: %d -> %d", firstPID, got)
	}
	if got := backendPID(t, ctx, second); got == secondPID {
		t.Errorf("appdb2's pool was replaced, but its client kept backend %d", got)
	}
	if r := show(t, ctx, rp.console, "pools").find("database", "appdb2"); r == nil || r["pool_mode"] != "session" {
		t.Errorf("SHOW POOLS appdb2 after the reload: %v, want pool_mode session", r)
	}
}

// TestReloadPoolModeChange: a client takes its pool's new pooler_mode at
// its next transaction. To session mode, the next transaction keeps its
// server connection (with pool_size 1, another client then waits); back
// to transaction mode, a client linked in session mode keeps its server
// connection until it leaves (its session's state lives there), and the
// clients that were not linked share the pool again at once.
func TestReloadPoolModeChange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const general = "checkout_timeout = 1000"
	rp := startReloadProcess(t, ctx, general, "pool_size = 1", "")
	a, b := rp.connectTo(t, ctx, appDB), rp.connectTo(t, ctx, appDB)
	for _, c := range []*pgx.Conn{a, b, a} {
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("transaction mode, one server connection for two clients: %v", err)
		}
	}
	// pgx's QueryRow prepares a named statement, renamed in transaction
	// mode: a goes on using it after it has moved to session mode.
	backendPID(t, ctx, a)

	rp.reload(t, ctx, general, "pool_size = 1\npooler_mode = \"session\"", "", true)
	if _, err := a.Exec(ctx, "SET application_name = 'held by a'"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Exec(ctx, "SELECT 1"); sqlState(err) != "53300" {
		t.Fatalf("another client's query while a holds the only server connection in session mode: %v, want 53300", err)
	}
	var name string
	if err := a.QueryRow(ctx, "SHOW application_name").Scan(&name); err != nil || name != "held by a" {
		t.Fatalf("a's session state in session mode: %q, %v", name, err)
	}
	if first, again := backendPID(t, ctx, a), backendPID(t, ctx, a); first != again {
		t.Errorf("a's backend changed in session mode: %d -> %d", first, again)
	}
	a.Close(ctx)
	if _, err := b.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("b once a has left: %v", err)
	}
	// b is linked in session mode now; d logs in and runs nothing yet.
	if _, err := b.Exec(ctx, "SET application_name = 'held by b'"); err != nil {
		t.Fatal(err)
	}
	d := rp.connectTo(t, ctx, appDB)
	heldPID := backendPID(t, ctx, b)

	rp.reload(t, ctx, general, "pool_size = 1", "", true)
	// The new pool has a server connection of its own (b's belongs to the
	// replaced pool until b leaves): d, which had run nothing, and c, new,
	// share it in transaction mode, while b keeps its own.
	c := rp.connectTo(t, ctx, appDB)
	for _, client := range []*pgx.Conn{d, c, b, d, c, b} {
		if _, err := client.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("after the reload to transaction mode: %v", err)
		}
		// A named statement each: d's, c's renamed, b's in session mode.
		var one int
		if err := client.QueryRow(ctx, "SELECT $1::int", 1).Scan(&one); err != nil || one != 1 {
			t.Fatalf("a prepared statement after the reload to transaction mode: %d, %v", one, err)
		}
	}
	if got := backendPID(t, ctx, b); got != heldPID {
		t.Errorf("b, linked in session mode, moved from backend %d to %d after the reload", heldPID, got)
	}
	if err := b.QueryRow(ctx, "SHOW application_name").Scan(&name); err != nil || name != "held by b" {
		t.Errorf("b's session state after the reload: application_name %q, %v", name, err)
	}
	if !strings.Contains(rp.output.String(), "client takes its pool's new pooler_mode") {
		t.Error("the mode change of a client was not logged")
	}
}

// TestReloadRemovedDatabaseDrains: a RELOAD that removes a database ends
// its idle clients at once (FATAL 57P01), lets a transaction in flight
// commit and then ends its client, refuses new logins with 3D000, and
// leaves the other database's client and backend alone.
func TestReloadRemovedDatabaseDrains(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rp := startReloadProcess(t, ctx, "", "pool_size = 2", "pool_size = 2")
	superuser := direct(t, ctx)
	if _, err := superuser.Exec(ctx, "DROP TABLE IF EXISTS reload_rows; CREATE TABLE reload_rows (v text); GRANT ALL ON reload_rows TO "+appUser); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { superuser.Exec(context.Background(), "DROP TABLE IF EXISTS reload_rows") })
	other := rp.connectTo(t, ctx, appDB)
	otherPID := backendPID(t, ctx, other)
	idle, inFlight := rp.connectTo(t, ctx, "appdb2"), rp.connectTo(t, ctx, "appdb2")
	if _, err := inFlight.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := inFlight.Exec(ctx, "INSERT INTO reload_rows VALUES ('before the reload')"); err != nil {
		t.Fatal(err)
	}

	rp.reload(t, ctx, "", "pool_size = 2", "", false)
	if _, err := idle.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("an idle client of the removed database could still run a query")
	} else if code := sqlState(err); code != "" && code != "57P01" {
		t.Errorf("an idle client of the removed database: %v, want 57P01 or a closed connection", err)
	}
	if _, err := inFlight.Exec(ctx, "INSERT INTO reload_rows VALUES ('after the reload')"); err != nil {
		t.Fatalf("the transaction in flight after the reload: %v", err)
	}
	if _, err := inFlight.Exec(ctx, "COMMIT"); err != nil {
		t.Fatalf("COMMIT of the transaction in flight: %v", err)
	}
	var rows int
	if err := superuser.QueryRow(ctx, "SELECT count(*) FROM reload_rows").Scan(&rows); err != nil || rows != 2 {
		t.Errorf("rows committed by the transaction in flight: %d, %v; want 2", rows, err)
	}
	eventually(t, 10*time.Second, "the client of the removed database to be ended after its transaction", func() bool {
		_, err := inFlight.Exec(ctx, "SELECT 1")
		return err != nil
	})
	_, err := pgx.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s/appdb2?sslmode=disable&connect_timeout=5", appUser, appPassword, rp.addr))
	if sqlState(err) != "3D000" {
		t.Errorf("a login to the removed database: %v, want 3D000", err)
	}
	if got := backendPID(t, ctx, other); got != otherPID {
		t.Errorf("the other database's backend changed: %d -> %d", otherPID, got)
	}
	if r := show(t, ctx, rp.console, "pools").find("database", "appdb2"); r != nil {
		t.Errorf("SHOW POOLS still lists the removed database: %v", r)
	}
	if !strings.Contains(rp.output.String(), "reload removed pools") {
		t.Error("the end of the removed database's clients was not logged")
	}
}
