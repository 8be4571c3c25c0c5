package sdnotify

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// listen opens a datagram socket at address, as systemd does for
// $NOTIFY_SOCKET, and closes it at the end of the test.
func listen(t *testing.T, address string) *net.UnixConn {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: address, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// receive reads one datagram, or fails the test after a while.
func receive(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("no notification: %v", err)
	}
	return string(buf[:n])
}

// nothingMore checks that no datagram is waiting.
func nothingMore(t *testing.T, conn *net.UnixConn) {
	t.Helper()
	buf := make([]byte, 4096)
	if err := conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Read(buf); err == nil {
		t.Fatalf("unexpected notification %q", buf[:n])
	}
}

func TestSendToPathAndAbstractSockets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	abstract := fmt.Sprintf("@pgtender-sdnotify-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	for _, socket := range []string{path, abstract} {
		t.Run(socket[:1], func(t *testing.T) {
			conn := listen(t, socket)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := Send(ctx, socket, Ready); err != nil {
				t.Fatal(err)
			}
			if got := receive(t, conn); got != "READY=1" {
				t.Fatalf("received %q, want READY=1", got)
			}
		})
	}
}

func TestSendErrors(t *testing.T) {
	ctx := context.Background()
	for _, socket := range []string{"", "relative/path", "vsock:2:1234", filepath.Join(t.TempDir(), "nobody-listens")} {
		if err := Send(ctx, socket, Ready); err == nil {
			t.Errorf("Send to %q succeeded", socket)
		}
	}
}

func TestReloadingMessage(t *testing.T) {
	if got, want := Reloading(1500*time.Millisecond+7*time.Microsecond), "RELOADING=1\nMONOTONIC_USEC=1500007"; got != want {
		t.Fatalf("Reloading = %q, want %q", got, want)
	}
	// The clock is CLOCK_MONOTONIC: it only moves forward and is not the
	// wall clock (it starts near boot).
	a, err := Monotonic()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Monotonic()
	if a <= 0 || b < a || a > time.Duration(time.Now().UnixNano())/2 {
		t.Fatalf("Monotonic() = %v then %v", a, b)
	}
}

// TestNotifierSequence is main's sequence: ready, a reload, the drain; a
// reload during the drain sends nothing.
func TestNotifierSequence(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "notify")
	conn := listen(t, socket)
	n := New(socket, zap.NewNop())
	if !n.Enabled() {
		t.Fatal("a notifier with a socket is not enabled")
	}

	n.Ready()
	if got := receive(t, conn); got != "READY=1" {
		t.Fatalf("got %q, want READY=1", got)
	}
	before, _ := Monotonic()
	n.Reloading()
	got := receive(t, conn)
	lines := strings.Split(got, "\n")
	if len(lines) != 2 || lines[0] != "RELOADING=1" || !strings.HasPrefix(lines[1], "MONOTONIC_USEC=") {
		t.Fatalf("got %q, want RELOADING=1 and MONOTONIC_USEC", got)
	}
	usec, err := strconv.ParseInt(strings.TrimPrefix(lines[1], "MONOTONIC_USEC="), 10, 64)
	after, _ := Monotonic()
	if err != nil || usec < before.Microseconds() || usec > after.Microseconds() {
		t.Fatalf("MONOTONIC_USEC=%d (%v) not between %d and %d", usec, err, before.Microseconds(), after.Microseconds())
	}
	n.Ready()
	if got := receive(t, conn); got != "READY=1" {
		t.Fatalf("after the reload got %q, want READY=1", got)
	}
	n.Stopping()
	if got := receive(t, conn); got != "STOPPING=1" {
		t.Fatalf("got %q, want STOPPING=1", got)
	}
	n.Reloading()
	n.Ready()
	n.Stopping()
	nothingMore(t, conn)
}

func TestNotifierWithoutSocket(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	n := New("", zap.New(core))
	if n.Enabled() {
		t.Fatal("a notifier without a socket is enabled")
	}
	n.Ready()
	n.Reloading()
	n.Stopping()
	if logs.Len() != 0 {
		t.Fatalf("logged %d lines without a socket", logs.Len())
	}
}

// TestNotifierLogsOnce: a socket nobody listens on fails every send; one
// warning says so, and the caller goes on.
func TestNotifierLogsOnce(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	n := New(filepath.Join(t.TempDir(), "nobody-listens"), zap.New(core))
	n.Ready()
	n.Reloading()
	n.Ready()
	n.Stopping()
	if logs.Len() != 1 {
		t.Fatalf("logged %d lines, want 1: %v", logs.Len(), logs.All())
	}
	if entry := logs.All()[0]; entry.Level != zap.WarnLevel || !strings.Contains(entry.Message, "cannot notify systemd") {
		t.Fatalf("logged %v %q", entry.Level, entry.Message)
	}
}
