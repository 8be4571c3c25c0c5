package pooler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgtender/pgtender/config"
)

// Protocol tests of the relay (the transaction-mode release point, session
// mode, client and server failures, cancel routing) and of the startup
// packet handling, each against the fake Postgres of fakepg_test.go with
// real pgconn clients, or a raw protocol client where pgconn cannot send
// what the test needs. Regression tests for bugs found in review are at
// the end.

// TestTransactionReleasePointWaitsForCommit: with one server connection, a
// client inside a transaction keeps it; another client's query waits until
// COMMIT and then runs on that same backend.
func TestTransactionReleasePointWaitsForCommit(t *testing.T) {
	h := newHarness(t, nil)
	a, b := h.connect(), h.connect()

	mustExec(t, a, "BEGIN")
	if got := a.TxStatus(); got != 'T' {
		t.Fatalf("client A transaction status %q after BEGIN, want 'T'", got)
	}
	pidA := mustWhoami(t, a)

	resultB := goWhoami(t, b)
	h.waitWaiting(1)
	if !notYet(resultB) {
		t.Fatalf("client B was served while client A was inside a transaction: %+v", <-resultB)
	}
	serverA := h.fake.byPID(pidA)
	if got := serverA.Queries(); !slices.Equal(got, []string{"BEGIN", "WHOAMI"}) {
		t.Fatalf("server received %q before COMMIT, want only client A's BEGIN and WHOAMI", got)
	}

	mustExec(t, a, "COMMIT")
	got := recvWithin(t, resultB, "client B's query after COMMIT")
	if got.err != nil {
		t.Fatalf("client B: %v", got.err)
	}
	if got.pid != pidA {
		t.Errorf("client B was served by backend %d, want %d (the pool's only connection)", got.pid, pidA)
	}
	if want := []string{"BEGIN", "WHOAMI", "COMMIT", "WHOAMI"}; !slices.Equal(serverA.Queries(), want) {
		t.Errorf("server received %q, want %q", serverA.Queries(), want)
	}
	if n := h.fake.connCount(); n != 1 {
		t.Errorf("fake saw %d server connections, want 1", n)
	}
}

// TestQueriesOutsideTransactionShareOneServer: outside a transaction each
// query is its own transaction, so two clients interleave on the single
// server connection.
func TestQueriesOutsideTransactionShareOneServer(t *testing.T) {
	h := newHarness(t, nil)
	a, b := h.connect(), h.connect()
	first := mustWhoami(t, a)
	for i := range 5 {
		if pid := mustWhoami(t, b); pid != first {
			t.Fatalf("round %d: client B on backend %d, want %d", i, pid, first)
		}
		if pid := mustWhoami(t, a); pid != first {
			t.Fatalf("round %d: client A on backend %d, want %d", i, pid, first)
		}
	}

	// The same, concurrently: both clients' queries all succeed.
	var done []<-chan error
	for _, conn := range []*pgconn.PgConn{a, b} {
		done = append(done, goClient(t, conn, func() error {
			for i := range 50 {
				results, err := execSQL(conn, fmt.Sprintf("SELECT %d", i))
				if err != nil {
					return err
				}
				if got := string(results[0].Rows[0][0]); got != fmt.Sprint(i) {
					return fmt.Errorf("SELECT %d returned %q", i, got)
				}
			}
			return nil
		}))
	}
	for _, ch := range done {
		if err := recvWithin(t, ch, "concurrent clients"); err != nil {
			t.Fatal(err)
		}
	}
	if n := h.fake.connCount(); n != 1 {
		t.Errorf("fake saw %d server connections, want 1", n)
	}
	h.waitIdle(1)
}

// TestExtendedWithoutSyncKeepsServerLinked: Parse/Bind/Describe/Execute
// followed by Flush (no Sync) is answered but leaves the batch open, so the
// server stays linked until the Sync.
func TestExtendedWithoutSyncKeepsServerLinked(t *testing.T) {
	h := newHarness(t, nil)
	a, b := h.connect(), h.connect()

	pipeline := a.StartPipeline(context.Background())
	pipeline.SendQueryParams("WHOAMI", nil, nil, nil, nil)
	pipeline.SendFlushRequest()
	if err := pipeline.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	pidA := readPipelineRow(t, pipeline)

	resultB := goWhoami(t, b)
	h.waitWaiting(1)
	if !notYet(resultB) {
		t.Fatalf("client B was served while client A's batch had no Sync: %+v", <-resultB)
	}

	if err := pipeline.Sync(); err != nil {
		t.Fatalf("sync: %v", err)
	}
	expectPipelineSync(t, pipeline)
	if err := pipeline.Close(); err != nil {
		t.Fatalf("close pipeline: %v", err)
	}
	got := recvWithin(t, resultB, "client B's query after Sync")
	if got.err != nil || got.pid != pidA {
		t.Fatalf("client B: pid %d, err %v; want pid %d", got.pid, got.err, pidA)
	}
	if want := []string{"P WHOAMI", "B", "D", "E", "H", "S"}; !slices.Equal(h.fake.byPID(pidA).Log()[:6], want) {
		t.Errorf("server received %q, want it to start with %q", h.fake.byPID(pidA).Log(), want)
	}
}

// readPipelineRow reads one query result of a pipeline and returns its
// single value as a pid (WHOAMI) or 0.
func readPipelineRow(t testing.TB, pipeline *pgconn.Pipeline) uint32 {
	t.Helper()
	value := readPipelineValue(t, pipeline)
	var pid uint32
	fmt.Sscan(value, &pid)
	return pid
}

func readPipelineValue(t testing.TB, pipeline *pgconn.Pipeline) string {
	t.Helper()
	results, err := pipeline.GetResults()
	if err != nil {
		t.Fatalf("pipeline result: %v", err)
	}
	rr, ok := results.(*pgconn.ResultReader)
	if !ok {
		t.Fatalf("pipeline result is %T, want *pgconn.ResultReader", results)
	}
	result := rr.Read()
	if result.Err != nil {
		t.Fatalf("pipeline query: %v", result.Err)
	}
	if len(result.Rows) != 1 {
		t.Fatalf("pipeline query returned %d rows, want 1", len(result.Rows))
	}
	return string(result.Rows[0][0])
}

