package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// PgBouncer beside pgtender, for fault tests that compare the two in the
// same run: Debian's pgbouncer, run as the postgres OS user (setpriv, from
// util-linux) when the test runs as root (PgBouncer refuses root), in transaction mode with a
// cleartext password check (auth_type plain, as pgtender's passthrough
// enabled_plain), connection logging off, and its own defaults otherwise
// (server_login_retry, query_wait_timeout and the rest).

// pgbouncerBinary finds the pgbouncer binary; the test fails without it.
func pgbouncerBinary(t testing.TB) string {
	t.Helper()
	if path, err := exec.LookPath("pgbouncer"); err == nil {
		return path
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer"
	}
	t.Fatal("pgbouncer not found: apt-get install pgbouncer")
	return ""
}

// startPgBouncer runs PgBouncer in front of appDB on the Postgres at
// host:serverPort (a testpg.Server's, or a proxy in front of it) with a pool of
// poolSize until the end of the test and returns the address it listens on.
// Each of settings is a line of its [pgbouncer] section.
func startPgBouncer(t testing.TB, host string, serverPort, poolSize int, settings ...string) string {
	t.Helper()
	bin := pgbouncerBinary(t)
	// Not t.TempDir: its mode keeps the postgres user out.
	dir, err := os.MkdirTemp("", "pgtender-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	ini := fmt.Sprintf(`[databases]
%[1]s = host=%[2]s port=%[3]d dbname=%[1]s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %[4]d
unix_socket_dir =
auth_type = plain
auth_file = %[5]s
pool_mode = transaction
default_pool_size = %[6]d
max_client_conn = 1000
log_connections = 0
log_disconnections = 0
log_stats = 0
logfile = %[7]s
`, appDB, host, serverPort, port, filepath.Join(dir, "userlist.txt"), poolSize, filepath.Join(dir, "pgbouncer.log")) +
		strings.Join(settings, "\n")
	for name, content := range map[string]string{
		"pgbouncer.ini": ini,
		"userlist.txt":  fmt.Sprintf("%q %q\n", appUser, appPassword),
		"pgbouncer.log": "",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o666); err != nil {
			t.Fatal(err)
		}
		_ = os.Chmod(filepath.Join(dir, name), 0o666) // past the umask: the postgres user writes the log
	}
	args := []string{filepath.Join(dir, "pgbouncer.ini")}
	cmd := exec.Command(bin, args...)
	if os.Geteuid() == 0 {
		// setpriv execs PgBouncer itself, so signals reach it.
		cmd = exec.Command("setpriv", append([]string{"--reuid=postgres", "--regid=postgres", "--init-groups", bin}, args...)...)
	}
	var output syncBuffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt) // SIGINT: PgBouncer's immediate shutdown
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			t.Logf("pgbouncer output:\n%s\nlog:\n%s", output.String(), log)
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	eventually(t, 10*time.Second, "pgbouncer to listen", func() bool {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
	return addr
}
