package pooler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgtender/pgtender/config"
)

// TestMain fails the package when any test leaves a goroutine behind: the
// pooler's Shutdown must end everything it started, and the fake Postgres
// and clients are closed by each test's cleanup.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every poll for a condition. It is generous: a passing
// test never waits for it, and -race on a loaded machine is slow.
const waitTimeout = 10 * time.Second

// waitFor polls cond until it holds, failing the test after waitTimeout.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Names of the test pool: clients log in as testUser to testDatabase, and
// the pooler logs in to the fake as serverUser with serverPassword.
const (
	testUser       = "app"
	testDatabase   = "db"
	serverUser     = "srv"
	serverPassword = "srv-secret"
)

// testConfig is a configuration for one pool of size 1 in transaction
// mode over fake, built in code; mutate adjusts it.
func testConfig(fake *fakePG, mutate func(*config.Config)) *config.Config {
	cfg := config.Defaults()
	g := &cfg.General
	g.Host = "127.0.0.1"
	g.Port = 0
	g.Workers = 1
	g.ListenBacklog = 128
	g.DefaultPoolSize = 1
	g.MinPoolSize = 0
	g.AuthType = config.AuthTrust
	g.TLSVerify = config.TLSVerifyDisabled
	g.ConnectTimeout = 2000
	g.CheckoutTimeout = 5000
	g.ClientLoginTimeout = 5000
	g.RollbackTimeout = 2000
	g.ShutdownTimeout = 5000
	g.LogConnections = false
	g.LogDisconnections = false
	host, port := fake.hostPort()
	db := config.DefaultDatabase()
	db.Name = testDatabase
	db.DatabaseName = testDatabase
	db.Host = host
	db.Port = port
	db.User = serverUser
	db.Password = serverPassword
	user := config.DefaultUser()
	user.Name = testUser
	user.Database = testDatabase
	cfg.Databases = []config.Database{db}
	cfg.Users = []config.User{user}
	if mutate != nil {
		mutate(&cfg)
	}
	return &cfg
}

// harness is a running pooler in front of a fake Postgres.
type harness struct {
	t    testing.TB
	fake *fakePG
	p    *Pooler
	logs *observer.ObservedLogs // what the pooler logged, at Info and above
}

// newHarness starts a fake Postgres and a pooler in front of it. Cleanup
// shuts the pooler down (after the test's clients, registered later, are
// closed) and then the fake.
func newHarness(t testing.TB, mutate func(*config.Config)) *harness {
	t.Helper()
	return newHarnessWith(t, mutate, nil)
}

// newHarnessWith is newHarness with a login recorder (nil: the no-op).
func newHarnessWith(t testing.TB, mutate func(*config.Config), recorder LoginRecorder) *harness {
	t.Helper()
	observed, logs := observer.New(zapcore.InfoLevel)
	log := zaptest.NewLogger(t, zaptest.Level(zapcore.InfoLevel), zaptest.WrapOptions(zap.WrapCore(func(core zapcore.Core) zapcore.Core {
		return zapcore.NewTee(core, observed)
	})))
	h := newHarnessLogger(t, mutate, recorder, log)
	h.logs = logs
	return h
}

// newHarnessLogger is newHarnessWith logging to log; its logs field is nil.
func newHarnessLogger(t testing.TB, mutate func(*config.Config), recorder LoginRecorder, log *zap.Logger) *harness {
	t.Helper()
	return newHarnessSetup(t, mutate, recorder, log, nil)
}

// newHarnessReaderGoroutines is newHarness with every reply relayed by a
// reader goroutine of its own, none on the serve goroutine
// (readServerInline): for tests of what the serve goroutine does while a
// reader holds a reply, which a reply read inline leaves no room for.
func newHarnessReaderGoroutines(t testing.TB, mutate func(*config.Config)) *harness {
	t.Helper()
	return newHarnessSetup(t, mutate, nil, zaptest.NewLogger(t, zaptest.Level(zapcore.InfoLevel)), func(p *Pooler) { p.inlineReadBudget = -1 })
}

// newHarnessSetup is newHarnessLogger with setup, when not nil, called on
// the pooler before it serves (for the unexported knobs tests turn).
func newHarnessSetup(t testing.TB, mutate func(*config.Config), recorder LoginRecorder, log *zap.Logger, setup func(*Pooler)) *harness {
	t.Helper()
	fake := newFakePG(t, serverPassword)
	cfg := testConfig(fake, mutate)
	p, err := New(cfg, log, recorder)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if setup != nil {
		setup(p)
	}
	if err := p.Listen(); err != nil {
		t.Fatalf("Listen: %v", err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve() }()
	waitFor(t, "Serve to start", p.serveStarted.Load)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return &harness{t: t, fake: fake, p: p}
}

// connString is a libpq connection string to the pooler.
func (h *harness) connString(database string) string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=%s database=%s sslmode=disable connect_timeout=5",
		h.p.Addr().(*net.TCPAddr).Port, testUser, database)
}

