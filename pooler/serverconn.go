package pooler

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5/pgconn"
	"golang.org/x/sys/unix"

	"github.com/pgtender/pgtender/auth"
	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/pooler/wire"
)

// serverReadBufferLen is the size of each server connection's read buffer.
// 16 KiB holds Postgres's 8 KiB send buffer twice over, so a typical
// response arrives in one read and leaves in one write.
const serverReadBufferLen = 16 << 10

// ServerConn is one authenticated connection to Postgres.
//
// Ownership: an idle ServerConn belongs to its Pool; Acquire hands it to one
// client session, which owns it (and the goroutine reading it) until it
// calls Release or Discard. Only the owner reads or writes conn, buf and
// scanner; nothing in a ServerConn is safe for concurrent use.
type ServerConn struct {
	conn net.Conn
	// in and out read and write conn's socket with raw syscalls
	// (rawsocket.go) for the relay's hot path (readServer,
	// forwardClientBytes); nil over TLS.
	in      *socketReader
	out     *socketWriter
	peeker  *socketPeeker // conn's, made by idleAndAlive, which only the checkout calls
	buf     []byte        // read buffer, owned by this connection for its life
	scanner wire.Scanner  // message boundaries of what the server sent
	// carried is how many bytes at the front of buf are a partial message
	// header held back by the relay (readServer), not yet scanned again;
	// skip is how many bytes of a swallowed reply are still to come.
	carried, skip int
	// unnamedOwner is the session whose Parse last made this connection's
	// unnamed statement, and unnamedGeneration that session's count of
	// unnamed statements at the time (nil: none, or one made by a simple
	// Query or pgtender's own, which destroy it). See planUnnamedLocked.
	unnamedOwner      uint64 // a session's serial; 0: none; unnamedUnknown
	unnamedGeneration uint64
	// unnamedOp is the op a Parse of the unnamed statement settles with
	// (statementOp.unnamed), one for the connection's life.
	unnamedOp statementOp

	processID uint32            // Postgres backend pid, for cancel requests
	secretKey []byte            // cancel secret of that backend
	address   string            // host:port the connection was opened to, for cancel requests
	params    map[string]string // ParameterStatus set at connect, for client logins
	// settings are the session-level settings of this connection's
	// session (params.go): none when it opens, then what pgtender set on
	// it or probed. Owned with the connection.
	settings sessionSettings
	// statements are the renamed prepared statements this connection's
	// session holds (prepared.go).
	statements serverStatements

	pool      *Pool
	createdAt time.Time
	idleSince time.Time // when it last went back to the pool
	// aliveAt is when the connection last proved that Postgres answers on
	// it: it opened, a client's transaction ended on it (Release), or a
	// health check passed (Pool.healthCheck). Health checks are due by it;
	// idle_timeout goes by idleSince, which a health check leaves alone.
	aliveAt time.Time
}

// read reads from the server for the relay.
func (sc *ServerConn) read(b []byte) (int, error) {
	if sc.in != nil {
		return sc.in.read(b)
	}
	return sc.conn.Read(b)
}

// write writes client bytes to the server for the relay.
func (sc *ServerConn) write(b []byte) (int, error) {
	if sc.out != nil {
		return sc.out.write(b)
	}
	return sc.conn.Write(b)
}

// writeBuffers writes all of pieces to the server, in order, in one
// writev(2) where the socket takes them all.
func (sc *ServerConn) writeBuffers(pieces net.Buffers) (int, error) {
	if sc.out != nil {
		return sc.out.writeBuffers(pieces)
	}
	n, err := pieces.WriteTo(sc.conn)
	return int(n), err
}

// serverEndpoint is everything needed to open a server connection.
type serverEndpoint struct {
	host           string
	port           int
	database       string
	user           string
	password       string
	connectTimeout time.Duration
	tlsVerify      config.TLSVerify
}

// inspectServerMessage tells the scanner of server output which message
// bodies the relay must see: the transaction status of ReadyForQuery, and
// the start of an ErrorResponse (its code and message, to tell how a COPY
// ended). Errors are rare; ReadyForQuery costs one byte.
func inspectServerMessage(typ byte) int {
	switch typ {
	case wire.MsgReadyForQuery:
		return 1
	case wire.MsgErrorResponse:
		return 256
	case wire.MsgParameterStatus:
		return inspectParameterStatus
	}
	return 0
}