func expectPipelineSync(t testing.TB, pipeline *pgconn.Pipeline) {
	t.Helper()
	results, err := pipeline.GetResults()
	if err != nil {
		t.Fatalf("pipeline sync: %v", err)
	}
	if _, ok := results.(*pgconn.PipelineSync); !ok {
		t.Fatalf("pipeline result is %T, want *pgconn.PipelineSync", results)
	}
}

// TestPipelineReleasedAfterLastReadyForQuery: a pipeline of three synced
// queries is answered in order, and the server connection goes back only
// after the last ReadyForQuery, not after the first idle one.
func TestPipelineReleasedAfterLastReadyForQuery(t *testing.T) {
	h := newHarness(t, nil)
	a, b := h.connect(), h.connect()

	pipeline := a.StartPipeline(context.Background())
	pipeline.SendQueryParams("SELECT one", nil, nil, nil, nil)
	pipeline.SendPipelineSync()
	pipeline.SendQueryParams("SELECT two", nil, nil, nil, nil)
	pipeline.SendPipelineSync()
	pipeline.SendQueryParams("GATE three", nil, nil, nil, nil)
	pipeline.SendPipelineSync()
	if err := pipeline.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if got := readPipelineValue(t, pipeline); got != "one" {
		t.Fatalf("first result %q, want one", got)
	}
	expectPipelineSync(t, pipeline)
	if got := readPipelineValue(t, pipeline); got != "two" {
		t.Fatalf("second result %q, want two", got)
	}
	expectPipelineSync(t, pipeline)
	server := h.fake.atGate("three")
	waitFor(t, "the third query to reach the server", func() bool {
		server = h.fake.atGate("three")
		return server != nil
	})

	// Two ReadyForQuery 'I' went to client A, a third is outstanding.
	resultB := goWhoami(t, b)
	h.waitWaiting(1)
	if !notYet(resultB) {
		t.Fatalf("client B was served in the middle of client A's pipeline: %+v", <-resultB)
	}

	h.fake.openGate("three")
	if got := readPipelineValue(t, pipeline); got != "gate" {
		t.Fatalf("third result %q, want gate", got)
	}
	expectPipelineSync(t, pipeline)
	if err := pipeline.Close(); err != nil {
		t.Fatalf("close pipeline: %v", err)
	}
	got := recvWithin(t, resultB, "client B's query after the pipeline")
	if got.err != nil || got.pid != server.pid {
		t.Fatalf("client B: pid %d, err %v; want pid %d", got.pid, got.err, server.pid)
	}
}

// TestSimplePipelineAnsweredInOrder: three simple Queries written at once
// are all answered, in order, before the server goes back to the pool.
func TestSimplePipelineAnsweredInOrder(t *testing.T) {
	h := newHarness(t, nil)
	conn, fe := h.rawConnect()
	for _, sql := range []string{"SELECT 1", "SELECT 2", "SELECT 3"} {
		fe.Send(&pgproto3.Query{String: sql})
	}
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 3 {
		got = append(got, readUntilReady(t, conn, fe)...)
	}
	want := []string{
		"RowDescription", "DataRow 1", "CommandComplete SELECT 1", "ReadyForQuery I",
		"RowDescription", "DataRow 2", "CommandComplete SELECT 1", "ReadyForQuery I",
		"RowDescription", "DataRow 3", "CommandComplete SELECT 1", "ReadyForQuery I",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("client got\n%q\nwant\n%q", got, want)
	}
	h.waitIdle(1)
}

// TestErrorInTransactionKeepsServerLinked: ReadyForQuery 'E' (a failed
// transaction block) is not a release point; ROLLBACK is.
func TestErrorInTransactionKeepsServerLinked(t *testing.T) {
	h := newHarness(t, nil)
	a, b := h.connect(), h.connect()
	mustExec(t, a, "BEGIN")
	pidA := mustWhoami(t, a)
	if _, err := execSQL(a, "ERR"); pgErrorCode(err) != "42601" {
		t.Fatalf("ERR: %v, want SQLSTATE 42601", err)
	}
	if got := a.TxStatus(); got != 'E' {
		t.Fatalf("client A transaction status %q, want 'E'", got)
	}

	resultB := goWhoami(t, b)
	h.waitWaiting(1)
	if !notYet(resultB) {
		t.Fatalf("client B was served while client A's transaction had failed but not ended: %+v", <-resultB)
	}
	mustExec(t, a, "ROLLBACK")
	got := recvWithin(t, resultB, "client B's query after ROLLBACK")
	if got.err != nil || got.pid != pidA {
		t.Fatalf("client B: pid %d, err %v; want pid %d", got.pid, got.err, pidA)
	}
}

// TestClientGoneIdleInTransactionIsRolledBack: a client that leaves inside
// a transaction (with Terminate or by dropping the connection) gets its
// transaction rolled back, and the clean server connection serves the next
// client outside any transaction.
func TestClientGoneIdleInTransactionIsRolledBack(t *testing.T) {
	for _, how := range []string{"terminate", "drop"} {
		t.Run(how, func(t *testing.T) {
			h := newHarness(t, nil)
			a := h.connect()
			mustExec(t, a, "BEGIN")
			pidA := mustWhoami(t, a)
			if how == "terminate" {
				closeClient(a)
			} else {
				a.Conn().Close()
			}
			server := h.fake.byPID(pidA)
			waitFor(t, "ROLLBACK on the abandoned server connection", func() bool { return server.received("ROLLBACK") })
			h.waitIdle(1)

			b := h.connect()
			if pid := mustWhoami(t, b); pid != pidA {
				t.Errorf("next client on backend %d, want the rolled-back %d", pid, pidA)
			}
			if got := b.TxStatus(); got != 'I' {
				t.Errorf("next client's transaction status %q, want 'I'", got)
			}
			if got := server.TxStatus(); got != 'I' {
				t.Errorf("server transaction status %q, want 'I'", got)
			}
			if want := []string{"BEGIN", "WHOAMI", "ROLLBACK", "WHOAMI"}; !slices.Equal(server.Queries(), want) {
				t.Errorf("server received %q, want %q", server.Queries(), want)
			}
			if n := h.fake.connCount(); n != 1 {
				t.Errorf("fake saw %d server connections, want 1", n)
			}
		})
	}
}

