package pooler

import (
	"net"
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