// connect opens a client connection to the pooler, closed at cleanup.
func (h *harness) connect() *pgconn.PgConn {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, h.connString(testDatabase))
	if err != nil {
		h.t.Fatalf("connect to the pooler: %v", err)
	}
	h.t.Cleanup(func() { closeClient(conn) })
	return conn
}

// closeClient closes a client connection and waits for pgconn's cleanup.
func closeClient(conn *pgconn.PgConn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = conn.Close(ctx)
	select {
	case <-conn.CleanupDone():
	case <-ctx.Done():
	}
}

// pool returns the test pool, which exists once a client logged in.
func (h *harness) pool() *Pool {
	h.t.Helper()
	h.p.poolsMu.Lock()
	defer h.p.poolsMu.Unlock()
	pool := h.p.pools[poolKey{user: testUser, database: testDatabase}]
	if pool == nil {
		h.t.Fatal("the test pool does not exist")
	}
	return pool
}

func (h *harness) stat() poolSnapshot { return h.pool().snapshot() }

// waitWaiting waits until n clients are waiting in the test pool.
func (h *harness) waitWaiting(n int) {
	h.t.Helper()
	waitFor(h.t, fmt.Sprintf("%d client(s) waiting for a server connection", n),
		func() bool { return h.stat().Waiting == n })
}

// waitIdle waits until the test pool holds n idle server connections.
func (h *harness) waitIdle(n int) {
	h.t.Helper()
	waitFor(h.t, fmt.Sprintf("%d idle server connection(s) in the pool", n),
		func() bool { return h.stat().Idle == n })
}

// execSQL runs sql with the simple protocol and returns its results and the
// first error (of the exchange or of a statement).
func execSQL(conn *pgconn.PgConn, sql string) ([]*pgconn.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	results, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return results, err
	}
	for _, r := range results {
		if r.Err != nil {
			return results, r.Err
		}
	}
	return results, nil
}

// mustExec runs sql and fails the test on any error.
func mustExec(t testing.TB, conn *pgconn.PgConn, sql string) []*pgconn.Result {
	t.Helper()
	results, err := execSQL(conn, sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return results
}

// whoami returns the backend pid of the server connection that ran WHOAMI
// for conn.
func whoami(conn *pgconn.PgConn) (uint32, error) {
	results, err := execSQL(conn, "WHOAMI")
	if err != nil {
		return 0, err
	}
	if len(results) != 1 || len(results[0].Rows) != 1 {
		return 0, fmt.Errorf("WHOAMI returned %d results", len(results))
	}
	pid, err := strconv.ParseUint(string(results[0].Rows[0][0]), 10, 32)
	return uint32(pid), err
}

func mustWhoami(t testing.TB, conn *pgconn.PgConn) uint32 {
	t.Helper()
	pid, err := whoami(conn)
	if err != nil {
		t.Fatalf("WHOAMI: %v", err)
	}
	return pid
}

// pidResult is the outcome of an asynchronous WHOAMI.
type pidResult struct {
	pid uint32
	err error
}

// goClient runs f, which uses conn, on its own goroutine and delivers its
// result on the returned channel. Cleanup joins the goroutine before conn
// is closed (closing conn's socket first when f is still blocked), so that
// a test failing early never leaves pgconn used by two goroutines.
func goClient[T any](t testing.TB, conn *pgconn.PgConn, f func() T) <-chan T {
	ch := make(chan T, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ch <- f()
	}()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			conn.Conn().Close()
			<-done
		}
	})
	return ch
}

// goExec runs sql on conn in the background (see goClient) and delivers
// its error.
func goExec(t testing.TB, conn *pgconn.PgConn, sql string) <-chan error {
	return goClient(t, conn, func() error {
		_, err := execSQL(conn, sql)
		return err
	})
}

// goWhoami runs WHOAMI on conn in the background (see goClient).
func goWhoami(t testing.TB, conn *pgconn.PgConn) <-chan pidResult {
	return goClient(t, conn, func() pidResult {
		pid, err := whoami(conn)
		return pidResult{pid, err}
	})
}