// TestClientGoneMidQueryCancelsAndClosesServer: a client that vanishes
// while its query runs (or in the middle of a COPY) leaves a server
// connection that cannot be made clean: the pooler cancels the query on
// that backend and closes the connection; the next client gets a new one.
func TestClientGoneMidQueryCancelsAndClosesServer(t *testing.T) {
	t.Run("query", func(t *testing.T) {
		h := newHarness(t, nil)
		conn, fe := h.rawConnect()
		fe.Send(&pgproto3.Query{String: "SLEEP"})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var server *fakeConn
		waitFor(t, "SLEEP to start", func() bool { server = h.fake.sleeper(); return server != nil })
		conn.Close()

		waitFor(t, "the abandoned server connection to be closed", server.Ended)
		if cancels := h.fake.cancelList(); len(cancels) != 1 || cancels[0].PID != server.pid || !cancels[0].Matched {
			t.Errorf("cancel requests %+v, want one matching backend %d", cancels, server.pid)
		}
		waitFor(t, "the pool to forget the closed connection", func() bool { return h.stat().Total == 0 })
		b := h.connect()
		if pid := mustWhoami(t, b); pid == server.pid {
			t.Errorf("next client served by the abandoned backend %d", pid)
		}
	})
	t.Run("copy", func(t *testing.T) {
		h := newHarness(t, nil)
		conn, fe := h.rawConnect()
		fe.Send(&pgproto3.Query{String: "COPY IN"})
		fe.Send(&pgproto3.CopyData{Data: []byte("1\n2\n")})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var server *fakeConn
		waitFor(t, "COPY data to reach the server", func() bool {
			server = h.fake.find(func(c *fakeConn) bool { return slices.Contains(c.log, "d") })
			return server != nil
		})
		conn.Close()
		waitFor(t, "the server connection abandoned mid-COPY to be closed", server.Ended)
		if server.received("ROLLBACK") || slices.Contains(server.Log(), "c") {
			t.Errorf("server received %q; a COPY must not be completed for a vanished client", server.Log())
		}
		b := h.connect()
		if pid := mustWhoami(t, b); pid == server.pid {
			t.Errorf("next client served by the abandoned backend %d", pid)
		}
	})
}

// TestClientGoneMidExtendedQueryCancels: a client that vanishes while an
// Execute it sent without Sync (pgx pipelines, JDBC-style Flush) is still
// running leaves pending at 0 but the batch open: its backend is still
// working for nobody, and Postgres will not notice the closed socket until
// the query tries to send. The pooler must cancel it, as it does for a
// simple query, not only close the connection.
func TestClientGoneMidExtendedQueryCancels(t *testing.T) {
	h := newHarness(t, nil)
	conn, _ := h.rawConnect()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Parse{Query: "SLEEP"}, &pgproto3.Bind{},
		&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Flush{}))
	var server *fakeConn
	waitFor(t, "SLEEP to start", func() bool { server = h.fake.sleeper(); return server != nil })
	conn.Close()
	// returnServer sends any cancel before it discards the connection.
	waitFor(t, "the pool to drop the abandoned connection", func() bool { return h.stat().Total == 0 })
	if cancels := h.fake.cancelList(); len(cancels) != 1 || cancels[0].PID != server.pid || !cancels[0].Matched {
		t.Errorf("cancel requests %+v, want one for backend %d: its Execute was still running", cancels, server.pid)
	}
}

// TestSessionModeKeepsServerForClientLife: in session mode each client
// keeps one server connection for its whole life; on disconnect the
// connection is reset with DISCARD ALL and reused.
func TestSessionModeKeepsServerForClientLife(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) {
		cfg.General.PoolerMode = config.PoolerModeSession
		cfg.General.DefaultPoolSize = 2
	})
	a, b := h.connect(), h.connect()
	pidA, pidB := mustWhoami(t, a), mustWhoami(t, b)
	if pidA == pidB {
		t.Fatalf("two session-mode clients share backend %d", pidA)
	}
	for i := range 3 {
		if pid := mustWhoami(t, a); pid != pidA {
			t.Fatalf("round %d: client A moved from backend %d to %d", i, pidA, pid)
		}
		if pid := mustWhoami(t, b); pid != pidB {
			t.Fatalf("round %d: client B moved from backend %d to %d", i, pidB, pid)
		}
	}
	if st := h.stat(); st.Idle != 0 || st.Total != 2 {
		t.Errorf("pool %+v while both clients are connected, want 2 connections, none idle", st)
	}

	closeClient(a)
	server := h.fake.byPID(pidA)
	h.waitIdle(1)
	queries := server.Queries()
	if len(queries) == 0 || queries[len(queries)-1] != "DISCARD ALL" {
		t.Errorf("server of the departed client received %q, want DISCARD ALL last", queries)
	}
	c := h.connect()
	if pid := mustWhoami(t, c); pid != pidA {
		t.Errorf("next client on backend %d, want the reset backend %d", pid, pidA)
	}
	if pid := mustWhoami(t, b); pid != pidB {
		t.Errorf("client B moved to backend %d", pid)
	}
	if n := h.fake.connCount(); n != 2 {
		t.Errorf("fake saw %d server connections, want 2", n)
	}
}

