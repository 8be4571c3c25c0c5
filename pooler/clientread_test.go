package pooler

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// tcpPair is a connected loopback pair: the pooler's end and the client's.
func tcpPair(t *testing.T) (server *net.TCPConn, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	accepted, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { accepted.Close() })
	return accepted.(*net.TCPConn), client
}

// readStalls reads with a short deadline, so that the read finds nothing
// and waits, and returns what the wait left: whether the session still
// holds its pooled buffer.
func readStalls(t *testing.T, s *session, long []byte, at int) (holdsBuffer bool) {
	t.Helper()
	_ = s.tcp.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	defer s.tcp.SetReadDeadline(time.Time{})
	if _, n, err := s.in.read(long, at); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with nothing sent: %d bytes, %v; want the deadline", n, err)
	}
	return s.bufRef != nil
}

// A plain-TCP session gives its read buffer back while it waits for a
// client that sends nothing, takes one again when bytes arrive, and keeps
// it while a partial message is held in it or a long message uses its own.
func TestClientReaderReleasesBufferWhileWaiting(t *testing.T) {
	server, client := tcpPair(t)
	s := &session{tcp: server, conn: server}
	s.bufRef = clientBufferPool.Get().(*[]byte)
	s.in.init(s)

	if readStalls(t, s, nil, 0) {
		t.Fatal("the session kept its read buffer while waiting with nothing held")
	}
	if _, err := client.Write([]byte("Q\x00\x00")); err != nil {
		t.Fatal(err)
	}
	buf, n, err := s.in.read(nil, 0)
	if err != nil || !bytes.Equal(buf[:n], []byte("Q\x00\x00")) {
		t.Fatalf("read %q, %v; want the bytes sent", buf[:n], err)
	}
	if s.bufRef == nil || &buf[0] != &(*s.bufRef)[0] {
		t.Fatal("the bytes were not read into the session's pooled buffer")
	}

	// Three bytes of a header held at the front: the buffer is kept.
	if !readStalls(t, s, nil, n) {
		t.Fatal("the session gave back a read buffer holding a partial message")
	}
	if _, err := client.Write([]byte("\x00\x05x")); err != nil {
		t.Fatal(err)
	}
	buf, k, err := s.in.read(nil, n)
	if err != nil || !bytes.Equal(buf[:n+k], []byte("Q\x00\x00\x00\x05x")) {
		t.Fatalf("read %q, %v; want the held bytes and the new ones", buf[:n+k], err)
	}

	// A long message reads into its own buffer; the pooled one is not
	// touched.
	long := make([]byte, 3*clientReadBufferLen)
	if !readStalls(t, s, long, 0) {
		t.Fatal("the pooled buffer was given back during a read into a long message's buffer")
	}
	if _, err := client.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	if buf, k, err := s.in.read(long, 0); err != nil || &buf[0] != &long[0] || string(buf[:k]) != "abc" {
		t.Fatalf("read %q, %v; want it in the long message's buffer", buf[:k], err)
	}

	// The client hangs up: EOF, as net.Conn.Read reports it.
	client.Close()
	if _, n, err := s.in.read(nil, 0); n != 0 || err != io.EOF {
		t.Fatalf("read after the client closed: %d bytes, %v; want io.EOF", n, err)
	}
}

// Reading the socket without a buffer in hand allocates nothing in steady
// state: the callback is made once per session.
func TestClientReaderReadDoesNotAllocate(t *testing.T) {
	server, client := tcpPair(t)
	s := &session{tcp: server, conn: server}
	s.bufRef = clientBufferPool.Get().(*[]byte)
	s.in.init(s)
	msg := []byte("X\x00\x00\x00\x04")
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := client.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, n, err := s.in.read(nil, 0); err != nil || n != len(msg) {
			t.Fatalf("read %d bytes, %v", n, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per read, want 0", allocs)
	}
}
