package metrics

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// readListenQueue reads a listening socket's accept queue from TCP_INFO.
// For a socket in LISTEN state, Linux reports the queue's current length in
// tcpi_unacked (sk_ack_backlog) and its capacity in tcpi_sacked
// (sk_max_ack_backlog, the listen(2) backlog capped by net.core.somaxconn);
// see tcp_get_info in net/ipv4/tcp.c.
func readListenQueue(raw syscall.RawConn) (length, capacity uint32, err error) {
	var info *unix.TCPInfo
	var sockErr error
	if err := raw.Control(func(fd uintptr) {
		info, sockErr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil {
		return 0, 0, err
	}
	if sockErr != nil {
		return 0, 0, sockErr
	}
	return info.Unacked, info.Sacked, nil
}
