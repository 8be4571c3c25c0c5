package integration

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// builtBinaries holds the commands of this module built for the test run,
// by package path.
var builtBinaries sync.Map // string -> func() (string, error)

// goBinary builds the command at pkg (an import path of this module) once
// per test run and returns the binary's path.
func goBinary(t testing.TB, pkg string) string {
	t.Helper()
	build, _ := builtBinaries.LoadOrStore(pkg, sync.OnceValues(func() (string, error) {
		dir, err := os.MkdirTemp("", "pgtender-bin-")
		if err != nil {
			return "", err
		}
		binary := filepath.Join(dir, filepath.Base(pkg))
		if out, err := exec.Command("go", "build", "-o", binary, pkg).CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
		return binary, nil
	}))
	binary, err := build.(func() (string, error))()
	if err != nil {
		t.Fatal(err)
	}
	return binary
}

// pgtenderBinary builds cmd/pgtender once per test run.
func pgtenderBinary(t testing.TB) string {
	t.Helper()
	return goBinary(t, "github.com/pgtender/pgtender/cmd/pgtender")
}

// TestCheckConfig runs --check-config on a broken and on a valid config.
func TestCheckConfig(t *testing.T) {
	bin := pgtenderBinary(t)
	dir := t.TempDir()
	broken := filepath.Join(dir, "pgdog.toml")
	writeFile(t, broken, `[general]
port = "6432"
no_such_key = 1
query_parser = "on"

[[databases]]
name = "app"
`)
	users := filepath.Join(dir, "users.toml")
	writeFile(t, users, `[[users]]
name = "alice"
database = "nope"
password = "x"
`)
	out, err := exec.Command(bin, "--check-config", "--config", broken, "--users", users).CombinedOutput()
	if exitCode(err) != 1 {
		t.Fatalf("exit code %d, want 1\n%s", exitCode(err), out)
	}
	for _, want := range []string{
		"pgdog.toml:2: general.port",
		"pgdog.toml:3: general.no_such_key",
		"pgdog.toml:4: general.query_parser",
		"users.toml:3: users[0].database",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--check-config output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("--check-config on a broken config:\n%s", out)

	valid := filepath.Join(dir, "valid.toml")
	writeFile(t, valid, "[[databases]]\nname = \"app\"\n")
	out, err = exec.Command(bin, "--check-config", "--config", valid, "--users", users+".absent").CombinedOutput()
	if exitCode(err) == 0 {
		t.Fatalf("a missing users file passed --check-config:\n%s", out)
	}
	emptyUsers := filepath.Join(dir, "empty-users.toml")
	writeFile(t, emptyUsers, "")
	out, err = exec.Command(bin, "--check-config", "--config", valid, "--users", emptyUsers).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "valid") {
		t.Fatalf("valid config: %v\n%s", err, out)
	}
}

// process is a pgtender binary running for one test.
type process struct {
	cmd        *exec.Cmd
	output     *syncBuffer
	addr       string
	configPath string
	exited     chan struct{} // closed when the process has exited
	exitErr    error         // valid once exited is closed
}

// processOptions describe a pgtender process for a test.
type processOptions struct {
	general        string // extra [general] lines
	pool           string // extra lines of the app database entry
	extraDatabases string // more [[databases]] entries
	users          string // users.toml
}

// startProcess runs the pgtender binary with a passthrough config whose
// [general] and [[databases]] extras are given.
func startProcess(t *testing.T, general, pool string) *process {
	t.Helper()
	return startProcessWith(t, processOptions{general: general, pool: pool})
}

