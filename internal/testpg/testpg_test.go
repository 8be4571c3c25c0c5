package testpg

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/pgtender/pgtender/internal/testcert"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func skipIfShort(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real PostgreSQL")
	}
}

// A created role logs in over TCP with its SCRAM password, into its own
// database, with names and a password that need quoting.
func TestCreatedRoleLogsInWithSCRAM(t *testing.T) {
	t.Parallel()
	s := StartTB(t, Options{})
	ctx := testContext(t)
	const role, password, database = `app "user"'s`, `p'a"ss\wörd; --`, "app db"
	if err := s.CreateRole(ctx, role, password); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateDatabase(ctx, database, role); err != nil {
		t.Fatal(err)
	}

	conn, err := pgx.Connect(ctx, s.ConnString(role, password, database))
	if err != nil {
		t.Fatalf("connect as created role: %v", err)
	}
	defer conn.Close(ctx)
	var gotUser, gotDB, dbOwner string
	err = conn.QueryRow(ctx, `SELECT current_user, current_database(),
		(SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database())`).Scan(&gotUser, &gotDB, &dbOwner)
	if err != nil {
		t.Fatal(err)
	}
	if gotUser != role || gotDB != database || dbOwner != role {
		t.Errorf("user, database, owner = %q, %q, %q; want %q, %q, %q", gotUser, gotDB, dbOwner, role, database, role)
	}

	super, err := pgx.Connect(ctx, s.ConnString(s.SuperUser, s.SuperPassword, "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer super.Close(ctx)
	var verifier string
	if err := super.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&verifier); err != nil {
		t.Fatal(err)
	}
	if len(verifier) < 14 || verifier[:14] != "SCRAM-SHA-256$" {
		t.Errorf("stored password %.20q..., want a SCRAM-SHA-256 verifier", verifier)
	}
	if n, err := s.CountLogLines("connection authorized: user=" + role); err != nil || n == 0 {
		t.Errorf("log lines with the role's authorized connection = %d, %v; want > 0 (log_connections)", n, err)
	}
}

// Wrong or missing passwords are refused with 28P01, for created roles and the
// superuser alike, and every failure is in the server log.
func TestWrongPasswordIsRefused(t *testing.T) {
	t.Parallel()
	s := StartTB(t, Options{})
	ctx := testContext(t)
	if err := s.CreateRole(ctx, "app", "right"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ user, password string }{
		{"app", "wrong"},
		{"app", ""},
		{s.SuperUser, "wrong"},
	} {
		conn, err := pgconn.Connect(ctx, s.ConnString(tc.user, tc.password, "postgres"))
		if err == nil {
			conn.Close(ctx)
			t.Errorf("%s with password %q: login succeeded, want refused", tc.user, tc.password)
			continue
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
			t.Errorf("%s with password %q: %v; want SQLSTATE 28P01", tc.user, tc.password, err)
		}
	}
	// PostgreSQL writes the log line before it sends the error to the client.
	if n, err := s.CountLogLines(`password authentication failed for user "app"`); err != nil || n != 2 {
		t.Errorf("failed authentications of app in the log = %d, %v; want 2", n, err)
	}
}

// Stop stops the server, removes the directory, and is idempotent; the
// cluster belongs to the postgres OS user when the test runs as root.
func TestStopRemovesEverything(t *testing.T) {
	skipIfShort(t)
	t.Parallel()
	s, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(s.DataDir)
	if err != nil {
		_ = s.Stop()
		t.Fatal(err)
	}
	wantUID := os.Getuid()
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatal(err)
		}
		wantUID, _ = strconv.Atoi(u.Uid)
	}
	if uid := int(info.Sys().(*syscall.Stat_t).Uid); uid != wantUID {
		t.Errorf("data directory owned by uid %d, want %d", uid, wantUID)
	}

	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Errorf("after Stop, stat %s: %v; want not exist", s.Dir, err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: %v, want nil", err)
	}
	if err := s.Up(); !errors.Is(err, ErrStopped) {
		t.Errorf("Up after Stop: %v, want ErrStopped", err)
	}
	ctx := testContext(t)
	if conn, err := pgconn.Connect(ctx, s.ConnString(s.SuperUser, s.SuperPassword, "postgres")); err == nil {
		conn.Close(ctx)
		t.Error("login succeeded after Stop")
	}
}

// Restart ends sessions and comes back on the same port; Down and Up leave a
// window where logins fail.
func TestRestartAndDownUp(t *testing.T) {
	t.Parallel()
	s := StartTB(t, Options{})
	ctx := testContext(t)
	url := s.ConnString(s.SuperUser, s.SuperPassword, "postgres")
	before, err := pgconn.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close(ctx)
	port := s.Port

	if err := s.Restart(); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if s.Port != port {
		t.Errorf("port after Restart = %d, want %d", s.Port, port)
	}
	if _, err := before.Exec(ctx, "SELECT 1").ReadAll(); err == nil {
		t.Error("a session from before Restart still works")
	}
	if err := s.Exec(ctx, "SELECT 1"); err != nil {
		t.Errorf("after Restart: %v", err)
	}

	if err := s.Down(ShutdownImmediate); err != nil {
		t.Fatalf("Down: %v", err)
	}
	if err := s.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("Exec succeeded while down")
	}
	if err := s.Up(); err != nil {
		t.Fatalf("Up after an immediate Down: %v", err)
	}
	if err := s.Exec(ctx, "SELECT 1"); err != nil {
		t.Errorf("after Up: %v", err)
	}
}

