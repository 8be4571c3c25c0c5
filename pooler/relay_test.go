package pooler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
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
		return s.link.clientMid
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
		return !s.writing && !s.link.clientMid && s.link.readiesOwed() == 0
	})

	if pid, err := whoami(b); err != nil || pid != server.pid {
		t.Fatalf("another client: pid %d, err %v; want backend %d released to the pool", pid, err, server.pid)
	}
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

// TestSessionEndsOnlyForward: once a session heads for its end its state
// only moves forward, whatever order the causes come in (a server lost,
// a shutdown, the client leaving), and only stateClosing hands a server
// connection over.
func TestSessionEndsOnlyForward(t *testing.T) {
	for _, order := range [][]clientState{
		{stateServerLost, stateShuttingDown, stateClosing},
		{stateClosing, stateServerLost, stateShuttingDown},
		{stateShuttingDown, stateServerLost},
	} {
		s := &session{}
		s.setState(stateLinked)
		want := stateLinked
		for _, next := range order {
			s.endLocked(next)
			want = max(want, next)
			if got := s.stateLocked(); got != want {
				t.Fatalf("%v: after %v the state is %v, want %v", order, next, got, want)
			}
			if s.closingLocked() != (want == stateClosing) {
				t.Fatalf("%v: closingLocked %v in %v", order, s.closingLocked(), want)
			}
		}
	}
}