// TestCheckoutTimeout: a query that cannot get a server connection within
// checkout_timeout fails with 53300 naming the pool, and the client can go
// on once a connection is free.
func TestCheckoutTimeout(t *testing.T) {
	const checkoutTimeout = 200 * time.Millisecond
	h := newHarness(t, func(cfg *config.Config) {
		cfg.General.CheckoutTimeout = config.Milliseconds(checkoutTimeout / time.Millisecond)
	})
	a, b := h.connect(), h.connect()
	mustExec(t, a, "BEGIN")
	pidA := mustWhoami(t, a)

	start := time.Now()
	_, err := execSQL(b, "SELECT 1")
	elapsed := time.Since(start)
	if code := pgErrorCode(err); code != sqlstateTooManyConnections {
		t.Fatalf("query without a free server: %v, want SQLSTATE 53300", err)
	}
	if pool := testUser + "@" + testDatabase; !strings.Contains(err.Error(), pool) {
		t.Errorf("error %q does not name the pool %s", err, pool)
	}
	if elapsed < checkoutTimeout || elapsed > 5*time.Second {
		t.Errorf("checkout failed after %v, want about %v", elapsed, checkoutTimeout)
	}
	if got := b.TxStatus(); got != 'I' {
		t.Errorf("client B transaction status %q after the failed checkout, want 'I'", got)
	}

	// Extended protocol: the error, then ReadyForQuery at the Sync.
	rr := b.ExecParams(context.Background(), "SELECT 2", nil, nil, nil, nil).Read()
	if code := pgErrorCode(rr.Err); code != sqlstateTooManyConnections {
		t.Fatalf("extended query without a free server: %v, want SQLSTATE 53300", rr.Err)
	}

	mustExec(t, a, "COMMIT")
	if pid := mustWhoami(t, b); pid != pidA {
		t.Errorf("client B on backend %d after the commit, want %d", pid, pidA)
	}
	rr = b.ExecParams(context.Background(), "SELECT 3", nil, nil, nil, nil).Read()
	if rr.Err != nil || len(rr.Rows) != 1 || string(rr.Rows[0][0]) != "3" {
		t.Errorf("extended query after the commit: rows %q, err %v", rr.Rows, rr.Err)
	}
}

// TestServerDiesWhileLinked: when the linked server connection dies, its
// client gets FATAL 08006 and the pool opens a new connection for the
// next client.
func TestServerDiesWhileLinked(t *testing.T) {
	t.Run("during a query", func(t *testing.T) {
		h := newHarness(t, nil)
		a := h.connect()
		mustExec(t, a, "BEGIN")
		pidA := mustWhoami(t, a)
		_, err := execSQL(a, "DIE")
		if code := pgErrorCode(err); code != sqlstateConnectionFailure {
			t.Fatalf("query on a dying server: %v, want SQLSTATE 08006", err)
		}
		waitFor(t, "the pool to drop the dead connection", func() bool { return h.stat().Total == 0 })
		b := h.connect()
		if pid := mustWhoami(t, b); pid == pidA {
			t.Errorf("next client served by the dead backend %d", pid)
		}
		if n := h.fake.connCount(); n != 2 {
			t.Errorf("fake saw %d server connections, want 2", n)
		}
	})
	t.Run("idle in transaction", func(t *testing.T) {
		h := newHarness(t, nil)
		a := h.connect()
		mustExec(t, a, "BEGIN")
		pidA := mustWhoami(t, a)
		h.fake.kill(pidA)
		waitFor(t, "the pool to drop the dead connection", func() bool { return h.stat().Total == 0 })
		_, err := execSQL(a, "SELECT 1")
		if err == nil {
			t.Fatal("query after the server died succeeded")
		}
		if code := pgErrorCode(err); code != "" && code != sqlstateConnectionFailure {
			t.Errorf("query after the server died: %v, want SQLSTATE 08006 or a closed connection", err)
		}
		b := h.connect()
		if pid := mustWhoami(t, b); pid == pidA {
			t.Errorf("next client served by the dead backend %d", pid)
		}
	})
}

// TestCancelRoutedToLinkedBackend: a client's CancelRequest (sent with the
// pooler's BackendKeyData) reaches the backend serving that client and no
// other; a cancel from a client without a linked server does nothing.
func TestCancelRoutedToLinkedBackend(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) { cfg.General.DefaultPoolSize = 2 })
	a, b, idle := h.connect(), h.connect(), h.connect()
	mustExec(t, b, "BEGIN")
	pidB := mustWhoami(t, b)

	sleepErr := goExec(t, a, "SLEEP")
	var server *fakeConn
	waitFor(t, "SLEEP to start", func() bool { server = h.fake.sleeper(); return server != nil })
	if server.pid == pidB {
		t.Fatalf("client A's SLEEP runs on client B's backend %d", pidB)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := idle.CancelRequest(ctx); err != nil {
		t.Fatalf("cancel from an idle client: %v", err)
	}
	if cancels := h.fake.cancelList(); len(cancels) != 0 {
		t.Fatalf("a cancel from a client without a server reached the fake: %+v", cancels)
	}
	if err := a.CancelRequest(ctx); err != nil {
		t.Fatalf("CancelRequest: %v", err)
	}
	err := recvWithin(t, sleepErr, "the canceled query")
	if code := pgErrorCode(err); code != "57014" {
		t.Fatalf("canceled query: %v, want SQLSTATE 57014", err)
	}
	if cancels := h.fake.cancelList(); len(cancels) != 1 || cancels[0].PID != server.pid || !cancels[0].Matched {
		t.Errorf("cancel requests %+v, want one for backend %d with its secret", cancels, server.pid)
	}
	if pid := mustWhoami(t, a); pid == 0 {
		t.Error("client A unusable after the cancel")
	}
	mustExec(t, b, "COMMIT")
}

