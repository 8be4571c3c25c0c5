package pooler

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestAcceptedConnectionsInheritKeepalive: the keepalive options are set on
// the listening socket only; the kernel copies them to every accepted
// socket, so pgtender needs no setsockopt per login for them.
func TestAcceptedConnectionsInheritKeepalive(t *testing.T) {
	listeners, _, err := listenWorkers("127.0.0.1", 0, 1, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer listeners[0].Close()
	client, err := net.Dial("tcp", listeners[0].Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	conn, err := listeners[0].AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for _, option := range []struct {
		level, name, want int
		what              string
	}{
		{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1, "SO_KEEPALIVE"},
		{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, keepAliveIdleSeconds, "TCP_KEEPIDLE"},
		{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, keepAliveIntervalSeconds, "TCP_KEEPINTVL"},
		{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, keepAliveProbes, "TCP_KEEPCNT"},
		{unix.IPPROTO_TCP, unix.TCP_NODELAY, 1, "TCP_NODELAY"},
	} {
		var got int
		var getErr error
		if err := raw.Control(func(fd uintptr) { got, getErr = unix.GetsockoptInt(int(fd), option.level, option.name) }); err != nil {
			t.Fatal(err)
		}
		if getErr != nil {
			t.Fatalf("getsockopt %s: %v", option.what, getErr)
		}
		if got != option.want {
			t.Errorf("accepted socket: %s = %d, want %d", option.what, got, option.want)
		}
	}
}

// TestPortTakenByAnotherListenerIsRefused: a second pooler on the port of a
// running one is refused with EADDRINUSE, though both would set
// SO_REUSEPORT and the kernel would let them share it; so is a port some
// other program listens on. The first pooler's sockets are untouched.
func TestPortTakenByAnotherListenerIsRefused(t *testing.T) {
	first, _, err := listenWorkers("127.0.0.1", 0, 2, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, l := range first {
			l.Close()
		}
	}()
	port := first[0].Addr().(*net.TCPAddr).Port
	second, _, err := listenWorkers("127.0.0.1", port, 2, 16)
	if !errors.Is(err, syscall.EADDRINUSE) {
		for _, l := range second {
			l.Close()
		}
		t.Fatalf("second pooler on port %d: %v; want EADDRINUSE", port, err)
	}
	client, err := net.Dial("tcp", first[0].Addr().String())
	if err != nil {
		t.Fatalf("the first pooler's port after the refusal: %v", err)
	}
	client.Close()

	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, _, err := listenWorkers("127.0.0.1", other.Addr().(*net.TCPAddr).Port, 1, 16); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("port of another program: %v; want EADDRINUSE", err)
	}

	// A free port is still taken at once, and by every worker.
	free := first[0].Addr().(*net.TCPAddr).Port
	for _, l := range first {
		l.Close()
	}
	first = nil
	again, _, err := listenWorkers("127.0.0.1", free, 2, 16)
	if err != nil {
		t.Fatalf("the port once freed: %v", err)
	}
	for _, l := range again {
		l.Close()
	}
}