// copyFailedByClient reports whether an ErrorResponse body (or its first
// bytes) is Postgres's answer to the client's own CopyFail: SQLSTATE 57014
// with the message "COPY from stdin failed: …". A cancel or a bad row also
// ends a COPY with an error, but at a point that may come before Syncs the
// client sent inside the COPY, which Postgres then answers; only the
// CopyFail answer proves they were all ignored. A translated message
// (lc_messages) does not match, which errs on the safe side.
func copyFailedByClient(body []byte) bool {
	code, message := wire.ErrorFields(body)
	return string(code) == "57014" && strings.HasPrefix(string(message), "COPY from stdin failed")
}

// openServerConn opens and authenticates a server connection with pgconn
// (which speaks SCRAM-SHA-256, md5 and cleartext to Postgres), then takes
// the raw connection over. roots verify the server's certificate under
// verify_ca and verify_full (nil: the system's roots). An error that means
// Postgres refused the credentials wraps auth.ErrRejected; one from before
// any connection to Postgres was made (so the password was not sent) wraps
// auth.ErrPasswordNotSent. plaintextOnly, under tls_verify = "prefer", skips
// the TLS attempt: the server refused TLS before (serverTarget). refusedTLS
// reports that the server answered this connect's SSLRequest with 'N'.
func openServerConn(ctx context.Context, endpoint serverEndpoint, roots *x509.CertPool, plaintextOnly bool) (sc *ServerConn, refusedTLS bool, err error) {
	sslmode := "prefer"
	switch endpoint.tlsVerify {
	case config.TLSVerifyDisabled:
		sslmode = "disable"
	case config.TLSVerifyPrefer:
		if plaintextOnly {
			sslmode = "disable"
		}
	case config.TLSVerifyVerifyCA:
		sslmode = "verify-ca"
	case config.TLSVerifyVerifyFull:
		sslmode = "verify-full"
	}
	// Only host, port and the ssl settings go through the parser; everything
	// else is set on the parsed config, so that no PG* environment variable
	// of the pooler's process can change where or as whom it connects.
	// The empty ssl* values keep PGSSLROOTCERT and friends out as well.
	connConfig, err := pgconn.ParseConfig(fmt.Sprintf("host=%s port=%d sslmode=%s sslrootcert='' sslcert='' sslkey=''",
		quoteConnValue(endpoint.host), endpoint.port, sslmode))
	if err != nil {
		return nil, false, fmt.Errorf("server connection settings: %w", err)
	}
	if roots != nil && (sslmode == "verify-ca" || sslmode == "verify-full") {
		// pgconn checks the chain against RootCAs, and under verify-ca
		// reads them when the handshake verifies the chain: it is its
		// own verify-ca (chain checked, host name not).
		connConfig.TLSConfig.RootCAs = roots
	}
	connConfig.User = endpoint.user
	connConfig.Password = endpoint.password
	connConfig.Database = endpoint.database
	connConfig.RuntimeParams = map[string]string{}
	connConfig.ConnectTimeout = endpoint.connectTimeout
	connConfig.ValidateConnect = nil
	connConfig.AfterConnect = nil
	for _, fallback := range connConfig.Fallbacks {
		fallback.Host = endpoint.host
		fallback.Port = uint16(endpoint.port)
	}
	// dialed records whether any dial (of the TLS attempt or its plaintext
	// fallback) reached Postgres: until one did, the password cannot have
	// been sent. After one, a failure (TLS, a timeout) may come after the
	// password, and counts as a failed attempt for the registry's limits.
	var dialed atomic.Bool
	dial := connConfig.DialFunc
	connConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err == nil {
			dialed.Store(true)
		}
		return conn, err
	}
	if endpoint.connectTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, endpoint.connectTimeout)
		defer cancel()
	}
	// Under prefer, pgconn would make the TLS attempt and its plaintext
	// fallback in one call. pgtender makes them one at a time, to see why
	// the TLS attempt failed: only a refused SSLRequest may be remembered.
	prefer := sslmode == "prefer"
	if prefer {
		connConfig.Fallbacks = nil
	}
	pgConn, err := pgconn.ConnectConfig(ctx, connConfig)
	if err != nil && prefer && preferFallsBack(ctx, err) {
		refusedTLS = tlsRefused(err)
		connConfig.TLSConfig = nil
		pgConn, err = pgconn.ConnectConfig(ctx, connConfig)
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == sqlstateInvalidPassword || pgErr.Code == sqlstateInvalidAuthorization) {
			return nil, refusedTLS, fmt.Errorf("%w: %s", auth.ErrRejected, pgErr.Message)
		}
		err = fmt.Errorf("connect to %s:%d: %w%s", endpoint.host, endpoint.port, err, tlsVerifyHint(err, endpoint.host))
		if !dialed.Load() {
			err = fmt.Errorf("%w (%w)", err, auth.ErrPasswordNotSent)
		}
		return nil, refusedTLS, err
	}
	if err := pgConn.SyncConn(ctx); err != nil {
		pgConn.Close(context.Background())
		return nil, refusedTLS, fmt.Errorf("sync new server connection: %w", err)
	}
	hijacked, err := pgConn.Hijack()
	if err != nil {
		pgConn.Close(context.Background())
		return nil, refusedTLS, fmt.Errorf("take over server connection: %w", err)
	}
	now := time.Now()
	sc = &ServerConn{
		conn:      hijacked.Conn,
		buf:       make([]byte, serverReadBufferLen),
		processID: hijacked.PID,
		secretKey: hijacked.SecretKey,
		address:   net.JoinHostPort(endpoint.host, strconv.Itoa(endpoint.port)),
		params:    hijacked.ParameterStatuses,
		createdAt: now,
		aliveAt:   now,
		idleSince: now,
	}
	sc.scanner.Inspect = inspectServerMessage
	sc.unnamedOp = statementOp{server: sc, unnamed: true}
	if tcp, ok := sc.conn.(*net.TCPConn); ok {
		sc.in, sc.out = newSocketReader(tcp), newSocketWriter(tcp)
	}
	return sc, refusedTLS, nil
}