// TestCancelDoesNotReachTheNextClientsQuery: a cancel forwarded for client
// A must never interrupt another client's query. The pooler reads A's
// server under the session lock, then sends the cancel; if A's query ends
// meanwhile and the server goes back to the pool, the next client's query
// is the one canceled. Here the cancel is held up on its way (as a slow
// network or a busy postmaster would hold it) while A's query ends. Like
// PgBouncer, the pooler must keep a server with a cancel in flight out of
// the pool until the cancel is delivered.
func TestCancelDoesNotReachTheNextClientsQuery(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.holdCancelRequests()
	a, b := h.connect(), h.connect()
	gateErr := goExec(t, a, "GATE a")
	waitFor(t, "client A's query to run", func() bool { return h.fake.atGate("a") != nil })
	sleepErr := goExec(t, b, "SLEEP")
	h.waitWaiting(1)

	canceled := goClient(t, a, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		return a.CancelRequest(ctx)
	})
	waitFor(t, "client A's cancel to reach the server", func() bool { return h.fake.cancelArrivalCount() == 1 })
	h.fake.openGate("a")
	if err := recvWithin(t, gateErr, "client A's query"); err != nil {
		t.Fatalf("client A: %v", err)
	}
	// Give client B's query the chance to start on the server A left; a
	// pooler that holds the server back until the cancel is delivered never
	// starts it, and the bounded wait just ends.
	deadline := time.Now().Add(500 * time.Millisecond)
	for h.fake.sleeper() == nil && time.Now().Before(deadline) {
		time.Sleep(2 * time.Millisecond)
	}
	h.fake.openGate("cancels")
	if err := recvWithin(t, canceled, "client A's CancelRequest"); err != nil {
		t.Fatalf("CancelRequest: %v", err)
	}
	waitFor(t, "the cancel to take effect", func() bool { return len(h.fake.cancelList()) == 1 })
	if c := h.fake.cancelList()[0]; c.Interrupted {
		err := recvWithin(t, sleepErr, "client B's interrupted query")
		t.Fatalf("client A's cancel interrupted client B's query on backend %d: client B got %v", c.PID, err)
	}

	// End client B's query with its own cancel.
	waitFor(t, "client B's query to run", func() bool { return h.fake.sleeper() != nil })
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := b.CancelRequest(ctx); err != nil {
		t.Fatalf("client B's CancelRequest: %v", err)
	}
	if err := recvWithin(t, sleepErr, "client B's query"); pgErrorCode(err) != "57014" {
		t.Errorf("client B's query: %v, want SQLSTATE 57014 from its own cancel", err)
	}
}

// TestCopyInHoldsServerUntilDone: a COPY FROM STDIN keeps the server linked
// until CopyDone is answered.
func TestCopyInHoldsServerUntilDone(t *testing.T) {
	h := newHarness(t, nil)
	a, b := h.connect(), h.connect()
	pr, pw := io.Pipe()
	type copyResult struct {
		tag pgconn.CommandTag
		err error
	}
	copied := goClient(t, a, func() copyResult {
		tag, err := a.CopyFrom(context.Background(), pr, "COPY IN")
		return copyResult{tag, err}
	})
	t.Cleanup(func() { pw.CloseWithError(errors.New("test ended")) })
	if _, err := pw.Write([]byte("1\n2\n")); err != nil {
		t.Fatal(err)
	}
	var server *fakeConn
	waitFor(t, "COPY data to reach the server", func() bool {
		server = h.fake.find(func(c *fakeConn) bool { return slices.Contains(c.log, "d") })
		return server != nil
	})
	resultB := goWhoami(t, b)
	h.waitWaiting(1)
	if !notYet(resultB) {
		t.Fatalf("client B was served in the middle of client A's COPY: %+v", <-resultB)
	}
	if _, err := pw.Write([]byte("3\n")); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	result := recvWithin(t, copied, "COPY to finish")
	if result.err != nil {
		t.Fatalf("CopyFrom: %v", result.err)
	}
	if result.tag.String() != "COPY 3" {
		t.Errorf("COPY returned %q, want COPY 3", result.tag)
	}
	got := recvWithin(t, resultB, "client B's query after the COPY")
	if got.err != nil || got.pid != server.pid {
		t.Fatalf("client B: pid %d, err %v; want pid %d", got.pid, got.err, server.pid)
	}
}

// expectLogin reads a successful login's reply up to ReadyForQuery and
// checks its shape.
func expectLogin(t testing.TB, conn net.Conn, fe *pgproto3.Frontend) {
	t.Helper()
	got := readUntilReady(t, conn, fe)
	if got[0] != "AuthenticationOk" || got[len(got)-1] != "ReadyForQuery I" || !slices.Contains(got, "BackendKeyData") ||
		!slices.Contains(got, "ParameterStatus") {
		t.Fatalf("login reply %q, want AuthenticationOk, ParameterStatus…, BackendKeyData, ReadyForQuery I", got)
	}
}

// expectWorks runs WHOAMI on a raw logged-in connection.
func expectWorks(t testing.TB, conn net.Conn, fe *pgproto3.Frontend) {
	t.Helper()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Query{String: "SELECT ok"}))
	if got, want := readUntilReady(t, conn, fe), []string{"RowDescription", "DataRow ok", "CommandComplete SELECT 1", "ReadyForQuery I"}; !slices.Equal(got, want) {
		t.Fatalf("query after login: %q, want %q", got, want)
	}
}

func testStartup(version uint32, extra map[string]string) *pgproto3.StartupMessage {
	params := map[string]string{"user": testUser, "database": testDatabase}
	for k, v := range extra {
		params[k] = v
	}
	return &pgproto3.StartupMessage{ProtocolVersion: version, Parameters: params}
}

func TestStartupEncryptionRequestsAnsweredN(t *testing.T) {
	for name, request := range map[string][]byte{
		"SSLRequest":    encodeMsgs(t, &pgproto3.SSLRequest{}),
		"GSSENCRequest": encodeMsgs(t, &pgproto3.GSSEncRequest{}),
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, nil)
			conn := h.dial()
			writeRaw(t, conn, request)
			var answer [1]byte
			_ = conn.SetReadDeadline(time.Now().Add(waitTimeout))
			if _, err := io.ReadFull(conn, answer[:]); err != nil || answer[0] != 'N' {
				t.Fatalf("answer %q, err %v; want 'N'", answer[:], err)
			}
			writeRaw(t, conn, encodeMsgs(t, testStartup(pgproto3.ProtocolVersion30, nil)))
			fe := pgproto3.NewFrontend(conn, conn)
			expectLogin(t, conn, fe)
			expectWorks(t, conn, fe)
		})
	}
	t.Run("pgconn sslmode=prefer", func(t *testing.T) {
		h := newHarness(t, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgconn.Connect(ctx, strings.Replace(h.connString(testDatabase), "sslmode=disable", "sslmode=prefer", 1))
		if err != nil {
			t.Fatalf("connect with sslmode=prefer: %v", err)
		}
		defer closeClient(conn)
		mustWhoami(t, conn)
	})
}