func startProcessWith(t *testing.T, opts processOptions) *process {
	t.Helper()
	bin := pgtenderBinary(t)
	dir := t.TempDir()
	port := freePort(t)
	configPath := filepath.Join(dir, "pgdog.toml")
	writeFile(t, configPath, processConfig(port, opts.general, opts.pool)+"\n"+opts.extraDatabases)
	usersPath := filepath.Join(dir, "users.toml")
	writeFile(t, usersPath, opts.users)
	pr := &process{output: &syncBuffer{}, addr: fmt.Sprintf("127.0.0.1:%d", port), configPath: configPath, exited: make(chan struct{})}
	pr.cmd = exec.Command(bin, "--config", configPath, "--users", usersPath)
	pr.cmd.Stdout = pr.output
	pr.cmd.Stderr = pr.output
	if err := pr.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		pr.exitErr = pr.cmd.Wait()
		close(pr.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-pr.exited:
		default:
			pr.cmd.Process.Kill()
			<-pr.exited
		}
		if t.Failed() {
			t.Logf("pgtender output:\n%s", pr.output.String())
		}
	})
	eventually(t, 10*time.Second, "pgtender to listen", func() bool {
		return strings.Contains(pr.output.String(), "pgtender started")
	})
	return pr
}

// processConfig is a pgdog.toml for a test process. general may override
// any of the defaults here (a later key in TOML would be a duplicate, so
// defaults that general sets are left out).
func processConfig(port int, general, pool string) string {
	defaults := ""
	for _, line := range []string{`workers = 2`, `passthrough_auth = "enabled_plain"`} {
		key := strings.SplitN(line, " ", 2)[0]
		if !strings.Contains(general, key+" =") {
			defaults += line + "\n"
		}
	}
	return fmt.Sprintf(`[general]
host = "127.0.0.1"
port = %d
min_pool_size = 0
log_format = "json"
`+defaults+`%s

[[databases]]
name = %q
host = %q
port = %d
%s
`, port, general, appDB, pg.Host, pg.Port, pool)
}

func (pr *process) connect(ctx context.Context) (*pgx.Conn, error) {
	cc, err := pgx.ParseConfig(fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&connect_timeout=5", appUser, appPassword, pr.addr, appDB))
	if err != nil {
		return nil, err
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeExec
	return pgx.ConnectConfig(ctx, cc)
}

func (pr *process) waitExit(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-pr.exited:
		return exitCode(pr.exitErr)
	case <-time.After(timeout):
		t.Fatalf("pgtender did not exit within %v", timeout)
		return -1
	}
}

// TestDrainOnSIGTERM: a transaction in flight at SIGTERM commits; new
// connections are refused at once; idle clients are told 57P01; the process
// exits 0 once the transaction is done.
func TestDrainOnSIGTERM(t *testing.T) {
	pr := startProcess(t, "shutdown_timeout = 20000", "pool_size = 2")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := direct(t, ctx)
	if _, err := admin.Exec(ctx, "CREATE TABLE drain_rows (v text); GRANT ALL ON drain_rows TO "+appUser); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP TABLE drain_rows") })

	inFlight, err := pr.connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer inFlight.Close(context.Background())
	idle, err := pr.connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close(context.Background())
	if _, err := inFlight.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := inFlight.Exec(ctx, "INSERT INTO drain_rows VALUES ('in flight')"); err != nil {
		t.Fatal(err)
	}

	if err := pr.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "new connections to be refused", func() bool {
		_, err := pr.connect(ctx)
		return err != nil
	})
	if _, err := idle.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("an idle client could still run a query after SIGTERM")
	}
	if _, err := inFlight.Exec(ctx, "INSERT INTO drain_rows VALUES ('after SIGTERM')"); err != nil {
		t.Fatalf("in-flight transaction after SIGTERM: %v", err)
	}
	if _, err := inFlight.Exec(ctx, "COMMIT"); err != nil {
		t.Fatalf("COMMIT after SIGTERM: %v", err)
	}
	if code := pr.waitExit(t, 15*time.Second); code != 0 {
		t.Fatalf("exit code %d after drain, want 0", code)
	}
	var rows int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM drain_rows").Scan(&rows); err != nil || rows != 2 {
		t.Fatalf("committed rows %d, %v; want 2", rows, err)
	}
	if !strings.Contains(pr.output.String(), `"drained"`) {
		t.Errorf("no drain log line:\n%s", pr.output.String())
	}
}

