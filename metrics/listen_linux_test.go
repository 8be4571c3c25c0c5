package metrics

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgtender/pgtender/pooler"
)

func somaxconn(t *testing.T) int {
	t.Helper()
	data, err := os.ReadFile("/proc/sys/net/core/somaxconn")
	if err != nil {
		t.Fatalf("reading net.core.somaxconn: %v", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("net.core.somaxconn: %v", err)
	}
	return n
}

// TestListenQueueFromTCPInfo fills a real accept queue with connects
// nobody accepts and checks what TCP_INFO says of it: tcpi_sacked is the
// backlog and tcpi_unacked the connections waiting, up to the capacity
// (Linux queues one more before it overflows). One more connect then
// overflows the queue, which TcpExt ListenOverflows and ListenDrops count.
func TestListenQueueFromTCPInfo(t *testing.T) {
	const backlog = 4
	if max := somaxconn(t); max < backlog {
		t.Skipf("net.core.somaxconn is %d, below the backlog of %d this test needs", max, backlog)
	}
	listener, socket := listenWithBacklog(t, backlog)

	length, capacity, err := readListenQueue(socket.Conn)
	if err != nil {
		t.Fatalf("TCP_INFO of a listening socket: %v", err)
	}
	if length != 0 || capacity != backlog {
		t.Fatalf("empty queue: length %d, capacity %d; want 0, %d", length, capacity, backlog)
	}

	// Connect until the queue is full: each connect completes its handshake
	// with the kernel and waits in the queue, since nothing accepts.
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	dialer := net.Dialer{Timeout: 2 * time.Second}
	for range backlog + 1 {
		c, err := dialer.Dial("tcp", listener.Addr().String())
		if err != nil {
			t.Fatalf("connect %d of %d to a queue that is not full yet: %v", len(clients)+1, backlog+1, err)
		}
		clients = append(clients, c)
	}
	deadline := time.Now().Add(waitTimeout)
	for {
		length, capacity, err = readListenQueue(socket.Conn)
		if err != nil {
			t.Fatal(err)
		}
		if length >= capacity || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if capacity != backlog {
		t.Errorf("capacity %d, want the backlog %d", capacity, backlog)
	}
	if length < capacity || length > capacity+1 {
		t.Fatalf("after %d unaccepted connects: length %d, want %d to %d", len(clients), length, capacity, capacity+1)
	}
	t.Logf("full queue: length %d, capacity %d", length, capacity)

	// The collector reports the same figures, with the socket's labels.
	source := &fakeSource{sockets: []pooler.ListenSocket{socket}}
	collector := NewCollector("pgtender_", source, nil)
	registry := prometheus.NewRegistry()
	registry.MustRegister(collector)
	families := scrapeFamilies(t, registry)
	socketLabels := labels("worker", "0", "address", listener.Addr().String())
	if v := value(t, families, "pgtender_listen_queue_length", socketLabels); v != float64(length) {
		t.Errorf("listen_queue_length = %v, want %d", v, length)
	}
	if v := value(t, families, "pgtender_listen_queue_capacity", socketLabels); v != backlog {
		t.Errorf("listen_queue_capacity = %v, want %d", v, backlog)
	}
	overflowsBefore := value(t, families, "pgtender_listen_overflows_total", nil)
	dropsBefore := value(t, families, "pgtender_listen_drops_total", nil)

	// One more: the kernel drops its SYN (the queue is full), so the
	// connect does not complete within a short timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	extra, err := dialer.DialContext(ctx, "tcp", listener.Addr().String())
	cancel()
	if err == nil {
		// The handshake may also complete and the final ACK be dropped
		// instead: then the client believes it is connected.
		extra.Close()
		t.Log("connect to a full queue: completed (its final ACK was dropped)")
	} else {
		t.Logf("connect to a full queue: %v (its SYN was dropped)", err)
	}
	deadline = time.Now().Add(waitTimeout)
	var overflows, drops uint64
	for {
		overflows, drops, err = readListenCounters(procNetstat)
		if err != nil {
			t.Fatalf("reading %s: %v", procNetstat, err)
		}
		if float64(overflows) > overflowsBefore || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if float64(overflows) <= overflowsBefore {
		t.Errorf("ListenOverflows stayed at %v after a connect to a full queue", overflowsBefore)
	}
	if float64(drops) <= dropsBefore {
		t.Errorf("ListenDrops stayed at %v after a connect to a full queue", dropsBefore)
	}
	t.Logf("overflow: ListenOverflows %v -> %d, ListenDrops %v -> %d", overflowsBefore, overflows, dropsBefore, drops)

	// Accepting drains the queue.
	for range len(clients) {
		_ = listener.SetDeadline(time.Now().Add(waitTimeout))
		c, err := listener.Accept()
		if err != nil {
			t.Fatalf("accept from the full queue: %v", err)
		}
		c.Close()
	}
	deadline = time.Now().Add(waitTimeout)
	for {
		length, _, err = readListenQueue(socket.Conn)
		if err != nil {
			t.Fatal(err)
		}
		if length == 0 || time.Now().After(deadline) {
			break
		}
		// The dropped SYN may be retransmitted and queued meanwhile:
		// accept it too.
		_ = listener.SetDeadline(time.Now().Add(10 * time.Millisecond))
		if c, err := listener.Accept(); err == nil {
			c.Close()
		}
	}
	if length != 0 {
		t.Errorf("after accepting every connection the queue length is %d, want 0", length)
	}
}

// TestListenQueueClosedSocket checks that a closed listener (a drain under
// way) gives an error the collector recognises, not figures.
func TestListenQueueClosedSocket(t *testing.T) {
	listener, socket := listenWithBacklog(t, 8)
	listener.Close()
	if _, _, err := readListenQueue(socket.Conn); !errors.Is(err, net.ErrClosed) {
		t.Errorf("TCP_INFO of a closed listener: %v, want net.ErrClosed", err)
	}
}
