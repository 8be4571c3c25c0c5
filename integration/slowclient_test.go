package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgtender/pgtender/pooler"
)

// TestClientThatStopsReadingIsDisconnected: a client sends a query with a
// large result and reads none of it. Within client_write_timeout of the
// socket buffers filling, pgtender disconnects it, counts and logs it, and
// cleans its server connection (the query canceled, the connection back in
// the pool), which the pool's next client gets.
func TestClientThatStopsReadingIsDisconnected(t *testing.T) {
	tp := startPooler(t, poolerOptions{
		general: "passthrough_auth = \"enabled_plain\"\nclient_write_timeout = 300",
		pool:    "pool_size = 1",
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	stalled := tp.connect(t, ctx)
	backend := backendPID(t, ctx, stalled)
	socket := stalled.PgConn().Conn()
	// About 200 MB if it were all sent: far more than the socket buffers
	// on both sides hold.
	writeQuery(t, socket, "SELECT repeat('x', 1000) FROM generate_series(1, 200000) AS stalled_read")

	eventually(t, 30*time.Second, "the client that stopped reading to be disconnected", func() bool {
		return tp.ClientTimeouts() == pooler.ClientTimeouts{Write: 1}
	})
	// What the socket held arrives, then the end of the connection.
	_ = socket.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.Copy(io.Discard, socket); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reading the disconnected client's socket: %v; want the end of the connection", err)
	}
	if !strings.Contains(tp.logs.String(), "client took none of pgtender's output within client_write_timeout") {
		t.Error("no log line for the disconnected client")
	}

	// The pool's one server connection was cleaned and handed on: the next
	// client runs on the same backend, and the query is no longer running.
	if nextBackend := backendPID(t, ctx, tp.connect(t, ctx)); nextBackend != backend {
		t.Errorf("the next client ran on backend %d, want %d (the cleaned connection)", nextBackend, backend)
	}
	admin := direct(t, ctx)
	var running int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%AS stalled_read'").Scan(&running); err != nil {
		t.Fatal(err)
	}
	if running != 0 {
		t.Errorf("%d backends still run the stalled client's query", running)
	}
}

// TestShutdownIsNotHeldByAClientThatStopsReading: a session-mode client
// that LISTENs and then reads nothing, while notifications fill its
// socket, is between transactions, so a shutdown tells it so and closes
// it; with client_write_timeout off, pgtender's write to it blocks, and
// that write must not hold the drain (or Shutdown) past a second or so.
func TestShutdownIsNotHeldByAClientThatStopsReading(t *testing.T) {
	tp := startPooler(t, poolerOptions{
		general: "passthrough_auth = \"enabled_plain\"\nclient_write_timeout = 0",
		pool:    "pool_size = 2\npooler_mode = \"session\"",
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	listener := tp.connect(t, ctx)
	if _, err := listener.Exec(ctx, "LISTEN stalled_reader"); err != nil {
		t.Fatal(err)
	}
	// Distinct payloads (Postgres folds identical ones in a transaction),
	// about 24 MB in all, delivered at commit.
	notifier := direct(t, ctx)
	if _, err := notifier.Exec(ctx, "SELECT pg_notify('stalled_reader', g::text || repeat('x', 7900)) FROM generate_series(1, 3000) AS g"); err != nil {
		t.Fatal(err)
	}
	waitForStalledWrites(t, tp)

	shutdown := make(chan error, 1)
	go func() {
		shutdownCtx, cancelShutdown := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancelShutdown()
		shutdown <- tp.Shutdown(shutdownCtx)
	}()
	select {
	case err := <-shutdown:
		// nil: the session ended by itself, not cut by the context.
		if err != nil {
			t.Fatalf("Shutdown: %v; want the stalled client's session ended without waiting for its reads", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("Shutdown hung on a client that does not read")
	}
	if n := tp.ClientCount(); n != 0 {
		t.Errorf("%d clients after Shutdown", n)
	}
	_ = listener.PgConn().Conn().Close()
}

// writeQuery sends a simple Query on a client's raw socket, and reads no
// reply.
func writeQuery(t testing.TB, socket net.Conn, sql string) {
	t.Helper()
	msg := []byte{'Q', 0, 0, 0, 0}
	msg = append(msg, sql...)
	msg = append(msg, 0)
	binary.BigEndian.PutUint32(msg[1:], uint32(len(msg)-1))
	if _, err := socket.Write(msg); err != nil {
		t.Fatal(err)
	}
}

// waitForStalledWrites waits until pgtender's bytes sent to clients stop
// growing: the stalled client's socket buffers are full and pgtender's
// write to it is blocked.
func waitForStalledWrites(t testing.TB, tp *testPooler) {
	t.Helper()
	sent := func() uint64 {
		var total uint64
		for _, stats := range tp.PoolStats() {
			total += stats.BytesSent
		}
		return total
	}
	last := sent()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		now := sent()
		if now == last && now > 0 {
			return
		}
		last = now
	}
	t.Fatalf("pgtender's writes to clients never stalled (%d bytes sent)", last)
}
