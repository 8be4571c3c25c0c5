package pooler

import (
	"io"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Raw socket reads and writes.
//
// A plain-TCP socket is non-blocking, so read(2) and write(2) on it never
// sleep: they take what is there or fits and return EAGAIN otherwise. The
// standard library's calls still enter the scheduler's syscall state
// (syscall.Syscall), which lets the runtime's sysmon thread take the P away
// from a goroutine whose call runs past a tick while other goroutines wait,
// and hand it to another thread; on loopback a write also does the
// receiving socket's TCP work, so calls often run that long, and the hand
// off (a thread woken, the caller's thread parked when it returns) costs
// more than the call. The relay's hot reads and writes make the same
// calls through syscall.RawConn with unix.RawSyscall instead: the poller
// still waits for readiness on EAGAIN, and deadlines work as for net.Conn.
//
// Entering the syscall state also wakes sysmon when it sleeps because
// every P was idle, and a woken sysmon polls again at its shortest
// interval (Go's runtime/proc.go, sysmon) until fifty polls in a row find
// nothing to take back. A pooler serving one client at a time goes idle
// at every round trip, so a single such call per transaction (the
// checkout's liveness peek was one, and net.Buffers' writev of a renamed
// Bind another) keeps sysmon polling for good. So every system call this
// package makes by number is a raw one (TestDirectSyscallsAreRaw), and an
// execution trace of the relay's round trips shows none that enters the
// syscall state (TestRelayEntersNoSyscallState). What still does: TLS
// connections' reads and writes (crypto/tls over net.Conn), the net
// package's accept and close, the login's reads (loginReader reads
// net.Conn), unix's wrappers in listener setup and the parker's epoll
// calls (park.go).

// rawRead is one read(2) of a non-blocking socket. Reading into nothing
// reads nothing, as read(2) of zero bytes does.
func rawRead(fd uintptr, b []byte) (int, unix.Errno) {
	if len(b) == 0 {
		return 0, 0
	}
	n, _, errno := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	return int(n), errno
}

// rawWrite is one write(2) to a non-blocking socket; b is not empty.
func rawWrite(fd uintptr, b []byte) (int, unix.Errno) {
	n, _, errno := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	return int(n), errno
}

// rawWritev is one writev(2) of iovecs, which is not empty, to a
// non-blocking socket.
func rawWritev(fd uintptr, iovecs []unix.Iovec) (int, unix.Errno) {
	n, _, errno := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iovecs[0])), uintptr(len(iovecs)))
	return int(n), errno
}

// maxIovecs is the most pieces one writev(2) takes on Linux (UIO_MAXIOV).
const maxIovecs = 1024

// socketWriter writes to one socket. Not safe for concurrent use: the
// session calls it under wmu, the relay from the goroutine that writes
// the server connection.
type socketWriter struct {
	raw     syscall.RawConn
	attempt func(fd uintptr) bool // writeOnce, bound once
	pending []byte
	written int
	err     error

	// writeBuffers' state: the pieces, the first not all written and how
	// much of it was, and the iovec array, reused and cleared after each
	// call so that it keeps none of the pieces alive.
	attemptv      func(fd uintptr) bool // writevOnce, bound once
	pieces        [][]byte
	piece, offset int
	iovecs        []unix.Iovec
}

// newSocketWriter returns a writer for conn, or nil when conn gives no
// file descriptor.
func newSocketWriter(conn syscall.Conn) *socketWriter {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil
	}
	w := &socketWriter{raw: raw}
	w.attempt, w.attemptv = w.writeOnce, w.writevOnce
	return w
}

// write writes all of b, waiting for the socket to take it as
// net.Conn.Write does, and returns how much it wrote.
func (w *socketWriter) write(b []byte) (int, error) {
	w.pending, w.written, w.err = b, 0, nil
	err := w.raw.Write(w.attempt)
	n := w.written
	w.pending = nil
	if err != nil {
		return n, err // the poller's: a closed socket, a deadline
	}
	return n, w.err
}

