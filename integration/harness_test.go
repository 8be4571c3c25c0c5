// Package integration tests pgtender against a real PostgreSQL started by
// the test harness itself, with real clients (pgx, psql, pgbench).
package integration

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/internal/testpg"
	"github.com/pgtender/pgtender/pooler"
)

// The shared cluster and the roles every test may use.
var pg *testpg.Server

const (
	appUser     = "app"
	appPassword = "app-secret"
	appDB       = "appdb"
	// wrongPassword is what tests present when they expect a refusal.
	wrongPassword = "wrong-password"
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		fmt.Println("integration: every test here needs PostgreSQL; skipped with -short")
		return 0
	}
	var err error
	pg, err = testpg.Start(testpg.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration: cannot start PostgreSQL:", err)
		return 1
	}
	defer pg.Stop()
	defer stopSSLPostgres()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, step := range []func() error{
		func() error { return pg.CreateRole(ctx, appUser, appPassword) },
		func() error { return pg.CreateDatabase(ctx, appDB, appUser) },
	} {
		if err := step(); err != nil {
			fmt.Fprintln(os.Stderr, "integration: setup:", err)
			return 1
		}
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "integration: leaked goroutines:", err)
			return 1
		}
	}
	return code
}

// poolerOptions describe one pgtender instance for a test.
type poolerOptions struct {
	recorder pooler.LoginRecorder // nil: the pooler's no-op
	general  string               // extra [general] lines
	pool     string               // extra [[databases]] lines
	users    string               // users.toml contents
	server   *testpg.Server       // the Postgres behind the pooler; nil: pg
	host     string               // the database's host; "": the server's
	port     int                  // the database's port; 0: the server's
}

// testPooler is an in-process pgtender in front of the shared cluster.
type testPooler struct {
	*pooler.Pooler
	addr string
	cfg  *config.Config
	logs *syncBuffer // the pooler's log (JSON lines)
	// configPath and usersPath are the files cfg was loaded from.
	configPath, usersPath string
}

// startPooler writes pgdog.toml and users.toml for opts, loads them with
// config.Load (so the real decoding is exercised) and starts a pooler on a
// free loopback port; it is shut down at the end of the test.
func startPooler(t testing.TB, opts poolerOptions) *testPooler {
	t.Helper()
	dir := t.TempDir()
	server := opts.server
	if server == nil {
		server = pg
	}
	host := opts.host
	if host == "" {
		host = server.Host
	}
	port := opts.port
	if port == 0 {
		port = server.Port
	}
	// The harness's defaults, each left out where the test sets its key.
	var general []string
	for _, line := range []string{"workers = 2", "min_pool_size = 0", "checkout_timeout = 5000",
		"client_login_timeout = 10000", "log_connections = false", "log_disconnections = false"} {
		key, _, _ := strings.Cut(line, " ")
		if !strings.HasPrefix(opts.general, key+" ") && !strings.Contains(opts.general, "\n"+key+" ") {
			general = append(general, line)
		}
	}
	main := fmt.Sprintf(`[general]
host = "127.0.0.1"
port = %d
%s
%s

[[databases]]
name = %q
host = %q
port = %d
%s
`, freePort(t), strings.Join(general, "\n"), opts.general, appDB, host, port, opts.pool)
	configPath := filepath.Join(dir, "pgdog.toml")
	usersPath := filepath.Join(dir, "users.toml")
	if err := os.WriteFile(configPath, []byte(main), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(usersPath, []byte(opts.users), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(configPath, usersPath)
	if err != nil {
		t.Fatalf("config.Load: %v\n%s", err, main)
	}
	logs := &syncBuffer{}
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(logs), zap.DebugLevel))
	p, err := pooler.New(cfg, log, opts.recorder)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Listen(); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Where a shutdown hangs: every goroutine's stack just before it
		// gives up and closes everything.
		stuck := time.AfterFunc(9*time.Second, func() {
			stacks := make([]byte, 1<<20)
			t.Logf("Shutdown still waiting; goroutines:\n%s", stacks[:runtime.Stack(stacks, true)])
		})
		err := p.Shutdown(ctx)
		stuck.Stop()
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, pooler.ErrServerClosed) {
			t.Errorf("Serve returned %v", err)
		}
		// No log line may ever carry a password.
		for _, secret := range []string{appPassword, wrongPassword} {
			if strings.Contains(logs.String(), secret) {
				t.Errorf("a log line contains the password %q", secret)
			}
		}
		if t.Failed() {
			t.Logf("pgtender log:\n%s", logs.String())
		}
	})
	return &testPooler{Pooler: p, addr: p.Addr().String(), cfg: cfg, logs: logs, configPath: configPath, usersPath: usersPath}
}

// connString is a libpq URL for user/password/database through the pooler.
func (tp *testPooler) connString(user, password, database string) string {
	host, port, _ := net.SplitHostPort(tp.addr)
	return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&connect_timeout=10",
		user, password, net.JoinHostPort(host, port), database)
}

// connect opens a pgx connection through the pooler using unnamed
// statements only (named prepared statements across transactions need the
// pooler's statement renaming, a later feature).
func (tp *testPooler) connect(t testing.TB, ctx context.Context) *pgx.Conn {
	t.Helper()
	conn, err := tp.connectAs(ctx, appUser, appPassword, appDB)
	if err != nil {
		t.Fatalf("connect through pgtender: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func (tp *testPooler) connectAs(ctx context.Context, user, password, database string) (*pgx.Conn, error) {
	cc, err := pgx.ParseConfig(tp.connString(user, password, database))
	if err != nil {
		return nil, err
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeExec
	return pgx.ConnectConfig(ctx, cc)
}

// direct opens a superuser connection straight to Postgres.
func direct(t testing.TB, ctx context.Context) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, pg.ConnString(pg.SuperUser, pg.SuperPassword, appDB))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// sqlState returns the SQLSTATE of err, or "" if it carries none.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// errorMessage is the message of err's ErrorResponse, or "".
func errorMessage(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Severity + " " + pgErr.Message
	}
	return ""
}

// eventually polls cond every 10 ms until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serverConnections counts Postgres backends of user on the app database.
func serverConnections(t testing.TB, ctx context.Context, conn *pgx.Conn, user string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND datname = $2", user, appDB).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func itoa(i int) string { return strconv.Itoa(i) }

func joinLines(lines ...string) string { return strings.Join(lines, "\n") }

func splitAddr(t testing.TB, addr string) (host, port string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return host, port
}
