package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestTransactionModeIsolation runs 50 clients over a pool of 5. Each
// client's transactions insert rows tagged with its id and read the table
// back before rolling back, so a client that ever shared a server
// connection mid-transaction would see another client's uncommitted rows.
// Postgres must never hold more than 5 connections for the pool.
func TestTransactionModeIsolation(t *testing.T) {
	const clients, poolSize, transactions = 50, 5, 20
	tp := startPooler(t, poolerOptions{
		general: `passthrough_auth = "enabled_plain"`,
		pool:    fmt.Sprintf("pool_size = %d", poolSize),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := direct(t, ctx)
	if _, err := admin.Exec(ctx, "CREATE TABLE isolation_rows (client int, n int); GRANT ALL ON isolation_rows TO "+appUser); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP TABLE isolation_rows") })

	var maxServers atomic.Int64
	monitorDone := make(chan struct{})
	stopMonitor := make(chan struct{})
	go func() {
		defer close(monitorDone)
		monitor := direct(t, ctx)
		for {
			select {
			case <-stopMonitor:
				return
			default:
			}
			if n := int64(serverConnections(t, ctx, monitor, appUser)); n > maxServers.Load() {
				maxServers.Store(n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for id := 1; id <= clients; id++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := tp.connectAs(ctx, appUser, appPassword, appDB)
			if err != nil {
				errs <- fmt.Errorf("client %d: connect: %w", id, err)
				return
			}
			defer conn.Close(context.Background())
			for i := 0; i < transactions; i++ {
				if err := isolatedTransaction(ctx, conn, id); err != nil {
					errs <- fmt.Errorf("client %d transaction %d: %w", id, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stopMonitor)
	<-monitorDone
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := maxServers.Load(); got > poolSize || got == 0 {
		t.Errorf("Postgres held up to %d connections for the pool, want 1..%d", got, poolSize)
	}
	t.Logf("max server connections seen: %d", maxServers.Load())
}

func isolatedTransaction(ctx context.Context, conn *pgx.Conn, id int) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	for n := 0; n < 3; n++ {
		if _, err := tx.Exec(ctx, "INSERT INTO isolation_rows VALUES ($1, $2)", id, n); err != nil {
			return err
		}
	}
	rows, err := tx.Query(ctx, "SELECT client, count(*) FROM isolation_rows GROUP BY client")
	if err != nil {
		return err
	}
	seen := map[int]int{}
	for rows.Next() {
		var client, count int
		if err := rows.Scan(&client, &count); err != nil {
			return err
		}
		seen[client] = count
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(seen) != 1 || seen[id] != 3 {
		return fmt.Errorf("saw rows %v, want only its own 3", seen)
	}
	return tx.Rollback(ctx)
}

// TestSessionMode checks that a client keeps one server connection for its
// whole life and that the connection is reset (DISCARD ALL) before the next
// client gets it.
func TestSessionMode(t *testing.T) {
	tp := startPooler(t, poolerOptions{
		general: `passthrough_auth = "enabled_plain"
pooler_mode = "session"`,
		pool: "pool_size = 1",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := tp.connect(t, ctx)
	pid := backendPID(t, ctx, first)
	for i := 0; i < 5; i++ {
		if got := backendPID(t, ctx, first); got != pid {
			t.Fatalf("session mode moved the client from backend %d to %d", pid, got)
		}
	}
	if _, err := first.Exec(ctx, "SET application_name = 'left-behind'"); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Exec(ctx, "CREATE TEMP TABLE session_scratch (x int)"); err != nil {
		t.Fatal(err)
	}

	// With a pool of one, a second client waits until the first leaves.
	second := make(chan *pgx.Conn, 1)
	secondErr := make(chan error, 1)
	go func() {
		conn, err := tp.connectAs(ctx, appUser, appPassword, appDB)
		if err != nil {
			secondErr <- err
			return
		}
		var got int32
		if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&got); err != nil {
			secondErr <- err
			return
		}
		second <- conn
	}()
	select {
	case conn := <-second:
		conn.Close(ctx)
		t.Fatal("a second client got the only server connection while the first still held it")
	case err := <-secondErr:
		t.Fatal(err)
	case <-time.After(300 * time.Millisecond):
	}
	first.Close(ctx)
	var conn *pgx.Conn
	select {
	case conn = <-second:
	case err := <-secondErr:
		t.Fatal(err)
	case <-ctx.Done():
		t.Fatal("second client never got the server connection")
	}
	defer conn.Close(context.Background())
	if got := backendPID(t, ctx, conn); got != pid {
		t.Fatalf("second client on backend %d, want the reset connection %d", got, pid)
	}
	var appName string
	if err := conn.QueryRow(ctx, "SHOW application_name").Scan(&appName); err != nil {
		t.Fatal(err)
	}
	if appName == "left-behind" {
		t.Fatal("application_name leaked from the previous session: no DISCARD ALL")
	}
	if _, err := conn.Exec(ctx, "SELECT * FROM session_scratch"); sqlState(err) != "42P01" {
		t.Fatalf("temp table of the previous session: got %v, want 42P01", err)
	}
}

func backendPID(t testing.TB, ctx context.Context, conn *pgx.Conn) int32 {
	t.Helper()
	var pid int32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestClientKilledMidTransaction kills a client's TCP connection while its
// transaction is open; the next client on that server connection sees no
// open transaction and none of the uncommitted rows.
func TestClientKilledMidTransaction(t *testing.T) {
	tp := startPooler(t, poolerOptions{general: `passthrough_auth = "enabled_plain"`, pool: "pool_size = 1"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := direct(t, ctx)
	if _, err := admin.Exec(ctx, "CREATE TABLE killed_rows (v text); GRANT ALL ON killed_rows TO "+appUser); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP TABLE killed_rows") })

	victim, err := tp.connectAs(ctx, appUser, appPassword, appDB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := victim.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := victim.Exec(ctx, "INSERT INTO killed_rows VALUES ('uncommitted')"); err != nil {
		t.Fatal(err)
	}
	pid := backendPID(t, ctx, victim)
	victim.PgConn().Conn().Close() // vanish without Terminate

	next := tp.connect(t, ctx)
	// The server connection was idle in a transaction, so pgtender rolls
	// it back and reuses it rather than closing it.
	if got := backendPID(t, ctx, next); got != pid {
		t.Fatalf("next client got backend %d, want the rolled-back connection %d", got, pid)
	}
	var count int
	if err := next.QueryRow(ctx, "SELECT count(*) FROM killed_rows").Scan(&count); err != nil {
		t.Fatal(err)
	}
	if count != 0 {
		t.Fatalf("next client sees %d uncommitted rows of the killed client", count)
	}
	if status := next.PgConn().TxStatus(); status != 'I' {
		t.Fatalf("next client's transaction status %q, want I", status)
	}
	eventually(t, 5*time.Second, "no session idle in transaction", func() bool {
		var n int
		_ = admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND state LIKE 'idle in transaction%'", appUser).Scan(&n)
		return n == 0
	})
}

// TestCopyAndErrors runs COPY in both directions, then an error inside a
// transaction, ROLLBACK and a working query.
func TestCopyAndErrors(t *testing.T) {
	tp := startPooler(t, poolerOptions{general: `passthrough_auth = "enabled_plain"`, pool: "pool_size = 2"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := direct(t, ctx)
	if _, err := admin.Exec(ctx, "CREATE TABLE copy_rows (id int, v text); GRANT ALL ON copy_rows TO "+appUser); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP TABLE copy_rows") })
	conn := tp.connect(t, ctx)

	const rows = 5000
	source := make([][]any, rows)
	for i := range source {
		source[i] = []any{int32(i), fmt.Sprintf("row %d with some padding to make COPY span several messages", i)}
	}
	n, err := conn.CopyFrom(ctx, pgx.Identifier{"copy_rows"}, []string{"id", "v"}, pgx.CopyFromRows(source))
	if err != nil || n != rows {
		t.Fatalf("COPY FROM STDIN: %d rows, %v", n, err)
	}
	var out countingWriter
	tag, err := conn.PgConn().CopyTo(ctx, &out, "COPY copy_rows TO STDOUT")
	if err != nil || tag.RowsAffected() != rows || out.lines != rows {
		t.Fatalf("COPY TO STDOUT: tag %v, %d lines, %v", tag, out.lines, err)
	}

	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT 1/0"); sqlState(err) != "22012" {
		t.Fatalf("division by zero: got %v", err)
	}
	if status := conn.PgConn().TxStatus(); status != 'E' {
		t.Fatalf("status after the error %q, want E", status)
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); sqlState(err) != "25P02" {
		t.Fatalf("query in a failed transaction: got %v, want 25P02", err)
	}
	if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("query after ROLLBACK: %d, %v", one, err)
	}
	// An empty query and a notice pass through too.
	if _, err := conn.Exec(ctx, ""); err != nil {
		t.Fatalf("empty query: %v", err)
	}
	if _, err := conn.Exec(ctx, "DO $$ BEGIN RAISE NOTICE 'hello from plpgsql'; END $$"); err != nil {
		t.Fatalf("notice: %v", err)
	}
}

type countingWriter struct{ lines int }

func (w *countingWriter) Write(p []byte) (int, error) {
	for _, b := range p {
		if b == '\n' {
			w.lines++
		}
	}
	return len(p), nil
}

// TestCancel cancels pg_sleep(30) through the pooler.
func TestCancel(t *testing.T) {
	tp := startPooler(t, poolerOptions{general: `passthrough_auth = "enabled_plain"`, pool: "pool_size = 2"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sleeper := tp.connect(t, ctx)
	bystander := tp.connect(t, ctx)
	if _, err := bystander.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}

	result := make(chan error, 1)
	started := time.Now()
	go func() {
		_, err := sleeper.Exec(ctx, "SELECT pg_sleep(30)")
		result <- err
	}()
	admin := direct(t, ctx)
	eventually(t, 10*time.Second, "pg_sleep to start", func() bool {
		var n int
		_ = admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)' AND state = 'active'").Scan(&n)
		return n == 1
	})
	if err := sleeper.PgConn().CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-result:
		if sqlState(err) != "57014" {
			t.Fatalf("cancelled query: got %v, want SQLSTATE 57014", err)
		}
		t.Logf("pg_sleep(30) cancelled after %v", time.Since(started))
	case <-time.After(10 * time.Second):
		t.Fatal("cancel did not reach the backend")
	}
	// The cancel reached only the sleeper's backend.
	if status := bystander.PgConn().TxStatus(); status != 'T' {
		t.Fatalf("bystander's transaction status %q, want T", status)
	}
	if _, err := bystander.Exec(ctx, "COMMIT"); err != nil {
		t.Fatalf("bystander: %v", err)
	}
}

// TestClientGoneMidQueryReusesServer: against a real Postgres, a client
// that vanishes with a long query running inside a transaction leaves its
// server connection to the pooler, which cancels the query, rolls the
// transaction back and gives the same backend, clean, to the next client
// (with one server connection in the pool, it must).
func TestClientGoneMidQueryReusesServer(t *testing.T) {
	tp := startPooler(t, poolerOptions{general: `passthrough_auth = "enabled_plain"`, pool: "pool_size = 1"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	leaver := tp.connect(t, ctx)
	var pid int
	if err := leaver.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	go func() {
		_, _ = leaver.Exec(ctx, "BEGIN; CREATE TEMP TABLE left_behind(x int); SELECT pg_sleep(30)")
	}()
	admin := direct(t, ctx)
	eventually(t, 10*time.Second, "pg_sleep to start", func() bool {
		var n int
		_ = admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active' AND query LIKE '%pg_sleep(30)%'", pid).Scan(&n)
		return n == 1
	})
	// Vanish: close the socket under pgx, without Terminate.
	_ = leaver.PgConn().Conn().Close()

	started := time.Now()
	next := tp.connect(t, ctx)
	var nextPID, leftTables int
	if err := next.QueryRow(ctx, "SELECT pg_backend_pid(), (SELECT count(*) FROM pg_class WHERE relname = 'left_behind')").
		Scan(&nextPID, &leftTables); err != nil {
		t.Fatal(err)
	}
	inTransaction := next.PgConn().TxStatus() != 'I' // the backend's own ReadyForQuery status
	t.Logf("next client served after %v", time.Since(started))
	if nextPID != pid {
		t.Errorf("next client on backend %d, want the cleaned-up %d", nextPID, pid)
	}
	if inTransaction || leftTables != 0 {
		t.Errorf("the reused backend kept the departed client's transaction (in transaction %v, its temp table seen %d times)", inTransaction, leftTables)
	}
	var state string
	if err := admin.QueryRow(ctx, "SELECT state FROM pg_stat_activity WHERE pid = $1", pid).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if state != "idle" {
		t.Errorf("backend %d state %q after the next client's query, want idle", pid, state)
	}
}

// TestClientThatSetsAndLeavesKeepsTheServerConnection: Django opens every
// connection with SET TIME ZONE and, with CONN_MAX_AGE = 0, closes it at
// the end of the request, often before pgtender has finished probing what
// the SET left on the server connection. The connection must go back to
// the pool (one backend for every client here), and the next client must
// not see the departed one's setting.
func TestClientThatSetsAndLeavesKeepsTheServerConnection(t *testing.T) {
	tp := startPooler(t, poolerOptions{general: `passthrough_auth = "enabled_plain"`, pool: "pool_size = 1"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	first := tp.connect(t, ctx)
	pid := backendPID(t, ctx, first)
	var zone string
	if err := first.QueryRow(ctx, "SELECT current_setting('TimeZone')").Scan(&zone); err != nil {
		t.Fatal(err)
	}
	first.Close(ctx)
	setZone := "Pacific/Chatham"
	if zone == setZone {
		setZone = "Asia/Kolkata"
	}
	const clients = 30
	for i := range clients {
		conn := tp.connect(t, ctx)
		// The simple protocol, as psycopg2 sends it; Close sends
		// Terminate at once after the reply.
		if _, err := conn.PgConn().Exec(ctx, "SET TIME ZONE '"+setZone+"'").ReadAll(); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		conn.Close(ctx)
	}
	next := tp.connect(t, ctx)
	defer next.Close(ctx)
	if got := backendPID(t, ctx, next); got != pid {
		t.Errorf("after %d clients that set a time zone and left, the pool's backend is %d, want %d: connections were closed and replaced", clients, got, pid)
	}
	var got string
	if err := next.QueryRow(ctx, "SELECT current_setting('TimeZone')").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != zone {
		t.Errorf("a new client sees TimeZone %q, want the server's default %q", got, zone)
	}
	if n := appPoolStats(t, tp).ServerConnections; n != 1 {
		t.Errorf("%d server connections opened for %d clients, want 1", n, clients+2)
	}
}