// TestSecondSignalExitsAtOnce: with a transaction holding the drain open,
// a second signal ends the process without waiting for shutdown_timeout.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	pr := startProcess(t, "shutdown_timeout = 60000", "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pr.connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	pr.cmd.Process.Signal(syscall.SIGTERM)
	eventually(t, 5*time.Second, "drain to begin", func() bool {
		return strings.Contains(pr.output.String(), "draining")
	})
	pr.cmd.Process.Signal(syscall.SIGINT)
	if code := pr.waitExit(t, 10*time.Second); code != 1 {
		t.Fatalf("exit code %d after a second signal, want 1", code)
	}
}

// TestReloadKeepsConnections: SIGHUP with a new pool size keeps the server
// connections of the unchanged pool; a broken file on reload is logged and
// the running config stays.
func TestReloadKeepsConnections(t *testing.T) {
	pr := startProcess(t, "", "pool_size = 1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pr.connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	pid := backendPID(t, ctx, conn)

	port := strings.TrimPrefix(pr.addr, "127.0.0.1:")
	writeFile(t, pr.configPath, processConfig(atoi(t, port), "", "pool_size = 3"))
	pr.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, 5*time.Second, "reload", func() bool {
		return strings.Contains(pr.output.String(), "configuration reloaded")
	})
	if got := backendPID(t, ctx, conn); got != pid {
		t.Fatalf("server connection changed across a pool-size reload: %d → %d", pid, got)
	}
	// The new size is in force: three clients can hold transactions at once.
	holders := make([]*pgx.Conn, 0, 3)
	for i := 0; i < 3; i++ {
		c, err := pr.connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "BEGIN"); err != nil {
			t.Fatalf("transaction %d with pool_size 3: %v", i, err)
		}
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("transaction %d with pool_size 3: %v", i, err)
		}
		holders = append(holders, c)
	}
	for _, c := range holders {
		c.Exec(ctx, "COMMIT")
	}

	admin := direct(t, ctx)
	before := backendPIDs(t, ctx, admin)
	writeFile(t, pr.configPath, "[general]\nport = \"not a number\"\n")
	pr.cmd.Process.Signal(syscall.SIGHUP)
	eventually(t, 5*time.Second, "failed reload to be logged", func() bool {
		return strings.Contains(pr.output.String(), "reload failed")
	})
	if !strings.Contains(pr.output.String(), "general.port") {
		t.Errorf("the failed reload did not name the broken key:\n%s", pr.output.String())
	}
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("query after a failed reload: %v", err)
	}
	if after := backendPIDs(t, ctx, admin); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("server connections changed across a failed reload: %v → %v", before, after)
	}
}

// backendPIDs lists the app role's backends, sorted.
func backendPIDs(t testing.TB, ctx context.Context, admin *pgx.Conn) []int32 {
	t.Helper()
	rows, err := admin.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE usename = $1 ORDER BY pid", appUser)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

func writeFile(t testing.TB, path, contents string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(contents), 0o600); err != nil {
		t.Fatal(err)
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if exitErr, ok := err.(*exec.ExitError); ok {
		return exitErr.ExitCode()
	}
	return -1
}

func atoi(t testing.TB, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscanf(s, "%d", &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// syncBuffer is a bytes.Buffer safe for a process's output and a test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// stop sends SIGSTOP and waits until the kernel reports the process
// stopped: kill(2) returns before every thread of a busy process has
// stopped, and a test that then connects could still be accepted.
func (pr *process) stop(t *testing.T) {
	t.Helper()
	if err := pr.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	statPath := fmt.Sprintf("/proc/%d/stat", pr.cmd.Process.Pid)
	eventually(t, 10*time.Second, "pgtender to be stopped", func() bool {
		stat, err := os.ReadFile(statPath)
		if err != nil {
			return false
		}
		// The state follows the parenthesised command name.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		return len(fields) > 0 && fields[0] == "T"
	})
}

// startChild starts cmd, its output (stdout and stderr) into the buffer it
// returns, and kills it at the end of the test; the channel is closed when
// it has exited. Cleanups run last-in first-out, so one the caller
// registers after this runs before the kill.
func startChild(t testing.TB, cmd *exec.Cmd) (*syncBuffer, <-chan struct{}) {
	t.Helper()
	output := new(syncBuffer)
	cmd.Stdout, cmd.Stderr = output, output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return output, exited
}
