package integration

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgtender/pgtender/pooler"
)

// maxLinuxPID is the ceiling of kernel.pid_max on 64-bit Linux: no process
// id reaches it.
const maxLinuxPID = 4 << 20

// TestBackendKeyDataNamesNoBackend logs 100 clients in through pgtender at
// once: each gets a process id above any Linux pid, positive as an int32,
// and no two get the same one.
func TestBackendKeyDataNamesNoBackend(t *testing.T) {
	const clients = 100
	tp := startPooler(t, poolerOptions{general: `passthrough_auth = "enabled_plain"`, pool: "pool_size = 4"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conns := make([]*pgx.Conn, clients)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range conns {
		wg.Go(func() {
			conn, err := tp.connectAs(ctx, appUser, appPassword, appDB)
			if err != nil {
				errs <- err
				return
			}
			conns[i] = conn
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, conn := range conns {
			if conn != nil {
				conn.Close(context.Background())
			}
		}
	})
	close(errs)
	for err := range errs {
		t.Fatalf("login through pgtender: %v", err)
	}
	seen := make(map[uint32]bool, clients)
	for _, conn := range conns {
		pid := conn.PgConn().PID()
		if pid <= maxLinuxPID || pid > math.MaxInt32 {
			t.Errorf("PID() = %d, outside (%d, %d]", pid, maxLinuxPID, math.MaxInt32)
		}
		if seen[pid] {
			t.Errorf("PID() %d given to two live clients", pid)
		}
		seen[pid] = true
	}
	t.Logf("%d clients, %d distinct PID() values, all in (%d, %d]", clients, len(seen), maxLinuxPID, math.MaxInt32)
}

// sendCancelRequest sends a CancelRequest for (processID, secret) to addr
// and waits for the close that ends every cancel connection.
func sendCancelRequest(t testing.TB, addr string, processID uint32, secret []byte) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	packet, err := (&pgproto3.CancelRequest{ProcessID: processID, SecretKey: secret}).Encode(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(packet); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := io.Copy(io.Discard, conn); err != nil || n != 0 {
		t.Fatalf("cancel connection: read %d bytes, %v; want a close without a reply", n, err)
	}
}

// TestCancelWithWrongSecretCancelsNothing runs pg_sleep(30) through
// pgtender and sends CancelRequests with the client's process id and wrong
// secrets. Nothing is canceled: the query keeps running in Postgres until
// the client's own cancel ends it. The dropped requests are counted, and
// logged at most about once a second, with the address they came from and
// never a secret.
func TestCancelWithWrongSecretCancelsNothing(t *testing.T) {
	tp := startPooler(t, poolerOptions{general: `passthrough_auth = "enabled_plain"`, pool: "pool_size = 2"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sleeper := tp.connect(t, ctx)
	admin := direct(t, ctx)
	result := make(chan error, 1)
	go func() {
		_, err := sleeper.Exec(ctx, "SELECT pg_sleep(30)")
		result <- err
	}()
	const running = "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)' AND state = 'active'"
	eventually(t, 10*time.Second, "pg_sleep to start", func() bool {
		var n int
		_ = admin.QueryRow(ctx, running).Scan(&n)
		return n == 1
	})

	pid := sleeper.PgConn().PID()
	secret := sleeper.PgConn().SecretKey()
	wrong := binary.BigEndian.AppendUint32(nil, binary.BigEndian.Uint32(secret)^1)
	const burst = 20
	started := time.Now()
	for range burst {
		sendCancelRequest(t, tp.addr, pid, wrong)
	}
	elapsed := time.Since(started)
	if got := tp.CancelRequests(); got != (pooler.CancelRequests{UnknownKey: burst}) {
		t.Fatalf("counters %+v, want UnknownKey %d only", got, burst)
	}
	// Every request was answered (closed) before this point, and Postgres
	// acts on a cancel before it closes the cancel connection: a forwarded
	// one would have ended the query by now.
	var n int
	if err := admin.QueryRow(ctx, running).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("pg_sleep(30) no longer running after the wrong cancels (%d active)", n)
	}
	select {
	case err := <-result:
		t.Fatalf("the query ended after wrong cancels: %v", err)
	default:
	}

	lines := 0
	for _, line := range strings.Split(tp.logs.String(), "\n") {
		if !strings.Contains(line, "cancel request matched no client") {
			continue
		}
		lines++
		var fields map[string]any
		if err := json.Unmarshal([]byte(line), &fields); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if remote, _ := fields["remote"].(string); !strings.HasPrefix(remote, "127.0.0.1:") {
			t.Errorf("log line %q: remote %q, want the cancel's 127.0.0.1 address", line, remote)
		}
		if got, _ := fields["process_id"].(float64); uint32(got) != pid {
			t.Errorf("log line %q: process_id %v, want %d", line, fields["process_id"], pid)
		}
		for key := range fields {
			if strings.Contains(key, "secret") {
				t.Errorf("log line %q has a field %q", line, key)
			}
		}
		for _, s := range [][]byte{secret, wrong} {
			if v := strconv.FormatUint(uint64(binary.BigEndian.Uint32(s)), 10); strings.Contains(line, v) {
				t.Errorf("log line %q contains the secret %s", line, v)
			}
		}
	}
	if most := 1 + int(elapsed/time.Second); lines < 1 || lines > most {
		t.Errorf("%d log lines for %d unmatched cancels in %v, want 1 to %d", lines, burst, elapsed, most)
	}
	t.Logf("%d unmatched cancels in %v: %d log lines", burst, elapsed, lines)

	if err := sleeper.PgConn().CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-result:
		if sqlState(err) != "57014" {
			t.Fatalf("query after the right cancel: %v, want SQLSTATE 57014", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the right cancel did not reach the backend")
	}
	if got := tp.CancelRequests(); got != (pooler.CancelRequests{Forwarded: 1, UnknownKey: burst}) {
		t.Errorf("counters %+v, want Forwarded 1, UnknownKey %d", got, burst)
	}
}

// TestSignalOwnPIDThroughPgtender: a client that passes its own PID() to
// pg_cancel_backend or pg_terminate_backend through pgtender names no
// backend. Postgres answers false with a WARNING, and no backend is
// signalled: other clients' transactions go on, and pg_stat_activity has
// as many client backends as before.
func TestSignalOwnPIDThroughPgtender(t *testing.T) {
	tp := startPooler(t, poolerOptions{general: `passthrough_auth = "enabled_plain"`, pool: "pool_size = 4"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := direct(t, ctx)
	others := make([]*pgx.Conn, 3)
	for i := range others {
		others[i] = tp.connect(t, ctx)
		if _, err := others[i].Exec(ctx, "BEGIN; SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	cc, err := pgx.ParseConfig(tp.connString(appUser, appPassword, appDB))
	if err != nil {
		t.Fatal(err)
	}
	var noticesMu sync.Mutex
	var notices []*pgconn.Notice
	cc.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		noticesMu.Lock()
		notices = append(notices, n)
		noticesMu.Unlock()
	}
	caller, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer caller.Close(context.Background())
	pid := caller.PgConn().PID()
	// Its server connection is opened now, not between the two counts.
	if _, err := caller.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	const clientBackends = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
	var before int
	if err := admin.QueryRow(ctx, clientBackends).Scan(&before); err != nil {
		t.Fatal(err)
	}
	for _, function := range []string{"pg_cancel_backend", "pg_terminate_backend"} {
		noticesMu.Lock()
		notices = nil
		noticesMu.Unlock()
		var signalled bool
		if err := caller.QueryRow(ctx, fmt.Sprintf("SELECT %s(%d)", function, pid)).Scan(&signalled); err != nil {
			t.Fatalf("%s(%d): %v", function, pid, err)
		}
		if signalled {
			t.Errorf("%s(%d) = true, want false: the id names no backend", function, pid)
		}
		noticesMu.Lock()
		got := notices
		noticesMu.Unlock()
		want := fmt.Sprintf("PID %d is not a PostgreSQL backend process", pid)
		if len(got) != 1 || got[0].Severity != "WARNING" || got[0].Message != want {
			t.Errorf("%s(%d) notices %+v, want one WARNING %q", function, pid, got, want)
		} else {
			t.Logf("%s(%d) = false, %s: %s", function, pid, got[0].Severity, got[0].Message)
		}
	}

	for i, conn := range others {
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
			t.Errorf("client %d after the calls: %v", i, err)
		}
		if status := conn.PgConn().TxStatus(); status != 'T' {
			t.Errorf("client %d: transaction status %q, want T", i, status)
		}
		if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
			t.Errorf("client %d: COMMIT: %v", i, err)
		}
	}
	if _, err := caller.Exec(ctx, "SELECT 1"); err != nil {
		t.Errorf("the calling client afterwards: %v", err)
	}
	var after int
	if err := admin.QueryRow(ctx, clientBackends).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("pg_stat_activity: %d client backends after the calls, %d before", after, before)
	}
}