// TestStartupProtocol32Negotiated: a 3.2 StartupMessage (with a protocol
// option) gets NegotiateProtocolVersion naming 3.0 and the option, then a
// normal 3.0 login.
func TestStartupProtocol32Negotiated(t *testing.T) {
	h := newHarness(t, nil)
	conn := h.dial()
	writeRaw(t, conn, encodeMsgs(t, testStartup(pgproto3.ProtocolVersion32, map[string]string{"_pq_.test_option": "1"})))
	fe := pgproto3.NewFrontend(conn, conn)
	msg := receiveMessage(t, conn, fe)
	npv, ok := msg.(*pgproto3.NegotiateProtocolVersion)
	if !ok {
		t.Fatalf("first reply %s, want NegotiateProtocolVersion", describeMsg(msg))
	}
	if npv.NewestMinorProtocol != 0 || !slices.Equal(npv.UnrecognizedOptions, []string{"_pq_.test_option"}) {
		t.Errorf("NegotiateProtocolVersion %+v, want minor 0 and [_pq_.test_option]", npv)
	}
	expectLogin(t, conn, fe)
	expectWorks(t, conn, fe)

	// A real client asking for 3.2 settles on 3.0.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := pgconn.Connect(ctx, h.connString(testDatabase)+" max_protocol_version=3.2")
	if err != nil {
		t.Fatalf("pgconn with max_protocol_version=3.2: %v", err)
	}
	defer closeClient(client)
	mustWhoami(t, client)
}

// TestStartupMalformedPacket: startup packets with a body over 10,000 bytes
// or under 4, or with a broken parameter list, get FATAL 08P01 and a close;
// an unknown protocol major version gets FATAL 0A000.
func TestStartupMalformedPacket(t *testing.T) {
	cases := map[string][]byte{
		"oversized":     {0, 0, 0x27, 0x15}, // 10005 = a 10,001-byte body; only the length word is sent
		"too short":     {0, 0, 0, 4},
		"unterminated":  append([]byte{0, 0, 0, 16, 0, 3, 0, 0}, "user\x00app"...),
		"no value":      append([]byte{0, 0, 0, 14, 0, 3, 0, 0}, "user\x00\x00"...),
		"unknown major": append([]byte{0, 0, 0, 9, 0, 9, 0, 0}, 0),
	}
	codes := map[string]string{"unknown major": sqlstateFeatureNotSupported}
	for name, packet := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, nil)
			conn := h.dial()
			writeRaw(t, conn, packet)
			code := codes[name]
			if code == "" {
				code = sqlstateProtocolViolation
			}
			er := expectFatal(t, conn, code)
			if strings.Contains(er.Message, "timeout") {
				t.Errorf("the pooler waited for more bytes (%q) instead of refusing the packet", er.Message)
			}
		})
	}
}

func TestStartupUnknownDatabase(t *testing.T) {
	h := newHarness(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, h.connString("nope"))
	if err == nil {
		closeClient(conn)
		t.Fatal("login to an unknown database succeeded")
	}
	if code := pgErrorCode(err); code != sqlstateInvalidCatalogName {
		t.Fatalf("login to an unknown database: %v, want SQLSTATE 3D000", err)
	}
	if n := h.fake.connCount(); n != 0 {
		t.Errorf("fake saw %d server connections for an unknown database", n)
	}
}

// TestStartupStalledLoginTimesOut: client_login_timeout ends a login that
// stalls, with FATAL 08P01 once the client sent something and silently
// when it never did (a bare TCP connect is not a login).
func TestStartupStalledLoginTimesOut(t *testing.T) {
	const loginTimeout = 300 * time.Millisecond
	h := newHarness(t, func(cfg *config.Config) {
		cfg.General.ClientLoginTimeout = config.Milliseconds(loginTimeout / time.Millisecond)
	})
	t.Run("partial startup packet", func(t *testing.T) {
		conn := h.dial()
		start := time.Now()
		writeRaw(t, conn, []byte{0, 0, 0, 40, 0, 3})
		er := expectFatal(t, conn, sqlstateProtocolViolation)
		if !strings.Contains(er.Message, "client_login_timeout") {
			t.Errorf("message %q does not name client_login_timeout", er.Message)
		}
		if elapsed := time.Since(start); elapsed < loginTimeout-50*time.Millisecond || elapsed > 5*time.Second {
			t.Errorf("login ended after %v, want about %v", elapsed, loginTimeout)
		}
	})
	t.Run("silent", func(t *testing.T) {
		conn := h.dial()
		expectEOF(t, conn)
	})
}

// Regression tests for relay bugs found in review. Each comment says what
// went wrong in the version that failed it.

// TestReleaseWhenClientFinishesMessageAfterReadyForQuery: the release point
// is reached when the last ReadyForQuery 'I' arrives while the client is
// still in the middle of a message the server never answers (here a
// CopyData outside COPY, which Postgres ignores). A relay that decides the
// release only when a ReadyForQuery arrives never re-checks once the
// client finishes the message, and the idle client keeps the server.
func TestReleaseWhenClientFinishesMessageAfterReadyForQuery(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) { cfg.General.CheckoutTimeout = 1000 })
	conn, fe := h.rawConnect()
	b := h.connect()

	copyData := encodeMsgs(t, &pgproto3.CopyData{Data: make([]byte, 4096)})
	writeRaw(t, conn, append(encodeMsgs(t, &pgproto3.Query{String: "GATE g"}), copyData[:2000]...))
	var server *fakeConn
	waitFor(t, "the query to reach the server", func() bool { server = h.fake.atGate("g"); return server != nil })
	s := h.sessionServing(server.pid)
	waitFor(t, "the first part of the CopyData to be forwarded", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.clientMid
	})
	h.fake.openGate("g")
	if got, want := readUntilReady(t, conn, fe), []string{"RowDescription", "DataRow gate", "CommandComplete SELECT 1", "ReadyForQuery I"}; !slices.Equal(got, want) {
		t.Fatalf("client got %q, want %q", got, want)
	}
	writeRaw(t, conn, copyData[2000:])
	waitFor(t, "the CopyData to reach the server", func() bool { return slices.Contains(server.Log(), "d") })

	// The client is idle, outside a transaction, with nothing outstanding.
	if pid, err := whoami(b); err != nil || pid != server.pid {
		t.Fatalf("another client: pid %d, err %v; want backend %d released to the pool", pid, err, server.pid)
	}
}

