package pooler

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The raw writer and reader behave as net.Conn's Write and Read: a write
// larger than the socket buffers waits for the peer and delivers every
// byte in order, a read waits for bytes and sees the peer's close as
// io.EOF, and deadlines end both with a timeout.
func TestSocketReaderAndWriterBehaveAsNetConn(t *testing.T) {
	b, client := tcpPair(t)
	a := client.(*net.TCPConn)
	writer, reader := newSocketWriter(a), newSocketReader(b)

	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<19) // 8 MiB: the writer must wait
	written := make(chan error, 1)
	go func() {
		n, err := writer.write(payload)
		if err == nil && n != len(payload) {
			err = io.ErrShortWrite
		}
		written <- err
	}()
	got := readBytes(t, reader, len(payload))
	if err := <-written; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("the bytes read are not the bytes written")
	}

	// A read deadline ends a read that finds nothing, as a timeout.
	buf := make([]byte, 64<<10)
	_ = b.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := reader.read(buf); !isTimeout(err) {
		t.Fatalf("read past its deadline: %v, want a timeout", err)
	}
	_ = b.SetReadDeadline(time.Time{})

	// A write deadline ends a write the peer takes nothing of.
	_ = a.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := writer.write(payload); !isTimeout(err) {
		t.Fatalf("write nobody reads, past its deadline: %v, want a timeout", err)
	}

	// The peer's close is io.EOF once what it sent is read.
	if _, err := a.Write([]byte("last")); err != nil && !isTimeout(err) {
		t.Fatal(err)
	}
	a.Close()
	for {
		_, err := reader.read(buf)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read after the peer closed: %v, want io.EOF", err)
		}
	}
	if n, err := reader.read(nil); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("read into nothing: %d, %v", n, err)
	}
}

// writeBuffers delivers every piece in order, as net.Buffers.WriteTo does:
// more pieces than one writev(2) takes, empty ones, and a total larger
// than the socket buffers (so that the socket takes part of a piece and
// the writer waits); a deadline ends it with a timeout; and it keeps none
// of the pieces alive after it returns.
func TestSocketWriterWritesBuffersAsNetBuffers(t *testing.T) {
	b, client := tcpPair(t)
	a := client.(*net.TCPConn)
	writer, reader := newSocketWriter(a), newSocketReader(b)

	var pieces net.Buffers
	var want []byte
	for i := range 3 * maxIovecs {
		var piece []byte
		switch i % 3 {
		case 0: // empty
		case 1:
			piece = []byte{byte(i), byte(i >> 8)}
		case 2:
			piece = bytes.Repeat([]byte{byte(i)}, 7919) // prime: pieces end anywhere in a write
		}
		pieces = append(pieces, piece)
		want = append(want, piece...)
	}
	written := make(chan error, 1)
	go func() {
		n, err := writer.writeBuffers(pieces)
		if err == nil && n != len(want) {
			err = fmt.Errorf("wrote %d of %d bytes", n, len(want))
		}
		written <- err
	}()
	got := readBytes(t, reader, len(want))
	if err := <-written; err != nil {
		t.Fatalf("writeBuffers: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the bytes read are not the pieces written, in order")
	}
	for i, iovec := range writer.iovecs[:cap(writer.iovecs)] {
		if iovec.Base != nil {
			t.Fatalf("iovec %d still points at a piece after the write", i)
		}
	}

	_ = a.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := writer.writeBuffers(pieces); !isTimeout(err) {
		t.Fatalf("writeBuffers nobody reads, past its deadline: %v, want a timeout", err)
	}
}

// readBytes reads n bytes from reader.
func readBytes(t *testing.T, reader *socketReader, n int) []byte {
	t.Helper()
	got := make([]byte, 0, n)
	buf := make([]byte, 64<<10)
	for len(got) < n {
		m, err := reader.read(buf)
		if err != nil {
			t.Fatalf("read after %d bytes: %v", len(got), err)
		}
		got = append(got, buf[:m]...)
	}
	return got
}

// A write to a socket whose peer reset it fails with the errno net.Conn
// would give, which isNormalClose knows.
func TestSocketWriterReportsAReset(t *testing.T) {
	a, client := tcpPair(t)
	b := client.(*net.TCPConn)
	_ = b.SetLinger(0)
	b.Close() // an RST
	writer := newSocketWriter(a)
	var err error
	for range 100 {
		if _, err = writer.write([]byte("after the reset")); err != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) || !isNormalClose(err) {
		t.Fatalf("write after a reset: %v, want ECONNRESET or EPIPE", err)
	}
}

// The relay's server connections over plain TCP take the raw path.
func TestPlainServerConnectionsUseRawSockets(t *testing.T) {
	h := newHarness(t, nil)
	mustWhoami(t, h.connect())
	h.waitIdle(1)
	sc := h.pool().TryAcquireIdle()
	if sc == nil {
		t.Fatal("no idle server connection")
	}
	defer h.pool().Release(sc)
	if sc.in == nil || sc.out == nil {
		t.Fatalf("server connection over %T reads and writes through net.Conn", sc.conn)
	}
}

// Every system call the package makes itself is a raw one (rawsocket.go
// says why: one call that enters the syscall state per transaction keeps
// the runtime's sysmon thread polling at its shortest interval). The rule
// is checked on the source: a non-test file calling unix.Syscall,
// unix.Syscall6, syscall.Syscall or syscall.Syscall6 fails it.
func TestDirectSyscallsAreRaw(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		ast.Inspect(file, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok || (pkg.Name != "unix" && pkg.Name != "syscall") {
				return true
			}
			switch sel.Sel.Name {
			case "Syscall", "Syscall6":
				t.Errorf("%s: %s.%s enters the scheduler's syscall state; use %s.Raw%s for a call that never sleeps",
					fset.Position(sel.Pos()), pkg.Name, sel.Sel.Name, pkg.Name, sel.Sel.Name)
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("no source files found")
	}
}
