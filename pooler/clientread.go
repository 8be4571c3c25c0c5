package pooler

import (
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Reading the client's socket after login.
//
// Most clients of a pooler are idle most of the time: a Django worker holds
// its connection between requests, a fleet holds thousands. A read buffer
// held for the whole session is what such a client costs, so a plain-TCP
// session gives its buffer back to clientBufferPool whenever a read finds
// nothing to read, and takes one again when the socket turns readable. The
// socket is read straight from its file descriptor (syscall.RawConn), which
// is what lets the wait happen without a buffer: the runtime's poller calls
// clientReader.attempt again only once the socket is readable, so no
// readiness is lost between the failed read and the wait. The syscalls are
// the ones net.Conn.Read makes (a read, and the poller's wait when it would
// block); what is added is a sync.Pool Put and Get around each wait.
//
// A TLS session keeps its buffer: crypto/tls buffers records itself, so the
// plaintext cannot be waited for on the socket (docs/pooling.md, "What an
// idle client holds").

// clientReader reads the client's socket after login. Owned by the serve
// goroutine.
type clientReader struct {
	s   *session
	raw syscall.RawConn // nil: read through s.conn (TLS)
	// attempt is clientReader.read's callback, made once per session so
	// that a read does not allocate a closure.
	attempt func(fd uintptr) bool
	// The current read, for attempt: into the pooled buffer (*s.bufRef,
	// taken again when it was given back) or, when long is set, into long,
	// a larger buffer of a message wanted whole; from offset at.
	long []byte
	at   int
	n    int
	err  error
}

func (r *clientReader) init(s *session) {
	r.s = s
	if s.encrypted {
		return
	}
	raw, err := s.tcp.SyscallConn()
	if err != nil {
		return // read through s.conn
	}
	r.raw = raw
	r.attempt = r.readOnce
}

// buffer returns the session's pooled read buffer, taking one from
// clientBufferPool when it was given back.
func (r *clientReader) buffer() []byte {
	if r.s.bufRef == nil {
		r.s.bufRef = clientBufferPool.Get().(*[]byte)
	}
	return *r.s.bufRef
}

// release gives the pooled read buffer back while the session waits for
// the client; buffer takes one again.
func (r *clientReader) release() {
	if r.s.bufRef != nil {
		clientBufferPool.Put(r.s.bufRef)
		r.s.bufRef = nil
	}
}

// read reads into the pooled buffer (long nil) or into long, from offset
// at, and returns the buffer read into and the number of bytes read. The
// bytes before at are kept: the pooled buffer is given back during the wait
// only when at is 0 and long is nil. On an error the buffer returned is
// long, or nil: the session is ending.
func (r *clientReader) read(long []byte, at int) ([]byte, int, error) {
	if r.raw == nil {
		buf := long
		if buf == nil {
			buf = r.buffer()
		}
		n, err := r.s.conn.Read(buf[at:])
		return buf, n, err
	}
	r.long, r.at, r.n, r.err = long, at, 0, nil
	err := r.raw.Read(r.attempt)
	if r.s.waitingIdle.Load() {
		r.s.waitingIdle.Store(false)
	}
	if err != nil {
		return long, 0, err // the poller's: a closed socket, a deadline
	}
	if r.err != nil {
		return long, 0, r.err
	}
	if r.n == 0 {
		return long, 0, io.EOF
	}
	return r.current(), r.n, nil
}

// current is the buffer the current read is into.
func (r *clientReader) current() []byte {
	if r.long != nil {
		return r.long
	}
	return r.buffer()
}

// readOnce is one read(2) of the client's socket; false asks the poller
// to wait until the socket is readable and call it again.
func (r *clientReader) readOnce(fd uintptr) bool {
	for {
		n, errno := rawRead(fd, r.current()[r.at:]) // rawsocket.go
		switch {
		case errno == 0:
			r.n = n
			return true
		case errno == unix.EINTR:
			continue
		case errno == unix.EAGAIN:
			if r.long == nil && r.at == 0 {
				// Waiting with nothing held: the buffer goes back, and
				// the wait may become a parking (park.go).
				r.release()
				r.s.idleWaits.Add(1)
				r.s.waitingIdle.Store(true)
			}
			return false
		default:
			r.err = os.NewSyscallError("read", errno)
			return true
		}
	}
}
