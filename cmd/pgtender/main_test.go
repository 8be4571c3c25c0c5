package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtender/pgtender/internal/testpg"
)

// TestMain runs pgtender itself when the test starts its own binary as the
// pooler (runAsPgtender set): the test's process is then pgtender, with no
// separate build.
func TestMain(m *testing.M) {
	if os.Getenv(runAsPgtender) == "1" {
		os.Exit(run(os.Args[1:]))
	}
	os.Exit(m.Run())
}

const runAsPgtender = "PGTENDER_TEST_RUN_MAIN"

// waitTimeout bounds every poll; a passing test never waits for it.
const waitTimeout = 20 * time.Second

// TestDrainKeepsHealthEndpointsUp runs the real binary in front of a real
// PostgreSQL, holds a transaction open, sends SIGTERM and checks main's
// order: /readyz answers 503 "draining" on both HTTP ports while the drain
// waits for the transaction, the pooler no longer accepts, /healthz and
// /metrics still answer; once the transaction ends the process exits 0 and
// only then do the HTTP ports close.
func TestDrainKeepsHealthEndpointsUp(t *testing.T) {
	pg := testpg.StartTB(t, testpg.Options{})
	dir := t.TempDir()

	port, metricsPort, healthPort := freePort(t), freePort(t), freePort(t)
	config := fmt.Sprintf(`[general]
host = "127.0.0.1"
port = %d
workers = 1
openmetrics_port = %d
openmetrics_host = "127.0.0.1"
openmetrics_namespace = "pgtender_"
healthcheck_port = %d
shutdown_timeout = 30000
auth_type = "scram"

[[databases]]
name = "app"
host = %q
port = %d
database_name = "postgres"
`, port, metricsPort, healthPort, pg.Host, pg.Port)
	users := fmt.Sprintf("[[users]]\nname = %q\ndatabase = \"app\"\npassword = %q\n", pg.SuperUser, pg.SuperPassword)
	configPath, usersPath := filepath.Join(dir, "pgdog.toml"), filepath.Join(dir, "users.toml")
	for path, data := range map[string]string{configPath: config, usersPath: users} {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	var logs strings.Builder
	cmd := exec.Command(os.Args[0], "--config", configPath, "--users", usersPath)
	cmd.Env = append(os.Environ(), runAsPgtender+"=1")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	hasExited := false // set once this goroutine has received from exited
	defer func() {
		if !hasExited {
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("pgtender's log:\n%s", logs.String())
		}
	}()

	metricsURL := fmt.Sprintf("http://127.0.0.1:%d", metricsPort)
	healthURL := fmt.Sprintf("http://127.0.0.1:%d", healthPort)
	waitFor(t, "readiness", func() bool { status, _ := get(healthURL + "/readyz"); return status == 200 })

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	dsn := fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/app?sslmode=disable", pg.SuperUser, pg.SuperPassword, port)
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect through pgtender: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "BEGIN; SELECT 1").ReadAll(); err != nil {
		t.Fatalf("BEGIN: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "/readyz to answer draining", func() bool {
		status, body := get(healthURL + "/readyz")
		return status == 503 && body == "draining\n"
	})
	for _, url := range []string{healthURL + "/readyz", metricsURL + "/readyz"} {
		if status, body := get(url); status != 503 || body != "draining\n" {
			t.Errorf("during the drain GET %s = %d %q, want 503 draining", url, status, body)
		}
	}
	for _, url := range []string{healthURL + "/healthz", metricsURL + "/healthz"} {
		if status, _ := get(url); status != 200 {
			t.Errorf("during the drain GET %s = %d, want 200", url, status)
		}
	}
	if status, body := get(metricsURL + "/metrics"); status != 200 || !strings.Contains(body, "pgtender_cl_active") {
		t.Errorf("during the drain GET /metrics = %d, without pgtender_cl_active", status)
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		c.Close()
		t.Error("the pooler still accepts connections while draining")
	}
	select {
	case err := <-exited:
		hasExited = true
		t.Fatalf("pgtender exited (%v) with a transaction still open", err)
	default:
	}

	// The transaction still works; when it ends the drain completes.
	if _, err := conn.Exec(ctx, "SELECT 2; COMMIT").ReadAll(); err != nil {
		t.Fatalf("finishing the transaction during the drain: %v", err)
	}
	select {
	case err := <-exited:
		hasExited = true
		if err != nil {
			t.Fatalf("pgtender exited with %v after the drain, want 0", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("pgtender did not exit after the last transaction ended")
	}
	for _, port := range []int{metricsPort, healthPort} {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
			c.Close()
			t.Errorf("HTTP port %d still open after pgtender exited", port)
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// get returns the status and body of url, or 0 when it cannot connect.
func get(url string) (int, string) {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
