package pooler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgtender/pgtender/auth"
	"github.com/pgtender/pgtender/config"
)

// Protocol tests of the relay (the transaction-mode release point, session
// mode, client and server failures, cancel routing) and of the startup
// packet handling, each against the fake Postgres of fakepg_test.go with
// real pgconn clients, or a raw protocol client where pgconn cannot send
// what the test needs. Regression tests for bugs found in review are at
// the end.

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

// TestClientGoneMidQuery: a client that vanishes while its query runs
// leaves a server connection the pooler can still make clean: it lets the
// query finish, or cancels it after a moment, drops the replies, rolls back
// an open transaction and reuses the connection (replacing it would cost a
// connect and an authentication). In the middle of a COPY from the client
// it cannot: it closes the connection, and the next client gets a new one.
func TestClientGoneMidQuery(t *testing.T) {
	t.Run("canceled in a transaction", func(t *testing.T) {
		h := newHarness(t, nil)
		conn, fe := h.rawConnect()
		fe.Send(&pgproto3.Query{String: "BEGIN"})
		fe.Send(&pgproto3.Query{String: "SLEEP"})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var server *fakeConn
		waitFor(t, "SLEEP to start", func() bool { server = h.fake.sleeper(); return server != nil })
		conn.Close()

		waitFor(t, "the abandoned transaction to be rolled back", func() bool { return server.received("ROLLBACK") })
		if cancels := h.fake.cancelList(); len(cancels) != 1 || cancels[0].PID != server.pid || !cancels[0].Matched {
			t.Errorf("cancel requests %+v, want one matching backend %d", cancels, server.pid)
		}
		b := h.connect()
		if pid := mustWhoami(t, b); pid != server.pid {
			t.Errorf("next client served by backend %d, want the cleaned-up %d", pid, server.pid)
		}
		if server.Ended() || server.TxStatus() != 'I' {
			t.Errorf("reused connection ended %v, transaction status %c", server.Ended(), server.TxStatus())
		}
		if total := h.stat().Total; total != 1 {
			t.Errorf("pool holds %d server connections, want the one reused", total)
		}
	})
	t.Run("finishes by itself", func(t *testing.T) {
		h := newHarness(t, nil)
		conn, fe := h.rawConnect()
		fe.Send(&pgproto3.Query{String: "GATE slow"})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var server *fakeConn
		waitFor(t, "the query to start", func() bool { server = h.fake.atGate("slow"); return server != nil })
		conn.Close()
		h.fake.openGate("slow")

		b := h.connect()
		if pid := mustWhoami(t, b); pid != server.pid {
			t.Errorf("next client served by backend %d, want the drained %d", pid, server.pid)
		}
		if server.Ended() || server.received("ROLLBACK") {
			t.Errorf("an autocommit query's connection was ended (%v) or rolled back: %q", server.Ended(), server.Log())
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
	if got := h.p.CancelRequests(); got != (CancelRequests{NoServer: 1}) {
		t.Errorf("after the idle client's cancel: counters %+v, want NoServer 1", got)
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
	if got := h.p.CancelRequests(); got != (CancelRequests{Forwarded: 1, NoServer: 1}) {
		t.Errorf("counters %+v, want Forwarded 1, NoServer 1", got)
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
		closing := s.closingLocked()
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

// TestOpenServerConnSaysWhetherThePasswordWasSent: the registry gives its
// failed-verification tokens back only when the password certainly did not
// reach Postgres. A refused dial says so; a connection that Postgres's
// address accepted and then lost (the password may have gone out) does not.
func TestOpenServerConnSaysWhetherThePasswordWasSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	endpoint := serverEndpoint{host: "127.0.0.1", port: port, database: "app", user: "alice", password: "pencil",
		connectTimeout: 2 * time.Second, tlsVerify: config.TLSVerifyDisabled}
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		conn, err := ln.Accept()
		if err == nil {
			conn.Close()
		}
	}()
	_, _, err = openServerConn(context.Background(), endpoint, nil, false)
	<-accepted
	if err == nil || errors.Is(err, auth.ErrPasswordNotSent) {
		t.Fatalf("connection accepted, then closed: %v, want an error not wrapping ErrPasswordNotSent", err)
	}
	ln.Close()
	_, _, err = openServerConn(context.Background(), endpoint, nil, false)
	if !errors.Is(err, auth.ErrPasswordNotSent) {
		t.Fatalf("dial refused: %v, want it to wrap ErrPasswordNotSent", err)
	}
}