// preferFallsBack reports whether a failed TLS attempt under sslmode
// "prefer" is followed by a plaintext one. As in pgconn's connectPreferred
// (pgconn.go), a wrong password, an unknown database or a missing CONNECT
// privilege is final: it would be the same answer in plaintext, and the
// password would be sent twice. So is a context that ended.
func preferFallsBack(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		switch pgErr.Code {
		case sqlstateInvalidPassword, sqlstateInvalidCatalogName, sqlstateInsufficientPrivilege:
			return false
		}
	}
	return true
}

// tlsRefused reports whether a connect failed because Postgres answered its
// SSLRequest with 'N'. pgconn reports that answer only as text (startTLS,
// pgconn.go); TestPreferDialsOnceAfterTheServerRefusedTLS notices if the
// text changes.
func tlsRefused(err error) bool {
	return strings.Contains(err.Error(), "server refused TLS connection")
}

// tlsVerifyHint says what to change when err is a failed check of
// Postgres's certificate, for the log; "" otherwise.
func tlsVerifyHint(err error, host string) string {
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		return " (tls_verify: Postgres's certificate is not signed by a CA pgtender trusts; set tls_server_ca_certificate to the CA that signed it)"
	}
	if _, ok := errors.AsType[x509.HostnameError](err); ok {
		return fmt.Sprintf(" (tls_verify = \"verify_full\": Postgres's certificate is not valid for host %q; use a host name the certificate names, or \"verify_ca\")", host)
	}
	return ""
}

// quoteConnValue quotes a value for a keyword/value connection string.
func quoteConnValue(value string) string {
	quoted := make([]byte, 0, len(value)+2)
	quoted = append(quoted, '\'')
	for i := 0; i < len(value); i++ {
		if value[i] == '\'' || value[i] == '\\' {
			quoted = append(quoted, '\\')
		}
		quoted = append(quoted, value[i])
	}
	return string(append(quoted, '\''))
}

// atBoundary reports whether the server stream is between two messages,
// with nothing held back.
func (sc *ServerConn) atBoundary() bool {
	return sc.carried == 0 && sc.skip == 0 && sc.scanner.AtBoundary()
}

// overTLS reports whether the connection to Postgres is encrypted.
func (sc *ServerConn) overTLS() bool {
	_, ok := sc.conn.(*tls.Conn)
	return ok
}

// close closes the network connection, telling Postgres goodbye first when
// the connection is at a message boundary.
func (sc *ServerConn) close() {
	if sc.atBoundary() {
		_ = sc.conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = sc.conn.Write([]byte{wire.MsgTerminate, 0, 0, 0, 4})
	}
	_ = sc.conn.Close()
}