// Options.Config lands in postgresql.conf after the defaults.
func TestConfigOverridesDefaults(t *testing.T) {
	t.Parallel()
	s := StartTB(t, Options{Config: map[string]string{"work_mem": "7MB", "max_connections": "50"}})
	ctx := testContext(t)
	conn, err := pgx.Connect(ctx, s.ConnString(s.SuperUser, s.SuperPassword, "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for setting, want := range map[string]string{"work_mem": "7MB", "max_connections": "50", "fsync": "off", "log_connections": "on", "password_encryption": "scram-sha-256"} {
		var got string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}
}

// A server that cannot start yields an error with the end of its log, and
// leaves nothing behind.
func TestStartFailureCarriesLogTail(t *testing.T) {
	skipIfShort(t)
	t.Parallel()
	s, err := Start(Options{Config: map[string]string{"max_connections": "lots"}})
	if err == nil {
		_ = s.Stop()
		t.Fatal("Start succeeded with max_connections = lots")
	}
	if !strings.Contains(err.Error(), `invalid value for parameter "max_connections"`) {
		t.Errorf("error lacks the server log's reason: %v", err)
	}
	m := regexp.MustCompile(`end of (\S+)/postgres\.log:`).FindStringSubmatch(err.Error())
	if m == nil {
		t.Fatalf("error does not name the log: %v", err)
	}
	if _, statErr := os.Stat(m[1]); !os.IsNotExist(statErr) {
		t.Errorf("after a failed Start, stat %s = %v; want not exist", m[1], statErr)
	}
}

func TestConfigRejectsInjection(t *testing.T) {
	for _, config := range []map[string]string{
		{"work_mem = 1MB\nfsync": "on"},
		{"work_mem": "1MB'\nfsync = 'on"},
	} {
		if s, err := Start(Options{Config: config}); err == nil {
			_ = s.Stop()
			t.Errorf("Start accepted Config %q", config)
		}
	}
}

// A cluster whose test process died is stopped and removed by the next Start.
func TestReapStaleClusters(t *testing.T) {
	t.Parallel()
	s := StartTB(t, Options{})
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir, ownerFile), []byte(strconv.Itoa(dead.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	reapStale(s.binDir, s.owner)
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Errorf("stale cluster directory: stat = %v, want not exist", err)
	}
	ctx := testContext(t)
	if conn, err := pgconn.Connect(ctx, s.ConnString(s.SuperUser, s.SuperPassword, "postgres")); err == nil {
		conn.Close(ctx)
		t.Error("stale cluster still accepts logins")
	}
}

func TestConnStringRoundTrips(t *testing.T) {
	s := &Server{Host: "127.0.0.1", Port: 5433}
	const user, password, database = "a@b:c", "p/w?#%@:x", "my db/x"
	cfg, err := pgconn.ParseConfig(s.ConnString(user, password, database))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "127.0.0.1" || cfg.Port != 5433 || cfg.User != user || cfg.Password != password || cfg.Database != database || cfg.TLSConfig != nil {
		t.Errorf("parsed %s:%d user %q password %q database %q tls %v", cfg.Host, cfg.Port, cfg.User, cfg.Password, cfg.Database, cfg.TLSConfig != nil)
	}
}

func TestBinDirHasServerBinaries(t *testing.T) {
	dir, err := BinDir()
	if err != nil {
		if testing.Short() {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	if err := hasServerBinaries(dir); err != nil {
		t.Error(err)
	}
}

// With Options.TLSCertPEM the server speaks TLS with that certificate,
// which a client trusting the test CA verifies in full, and still accepts
// plaintext logins.
func TestTLS(t *testing.T) {
	t.Parallel()
	skipIfShort(t)
	ca := testcert.NewCA(t)
	leaf := ca.Issue(t, "127.0.0.1")
	s := StartTB(t, Options{TLSCertPEM: leaf.CertPEM, TLSKeyPEM: leaf.KeyPEM})
	ctx := testContext(t)

	cc, err := pgconn.ParseConfig(strings.Replace(s.ConnString(s.SuperUser, s.SuperPassword, "postgres"), "sslmode=disable", "sslmode=verify-full", 1))
	if err != nil {
		t.Fatal(err)
	}
	cc.TLSConfig.RootCAs = ca.Pool()
	conn, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatalf("verify-full with the test CA: %v", err)
	}
	defer conn.Close(ctx)
	result := conn.ExecParams(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", nil, nil, nil, nil).Read()
	if result.Err != nil || len(result.Rows) != 1 || string(result.Rows[0][0]) != "t" {
		t.Fatalf("pg_stat_ssl: %v %q", result.Err, result.Rows)
	}
	plain, err := pgconn.Connect(ctx, s.ConnString(s.SuperUser, s.SuperPassword, "postgres"))
	if err != nil {
		t.Fatalf("sslmode=disable: %v", err)
	}
	plain.Close(ctx)
}