// TestReleaseWhenReadyForQueryArrivesDuringClientWrite: the same missed
// release when the last ReadyForQuery 'I' arrives while serve is still
// writing client bytes that need no answer (writing is true): a readServer
// that skips the release instead of waiting for the write, with nothing
// checking again afterwards, leaves the idle client holding the server.
// Here the write is made to block by a server that stops reading (HOLD);
// in production the window is the few instructions between the Write
// returning and serve re-taking s.mu, and it made
// TestQueriesOutsideTransactionShareOneServer fail about one run in two.
func TestReleaseWhenReadyForQueryArrivesDuringClientWrite(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) { cfg.General.CheckoutTimeout = 1000 })
	conn, fe := h.rawConnect()
	b := h.connect()

	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Query{String: "HOLD reply resume"}))
	var server *fakeConn
	waitFor(t, "HOLD to reach the server", func() bool { server = h.fake.atGate("reply"); return server != nil })

	// Messages Postgres ignores, until every buffer between the client and
	// the (not reading) server is full and the pooler's write blocks.
	junk := encodeMsgs(t, &pgproto3.CopyData{Data: make([]byte, 64<<10-5)})
	var rest []byte
	for sent := 0; rest == nil; sent++ {
		if sent > 4096 {
			t.Fatal("256 MiB written and the pooler's write to the server never blocked")
		}
		_ = conn.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := conn.Write(junk)
		if err != nil {
			if !isTimeout(err) {
				t.Fatalf("write: %v", err)
			}
			rest = junk[n:]
		}
	}
	_ = conn.SetWriteDeadline(time.Time{})
	wrote := make(chan error, 1)
	go func() {
		_, err := conn.Write(rest)
		wrote <- err
	}()

	h.fake.openGate("reply")
	if got, want := readUntilReady(t, conn, fe), []string{"CommandComplete HOLD", "ReadyForQuery I"}; !slices.Equal(got, want) {
		t.Fatalf("client got %q, want %q", got, want)
	}
	h.fake.openGate("resume")
	if err := recvWithin(t, wrote, "the rest of the client's bytes to be written"); err != nil {
		t.Fatal(err)
	}
	s := h.sessionServing(server.pid)
	waitFor(t, "the pooler to forward every client byte", func() bool {
		if s == nil {
			return true
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		return !s.writing && !s.clientMid && s.pending == 0
	})

	if pid, err := whoami(b); err != nil || pid != server.pid {
		t.Fatalf("another client: pid %d, err %v; want backend %d released to the pool", pid, err, server.pid)
	}
}

// TestCheckoutFailureAnswersEveryBatch: when a checkout fails for a chunk
// holding two synced extended-protocol batches, each batch must get its
// error before its ReadyForQuery, as Postgres would answer. With one error
// per chunk (errorSent not reset at Sync) the second batch got a bare
// ReadyForQuery and looked like it succeeded.
func TestCheckoutFailureAnswersEveryBatch(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) { cfg.General.CheckoutTimeout = 200 })
	a := h.connect()
	mustExec(t, a, "BEGIN")
	conn, fe := h.rawConnect()

	batch := func(sql string) []byte {
		return encodeMsgs(t, &pgproto3.Parse{Query: sql}, &pgproto3.Bind{}, &pgproto3.Describe{ObjectType: 'P'},
			&pgproto3.Execute{}, &pgproto3.Sync{})
	}
	writeRaw(t, conn, append(batch("SELECT 1"), batch("SELECT 2")...))
	got := append(readUntilReady(t, conn, fe), readUntilReady(t, conn, fe)...)
	want := []string{"ErrorResponse 53300", "ReadyForQuery I", "ErrorResponse 53300", "ReadyForQuery I"}
	if !slices.Equal(got, want) {
		t.Fatalf("client got %q, want %q", got, want)
	}
	mustExec(t, a, "COMMIT")
}

// TestMessagesAfterDiscardedBatchAreServed: after a failed checkout the
// session drops extended-protocol messages up to the Sync. Whatever the
// same chunk holds after that Sync is a new request and must be served,
// not answered locally (a Query got a bare ReadyForQuery and never ran).
func TestMessagesAfterDiscardedBatchAreServed(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) { cfg.General.CheckoutTimeout = 200 })
	a := h.connect()
	mustExec(t, a, "BEGIN")
	pidA := mustWhoami(t, a)
	conn, fe := h.rawConnect()

	// A batch without its Sync yet: the checkout fails.
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Parse{Query: "SELECT 1"}, &pgproto3.Bind{},
		&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Flush{}))
	if msg := receiveMessage(t, conn, fe); describeMsg(msg) != "ErrorResponse 53300" {
		t.Fatalf("got %s, want ErrorResponse 53300", describeMsg(msg))
	}
	mustExec(t, a, "COMMIT")

	// The batch's Sync and a new query, in one write.
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Sync{}, &pgproto3.Query{String: "WHOAMI"}))
	got := append(readUntilReady(t, conn, fe), readUntilReady(t, conn, fe)...)
	want := []string{"ReadyForQuery I", "RowDescription", fmt.Sprintf("DataRow %d", pidA), "CommandComplete SELECT 1", "ReadyForQuery I"}
	if !slices.Equal(got, want) {
		t.Fatalf("client got %q, want %q", got, want)
	}
}