// idleAndAlive reports whether an idle server connection is still open and
// has sent nothing since it went idle. Postgres sends a FATAL error before
// it ends a session (shutdown, pg_terminate_backend), so unread bytes on an
// idle connection mean it is going away.
func (sc *ServerConn) idleAndAlive() bool {
	if sc.peeker == nil {
		sc.peeker = newSocketPeeker(sc.conn)
	}
	switch sc.peeker.look() {
	case peekNothing, peekUnknown: // not a socket: the first use will tell
		return true
	}
	return false
}

// peekResult is what a non-blocking look at a socket's receive queue found.
type peekResult int

const (
	peekNothing peekResult = iota // open, nothing to read
	peekData                      // bytes are waiting
	peekClosed                    // the peer closed or reset the connection
	peekUnknown                   // not a socket pgtender can look into
)

// peekConn looks at conn's receive queue with one non-blocking
// recv(MSG_PEEK) and never waits. For a connection looked at often (a
// server connection at every checkout), a socketPeeker made once does it
// without allocating.
func peekConn(conn net.Conn) peekResult {
	return newSocketPeeker(conn).look()
}

// socketPeeker looks at one socket's receive queue (look). The zero value,
// and nil, find peekUnknown.
type socketPeeker struct {
	raw    syscall.RawConn
	recv   func(fd uintptr) bool // peekOnce, bound once
	await  func(fd uintptr) bool // peekOrWait, bound once
	probe  [1]byte
	result peekResult
}

// newSocketPeeker returns a peeker for conn, which sees nothing but
// peekUnknown unless conn is a socket. A TLS connection is looked at
// through the socket under it: its records hide what the bytes are, but
// not that some arrived (on an idle connection, a FATAL error or a close
// alert) or that the peer closed.
func newSocketPeeker(conn net.Conn) *socketPeeker {
	p := &socketPeeker{}
	if tlsConn, ok := conn.(*tls.Conn); ok {
		conn = tlsConn.NetConn()
	}
	if sysConn, ok := conn.(syscall.Conn); ok {
		if raw, err := sysConn.SyscallConn(); err == nil {
			p.raw = raw
			p.recv = p.peekOnce
			p.await = p.peekOrWait
		}
	}
	return p
}

// look reports what the socket's receive queue holds. Not safe for
// concurrent use.
func (p *socketPeeker) look() peekResult {
	if p == nil || p.raw == nil {
		return peekUnknown
	}
	p.result = peekUnknown
	if err := p.raw.Read(p.recv); err != nil {
		return peekClosed
	}
	return p.result
}

// wait blocks until the socket's receive queue holds bytes (peekData) or
// the peer closed (peekClosed), or until the socket's read deadline passes
// (peekNothing), which is how another goroutine ends the wait. It consumes
// nothing. Not safe for concurrent use, nor while the socket is read.
func (p *socketPeeker) wait() peekResult {
	if p == nil || p.raw == nil {
		return peekUnknown
	}
	p.result = peekUnknown
	if err := p.raw.Read(p.await); err != nil {
		if isTimeout(err) {
			return peekNothing
		}
		return peekClosed
	}
	return p.result
}

// peekOrWait is wait's recvfrom(2): false, when nothing is there, asks the
// poller to call it again once the socket is readable.
func (p *socketPeeker) peekOrWait(fd uintptr) bool {
	p.peekOnce(fd)
	return p.result != peekNothing
}

// peekOnce is the look's one recvfrom(2); it always returns true, because
// asking the poller to wait would block a checkout on an idle connection.
func (p *socketPeeker) peekOnce(fd uintptr) bool {
	for {
		// No address asked for, so that nothing is allocated for one
		// (unix.Recvfrom always decodes one). A raw call (rawsocket.go
		// says why): MSG_DONTWAIT never sleeps.
		n, _, errno := unix.RawSyscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p.probe[0])), 1,
			unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		switch {
		case errno == unix.EINTR:
			continue
		case errno == 0 && n > 0:
			p.result = peekData
		case errno == 0:
			p.result = peekClosed
		case errno == unix.EAGAIN || errno == unix.EWOULDBLOCK:
			p.result = peekNothing
		default:
			p.result = peekClosed
		}
		return true
	}
}

