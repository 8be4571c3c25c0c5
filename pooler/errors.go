package pooler

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
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