// TestExtendedCopyInReleasesServer: libpq's PQexecParams("COPY … FROM
// STDIN") sends Parse/Bind/Describe/Execute/Sync, then the data, CopyDone
// and another Sync. Postgres ignores a Sync received in COPY IN mode, so
// there is one ReadyForQuery for two Syncs. A relay that counts both waits
// forever for the second ReadyForQuery: the idle client keeps the server.
func TestExtendedCopyInReleasesServer(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) { cfg.General.CheckoutTimeout = 1000 })
	conn, fe := h.rawConnect()
	b := h.connect()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Parse{Query: "COPY IN"}, &pgproto3.Bind{},
		&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{}))
	var got []string
	for len(got) == 0 || got[len(got)-1] != "CopyInResponse" {
		got = append(got, describeMsg(receiveMessage(t, conn, fe)))
	}
	if want := []string{"ParseComplete", "BindComplete", "NoData", "CopyInResponse"}; !slices.Equal(got, want) {
		t.Fatalf("client got %q, want %q", got, want)
	}
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyDone{}, &pgproto3.Sync{}))
	if got, want := readUntilReady(t, conn, fe), []string{"CommandComplete COPY 1", "ReadyForQuery I"}; !slices.Equal(got, want) {
		t.Fatalf("client got %q, want %q", got, want)
	}
	server := h.fake.connList()[0]
	if pid, err := whoami(b); err != nil || pid != server.pid {
		t.Fatalf("another client: pid %d, err %v; want backend %d released to the pool", pid, err, server.pid)
	}
}

// TestExtendedCopyFailReleasesServer: the same extended-protocol COPY
// abandoned with CopyFail (libpq's PQputCopyEnd with an error message, which
// sends CopyFail and Sync): Postgres answers ErrorResponse and one
// ReadyForQuery for the two Syncs, the first having been ignored in COPY IN
// mode before anything failed. The client is then idle and its server must
// go back to the pool.
func TestExtendedCopyFailReleasesServer(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) { cfg.General.CheckoutTimeout = 1000 })
	conn, fe := h.rawConnect()
	b := h.connect()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Parse{Query: "COPY IN"}, &pgproto3.Bind{},
		&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, &pgproto3.Sync{}))
	var got []string
	for len(got) == 0 || got[len(got)-1] != "CopyInResponse" {
		got = append(got, describeMsg(receiveMessage(t, conn, fe)))
	}
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.CopyData{Data: []byte("1\n")}, &pgproto3.CopyFail{Message: "client gave up"}, &pgproto3.Sync{}))
	if got, want := readUntilReady(t, conn, fe), []string{"ErrorResponse 57014", "ReadyForQuery I"}; !slices.Equal(got, want) {
		t.Fatalf("client got %q, want %q", got, want)
	}
	server := h.fake.connList()[0]
	if pid, err := whoami(b); err != nil || pid != server.pid {
		t.Fatalf("another client: pid %d, err %v; want backend %d released to the pool", pid, err, server.pid)
	}
}

// TestServerLostMidTransactionDoesNotRelink: when the server connection of
// a client inside a transaction dies, the client's following statements
// must not run anywhere (its transaction is gone). readServer clears
// s.server and discards the connection before it tells the client and
// closes the client connection; a serve that links a fresh server in
// between runs the next statement there, in autocommit. The test widens
// that window by holding the session's write lock, which readServer needs
// to send the client its FATAL error.
func TestServerLostMidTransactionDoesNotRelink(t *testing.T) {
	h := newHarness(t, nil)
	conn, fe := h.rawConnect()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Query{String: "BEGIN"}, &pgproto3.Query{String: "WHOAMI"}))
	readUntilReady(t, conn, fe)
	got := readUntilReady(t, conn, fe)
	var pidA uint32
	fmt.Sscanf(got[1], "DataRow %d", &pidA)
	s := h.sessionServing(pidA)
	if s == nil {
		t.Fatalf("no session linked to backend %d (got %q)", pidA, got)
	}

	const next = "SELECT after the server died"
	ranElsewhere := func() *fakeConn {
		return h.fake.find(func(c *fakeConn) bool { return c.pid != pidA && slices.Contains(c.log, "Q "+next) })
	}
	s.wmu.Lock()
	locked := true
	defer func() {
		if locked {
			s.wmu.Unlock()
		}
	}()
	h.fake.kill(pidA)
	waitFor(t, "the relay to notice the dead server", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.server == nil
	})
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Query{String: next}))
	waitFor(t, "the session to refuse the statement or run it on another server", func() bool {
		s.mu.Lock()
		closing := s.closing
		s.mu.Unlock()
		return closing || ranElsewhere() != nil
	})
	s.wmu.Unlock()
	locked = false

	// The client learns its server is gone and is disconnected.
	var messages []string
	_ = conn.SetReadDeadline(time.Now().Add(waitTimeout))
	for {
		msg, err := fe.Receive()
		if err != nil {
			break
		}
		messages = append(messages, describeMsg(msg))
	}
	if !slices.Contains(messages, "ErrorResponse "+sqlstateConnectionFailure) {
		t.Errorf("client got %q, want ErrorResponse 08006", messages)
	}
	waitFor(t, "the session to end", func() bool { return h.p.sessionCount() == 0 })
	if c := ranElsewhere(); c != nil {
		t.Errorf("the statement sent after the server died ran on backend %d, outside the client's transaction; server log %q", c.pid, c.Log())
	}
}

// TestShutdownFailsWaitingClientsClearly: a client waiting for a server
// connection when Shutdown begins is told the pooler is shutting down
// (57P01/57P03), not that checkout_timeout expired, and the transaction in
// flight on the only server connection still finishes.
func TestShutdownFailsWaitingClientsClearly(t *testing.T) {
	h := newHarness(t, nil)
	a, b := h.connect(), h.connect()
	mustExec(t, a, "BEGIN")
	resultB := goWhoami(t, b)
	h.waitWaiting(1)

	shutdown := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		shutdown <- h.p.Shutdown(ctx)
	}()
	got := recvWithin(t, resultB, "the waiting client's answer")
	if code := pgErrorCode(got.err); code != sqlstateAdminShutdown && code != sqlstateCannotConnectNow {
		t.Errorf("waiting client during shutdown: %v, want SQLSTATE 57P01 or 57P03", got.err)
	}
	// The transaction in flight finishes, then the pooler is done.
	mustExec(t, a, "COMMIT")
	if err := recvWithin(t, shutdown, "Shutdown"); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}
