package pooler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/pgtender/pgtender/pooler/wire"
)

// Sentinel errors to branch on.
var (
	// ErrPoolClosed is returned by Acquire on a pool that a reload or
	// shutdown closed.
	ErrPoolClosed = errors.New("pool closed")
	// ErrCheckoutTimeout is returned by Acquire when no server connection
	// became free within checkout_timeout.
	ErrCheckoutTimeout = errors.New("checkout timeout")
	// ErrServerClosed is returned by Serve after Shutdown.
	ErrServerClosed = errors.New("pooler closed")
)

// SQLSTATE codes pgtender sends itself.
const (
	sqlstateProtocolViolation     = "08P01"
	sqlstateConnectionFailure     = "08006"
	sqlstateInvalidPassword       = "28P01"
	sqlstateInvalidAuthorization  = "28000"
	sqlstateInvalidCatalogName    = "3D000"
	sqlstateInsufficientPrivilege = "42501"
	sqlstateTooManyConnections    = "53300"
	sqlstateAdminShutdown         = "57P01"
	sqlstateCrashShutdown         = "57P02"
	sqlstateCannotConnectNow      = "57P03"
	sqlstateFeatureNotSupported   = "0A000"
	// Postgres's own, for startup settings it refused.
	sqlstateSyntaxError            = "42601"
	sqlstateCantChangeRuntimeParam = "55P02"
	// Prepared statements in transaction mode (prepared.go).
	sqlstateDuplicatePreparedStatement = "42P05"
	sqlstateInFailedTransaction        = "25P02"
	// Postgres's for idle_in_transaction_session_timeout, which
	// client_idle_in_transaction_timeout mirrors.
	sqlstateIdleInTransactionTimeout = "25P03"
	sqlstateProgramLimitExceeded     = "54000"
	sqlstateQueryCanceled            = "57014"
	sqlstateInvalidStatementName     = "26000"
	sqlstateInternalError            = "XX000"
	// The admin console's (console.go).
	sqlstateConfigFileError = "F0000"
	sqlstateUndefinedObject = "42704"
	sqlstateObjectInUse     = "55006"
	// sqlstateObjectNotInPrerequisiteState: a database DISABLEd on the
	// admin console (Postgres answers 55000 to a login to a database
	// that does not allow connections).
	sqlstateObjectNotInPrerequisiteState = "55000"
)

// clientError is an error that is shown to the client: its SQLSTATE and
// message are safe to send, while err carries the detail operators see in
// the log. It is how code deep in the session picks what the client sees.
type clientError struct {
	severity string // wire.SeverityError or wire.SeverityFatal
	code     string // SQLSTATE
	message  string // client-visible text, never internal detail
	err      error  // cause, for logs; may be nil
	// result is how a refused login is counted; "" derives it from code
	// (loginResultOf).
	result LoginResult
}

func (e *clientError) Error() string {
	if e.err != nil {
		return e.code + " " + e.message + ": " + e.err.Error()
	}
	return e.code + " " + e.message
}

func (e *clientError) Unwrap() error { return e.err }

func fatalError(code, message string, cause error) *clientError {
	return &clientError{severity: "FATAL", code: code, message: message, err: cause}
}

// isNormalClose reports whether err is an ordinary end of a connection
// (peer closed, we closed, shutdown) rather than something worth logging.
func isNormalClose(err error) bool {
	return err == nil || err == errClientLeft ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) ||
		errors.Is(err, context.Canceled) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE)
}

// isTimeout reports whether err is a deadline expiry.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// ClientProtocolErrors counts the logged-in clients disconnected with
// 08P01 because of what they sent: a length word outside the protocol's
// bounds (Malformed), a message longer than max_message_size (TooLarge), or
// a message of a type a logged-in client may not send (UnknownType). A
// malformed login is counted in logins_total{result="error"} instead.
type ClientProtocolErrors struct {
	Malformed, TooLarge, UnknownType uint64
}

// clientProtocolCounters are the atomics behind ClientProtocolErrors.
type clientProtocolCounters struct {
	malformed, tooLarge, unknownType atomic.Uint64
}

// ClientProtocolErrors returns the counters now.
func (p *Pooler) ClientProtocolErrors() ClientProtocolErrors {
	return ClientProtocolErrors{
		Malformed:   p.protocolErrors.malformed.Load(),
		TooLarge:    p.protocolErrors.tooLarge.Load(),
		UnknownType: p.protocolErrors.unknownType.Load(),
	}
}

// clientProtocolError counts err, the client scanner's, and turns it into
// what the client is told before the session ends: Postgres's 08P01, with
// the bound that was crossed for a message too large (the detail is only
// lengths and a type byte, never the bytes themselves).
func (p *Pooler) clientProtocolError(err error) *clientError {
	if errors.Is(err, wire.ErrMessageTooLarge) {
		p.protocolErrors.tooLarge.Add(1)
		return fatalError(sqlstateProtocolViolation, "invalid message length: "+strings.TrimPrefix(err.Error(), wire.ErrMessageTooLarge.Error()+": ")+" (max_message_size)", err)
	}
	p.protocolErrors.malformed.Add(1)
	return fatalError(sqlstateProtocolViolation, "invalid message from client", err)
}

// unknownMessageType counts a message of a type a logged-in client may not
// send, and is what its client is told, in Postgres's words.
func (p *Pooler) unknownMessageType(typ byte) *clientError {
	p.protocolErrors.unknownType.Add(1)
	return fatalError(sqlstateProtocolViolation, fmt.Sprintf("invalid frontend message type %d", typ), nil)
}