// recvWithin waits for a value on ch for at most waitTimeout.
func recvWithin[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTimeout):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// notYet reports whether nothing was sent yet on ch, a channel of
// capacity 1 that gets exactly one value; it does not consume the value.
func notYet[T any](ch <-chan T) bool { return len(ch) == 0 }

// pgErrorCode returns the SQLSTATE of err, or "" when it is not a *PgError.
func pgErrorCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Raw protocol clients, for tests that send what pgconn would not.

// rawConnect logs a client in with pgconn and takes its raw connection
// over, for tests that write protocol messages pgconn would not send.
func (h *harness) rawConnect() (net.Conn, *pgproto3.Frontend) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := pgconn.Connect(ctx, h.connString(testDatabase))
	if err != nil {
		h.t.Fatalf("connect to the pooler: %v", err)
	}
	hc, err := client.Hijack()
	if err != nil {
		h.t.Fatalf("hijack: %v", err)
	}
	h.t.Cleanup(func() { hc.Conn.Close() })
	return hc.Conn, hc.Frontend
}

// readUntilReady reads backend messages up to and including ReadyForQuery
// and returns them in a compact form ("DataRow 1", "ErrorResponse 53300",
// "ReadyForQuery I").
func readUntilReady(t testing.TB, conn net.Conn, fe *pgproto3.Frontend) []string {
	t.Helper()
	var got []string
	for {
		msg := receiveMessage(t, conn, fe)
		got = append(got, describeMsg(msg))
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			return got
		}
	}
}

func receiveMessage(t testing.TB, conn net.Conn, fe *pgproto3.Frontend) pgproto3.BackendMessage {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(waitTimeout))
	defer conn.SetReadDeadline(time.Time{})
	msg, err := fe.Receive()
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	return msg
}

func describeMsg(msg pgproto3.BackendMessage) string {
	switch msg := msg.(type) {
	case *pgproto3.DataRow:
		return "DataRow " + string(msg.Values[0])
	case *pgproto3.CommandComplete:
		return "CommandComplete " + string(msg.CommandTag)
	case *pgproto3.ErrorResponse:
		return "ErrorResponse " + msg.Code
	case *pgproto3.ReadyForQuery:
		return "ReadyForQuery " + string(msg.TxStatus)
	}
	return strings.TrimPrefix(fmt.Sprintf("%T", msg), "*pgproto3.")
}

// dial opens a raw TCP connection to the pooler, closed at cleanup.
func (h *harness) dial() net.Conn {
	h.t.Helper()
	conn, err := net.DialTimeout("tcp", h.p.Addr().String(), 5*time.Second)
	if err != nil {
		h.t.Fatalf("dial the pooler: %v", err)
	}
	h.t.Cleanup(func() { conn.Close() })
	return conn
}

func encodeMsgs(t testing.TB, msgs ...interface{ Encode([]byte) ([]byte, error) }) []byte {
	t.Helper()
	var out []byte
	for _, msg := range msgs {
		var err error
		if out, err = msg.Encode(out); err != nil {
			t.Fatalf("encode %T: %v", msg, err)
		}
	}
	return out
}

func writeRaw(t testing.TB, conn net.Conn, b []byte) {
	t.Helper()
	if _, err := conn.Write(b); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// expectFatal reads one ErrorResponse and then the end of the connection.
func expectFatal(t testing.TB, conn net.Conn, code string) *pgproto3.ErrorResponse {
	t.Helper()
	fe := pgproto3.NewFrontend(conn, conn)
	msg := receiveMessage(t, conn, fe)
	er, ok := msg.(*pgproto3.ErrorResponse)
	if !ok {
		t.Fatalf("got %s, want ErrorResponse %s", describeMsg(msg), code)
	}
	if er.Severity != "FATAL" || er.Code != code {
		t.Fatalf("got %s %s %q, want FATAL %s", er.Severity, er.Code, er.Message, code)
	}
	expectEOF(t, conn)
	return er
}

func expectEOF(t testing.TB, conn net.Conn) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(waitTimeout))
	var b [1]byte
	if n, err := conn.Read(b[:]); n != 0 || err == nil {
		t.Fatalf("read %d bytes (%q), err %v; want the connection closed", n, b[:n], err)
	}
}

// sessionServing returns the client session linked to backend pid, or nil.
func (h *harness) sessionServing(pid uint32) *session {
	for _, s := range h.p.sessionList() {
		s.mu.Lock()
		sc := s.server
		s.mu.Unlock()
		if sc != nil && sc.processID == pid {
			return s
		}
	}
	return nil
}