// writeOnce writes what the socket takes now; false, on EAGAIN, asks the
// poller to wait until it is writable and call it again.
func (w *socketWriter) writeOnce(fd uintptr) bool {
	for w.written < len(w.pending) {
		n, errno := rawWrite(fd, w.pending[w.written:])
		switch errno {
		case 0:
			w.written += n
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			w.err = os.NewSyscallError("write", errno)
			return true
		}
	}
	return true
}

// writeBuffers writes all of pieces, in order, as net.Buffers.WriteTo
// does (a writev(2) for as many as the socket takes), and returns how
// much it wrote. Raw, like write: net.Buffers' writev enters the syscall
// state.
func (w *socketWriter) writeBuffers(pieces [][]byte) (int, error) {
	w.pieces, w.piece, w.offset, w.written, w.err = pieces, 0, 0, 0, nil
	err := w.raw.Write(w.attemptv)
	n := w.written
	w.pieces = nil
	clear(w.iovecs[:cap(w.iovecs)])
	if err != nil {
		return n, err
	}
	return n, w.err
}

// writevOnce writes what the socket takes now of the pieces left; false,
// on EAGAIN, asks the poller to wait until it is writable and call it
// again.
func (w *socketWriter) writevOnce(fd uintptr) bool {
	for {
		iovecs := w.iovecs[:0]
		for i := w.piece; i < len(w.pieces) && len(iovecs) < maxIovecs; i++ {
			b := w.pieces[i]
			if i == w.piece {
				b = b[w.offset:]
			}
			if len(b) > 0 {
				iovecs = append(iovecs, unix.Iovec{Base: &b[0]})
				iovecs[len(iovecs)-1].SetLen(len(b))
			}
		}
		w.iovecs = iovecs
		if len(iovecs) == 0 {
			return true
		}
		n, errno := rawWritev(fd, iovecs)
		switch errno {
		case 0:
			w.written += n
			w.advance(n)
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			w.err = os.NewSyscallError("writev", errno)
			return true
		}
	}
}

// advance moves writeBuffers' position n bytes on.
func (w *socketWriter) advance(n int) {
	for n > 0 && w.piece < len(w.pieces) {
		left := len(w.pieces[w.piece]) - w.offset
		if n < left {
			w.offset += n
			return
		}
		n -= left
		w.piece, w.offset = w.piece+1, 0
	}
}

// socketReader reads one socket. Not safe for concurrent use: a server
// connection's is used by the goroutine that owns its read side.
type socketReader struct {
	raw     syscall.RawConn
	attempt func(fd uintptr) bool // readOnce, bound once
	into    []byte
	n       int
	err     error
}

// newSocketReader returns a reader for conn, or nil when conn gives no
// file descriptor.
func newSocketReader(conn syscall.Conn) *socketReader {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil
	}
	r := &socketReader{raw: raw}
	r.attempt = r.readOnce
	return r
}

// read reads into b as net.Conn.Read does: it waits for bytes, and returns
// io.EOF once the peer closed.
func (r *socketReader) read(b []byte) (int, error) {
	r.into, r.n, r.err = b, 0, nil
	err := r.raw.Read(r.attempt)
	r.into = nil
	switch {
	case err != nil:
		return 0, err // the poller's: a closed socket, a deadline
	case r.err != nil:
		return 0, r.err
	case r.n == 0:
		return 0, io.EOF
	}
	return r.n, nil
}

// readOnce is one read(2); false, on EAGAIN, asks the poller to wait until
// the socket is readable and call it again.
func (r *socketReader) readOnce(fd uintptr) bool {
	for {
		n, errno := rawRead(fd, r.into)
		switch errno {
		case 0:
			r.n = n
			return true
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			r.err = os.NewSyscallError("read", errno)
			return true
		}
	}
}