// exec runs one simple-protocol statement that returns no rows the caller
// needs (ROLLBACK, DISCARD ALL, SET) and waits for its ReadyForQuery, within
// timeout. The ParameterStatus messages it causes go no further: the
// caller records the settings it changed. It fails unless the statement succeeded and the connection ends
// outside any transaction.
func (sc *ServerConn) exec(sql string, timeout time.Duration) error {
	if !sc.atBoundary() {
		return errors.New("server connection is in the middle of a message")
	}
	sc.unnamedOwner = 0 // a simple Query destroys the unnamed statement
	deadline := time.Now().Add(timeout)
	_ = sc.conn.SetWriteDeadline(deadline)
	_, err := sc.conn.Write(wire.AppendQuery(nil, sql))
	_ = sc.conn.SetWriteDeadline(time.Time{})
	if err != nil {
		return err
	}
	status, failed, err := sc.drain(1, deadline)
	switch {
	case err != nil:
		return err
	case failed:
		return fmt.Errorf("%q failed on the server", sql)
	case status != wire.TxIdle:
		return fmt.Errorf("%q left the connection in a transaction", sql)
	}
	return nil
}

// healthCheckQuery is what a health check sends: an empty query, which
// Postgres answers with EmptyQueryResponse and ReadyForQuery without
// planning anything, as PgBouncer's default server_check_query (empty
// since 1.25, src/server.c) and PgDog's health check do.
const healthCheckQuery = ";"

// check runs the health check on an idle connection: the empty query must
// be answered within timeout. ctx ending (shutdown) ends the wait too.
func (sc *ServerConn) check(ctx context.Context, timeout time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = sc.conn.SetDeadline(time.Now()) })
	err := sc.exec(healthCheckQuery, timeout)
	if !stop() && err == nil {
		// ctx ended as the check passed: its deadline in the past may be
		// set on the connection any moment now, so it must not be used.
		return ctx.Err()
	}
	return err
}

// errCopyWithoutClient: draining met a COPY that only the client could
// feed.
var errCopyWithoutClient = errors.New("the server is waiting for COPY data from a client")

// drain reads the server's replies until pending ReadyForQuery messages
// have arrived or deadline passes, dropping them, and returns the
// transaction status of the last one and whether any ErrorResponse came.
// It serves exec and the requests of a departed client (returnServer). A
// COPY from
// the client cannot be fed here (errCopyWithoutClient), and anything after
// the last ReadyForQuery is an error: the caller closes the connection on
// any error. A read that times out leaves the connection usable for
// another drain.
func (sc *ServerConn) drain(pending int, deadline time.Time) (txStatus byte, failed bool, err error) {
	_ = sc.conn.SetReadDeadline(deadline)
	defer sc.conn.SetReadDeadline(time.Time{})
	// Bytes the relay held back are scanned first; a swallowed reply's
	// rest is read like any other, as nothing is forwarded here.
	sc.skip = 0
	for pending > 0 {
		n, err := sc.conn.Read(sc.buf[sc.carried:])
		n += sc.carried
		sc.carried = 0
		if err != nil && n == 0 {
			return 0, failed, err
		}
		for off := 0; off < n; {
			var msg wire.Message
			var ok bool
			off, msg, ok, err = sc.scanner.Next(sc.buf[:n], off)
			if err != nil {
				return 0, failed, err
			}
			if !ok {
				break
			}
			switch msg.Type {
			case wire.MsgErrorResponse:
				failed = true
			case wire.MsgParameterStatus:
				sc.noteParameterStatus(msg.Body)
			case wire.MsgCopyInResponse, wire.MsgCopyBothResponse:
				return 0, failed, errCopyWithoutClient
			case wire.MsgReadyForQuery:
				if len(msg.Body) != 1 {
					return 0, failed, errors.New("malformed ReadyForQuery")
				}
				txStatus = msg.Body[0]
				pending--
				if pending == 0 && (off != n || !sc.scanner.AtBoundary()) {
					return 0, failed, errors.New("unexpected data after ReadyForQuery")
				}
			}
		}
	}
	return txStatus, failed, nil
}

// sendCancel asks Postgres to cancel what the backend behind sc is running,
// on a new connection, as the protocol requires.
func sendCancel(ctx context.Context, address string, processID uint32, secret []byte) error {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "tcp", address)
	if err != nil {
		return err
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	if _, err := conn.Write(wire.AppendCancelRequest(nil, processID, secret)); err != nil {
		return err
	}
	// Postgres closes the connection once it has read the request; waiting
	// for that keeps the cancel from racing the next query. Anything but
	// that close (a timeout, a reset) leaves it unknown whether Postgres
	// took the cancel in.
	var discard [1]byte
	if _, err := conn.Read(discard[:]); !errors.Is(err, io.EOF) {
		if err == nil {
			err = errors.New("cancel connection: Postgres sent data instead of closing")
		}
		return fmt.Errorf("cancel request may not have reached Postgres: %w", err)
	}
	return nil
}
