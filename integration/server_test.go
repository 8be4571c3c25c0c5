package integration

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestServerConnectionDies terminates the backend linked to a client in the
// middle of its transaction: the client gets an error, and the pool opens a
// new server connection for the next client.
func TestServerConnectionDies(t *testing.T) {
	tp := startPooler(t, poolerOptions{general: `passthrough_auth = "enabled_plain"`, pool: "pool_size = 1"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := direct(t, ctx)

	victim := tp.connect(t, ctx)
	if _, err := victim.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	pid := backendPID(t, ctx, victim)
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	if _, err := victim.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a query on a terminated server connection succeeded")
	}

	next := tp.connect(t, ctx)
	if got := backendPID(t, ctx, next); got == pid {
		t.Fatalf("the next client got the terminated backend %d", pid)
	}

	// An idle server connection that dies is noticed before it is handed
	// out: the client never sees the failure.
	idlePID := backendPID(t, ctx, next)
	terminateAndWait(t, ctx, admin, idlePID)
	if got := backendPID(t, ctx, next); got == idlePID {
		t.Fatalf("served by the terminated idle backend %d", idlePID)
	}
}

// terminateAndWait terminates the backend pid, through admin (a superuser
// connection to its Postgres), and waits until it has exited.
func terminateAndWait(t testing.TB, ctx context.Context, admin *pgx.Conn, pid int32) {
	t.Helper()
	if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the backend to exit", func() bool {
		var n int
		_ = admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n)
		return n == 0
	})
}

// TestListenBacklog checks that every worker's socket carries the configured
// backlog, as `ss -ltn` shows it (Send-Q of a LISTEN socket).
func TestListenBacklog(t *testing.T) {
	ss, err := exec.LookPath("ss")
	if err != nil {
		t.Fatalf("ss not found (.ci/run installs iproute2): %v", err)
	}
	tp := startPooler(t, poolerOptions{general: "listen_backlog = 77"})
	_, port := splitAddr(t, tp.addr)
	out, err := exec.Command(ss, "-ltnH", "sport = :"+port).CombinedOutput()
	if err != nil {
		t.Fatalf("ss: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 listening sockets (workers = 2) on port %s, ss shows:\n%s", port, out)
	}
	for _, line := range lines {
		fields := strings.Fields(line)
		if len(fields) < 3 {
			t.Fatalf("unexpected ss line %q", line)
		}
		if backlog, _ := strconv.Atoi(fields[2]); backlog != 77 {
			t.Errorf("Send-Q %q, want the listen_backlog 77: %q", fields[2], line)
		}
	}
	if tp.EffectiveBacklog() != 77 {
		t.Errorf("EffectiveBacklog = %d, want 77", tp.EffectiveBacklog())
	}
}
