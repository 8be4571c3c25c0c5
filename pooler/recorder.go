package pooler

import "time"

// LoginStage is where in the login a session was when it ended early.
type LoginStage string

// Login stages, a closed set so metric labels stay bounded.
const (
	StageStartup LoginStage = "startup" // reading SSLRequest/StartupMessage
	StageAuth    LoginStage = "auth"    // password exchange and verification
	StageReady   LoginStage = "ready"   // pool parameters, BackendKeyData, ReadyForQuery
)

// LoginResult is how a login ended, a closed set for metric labels.
type LoginResult string

const (
	LoginOK         LoginResult = "ok"
	LoginAuthFailed LoginResult = "auth_failed" // wrong password or unknown user
	LoginRejected   LoginResult = "rejected"    // refused by policy: unknown database, too many clients, shutting down
	LoginShed       LoginResult = "shed"        // refused by admission control under overload
	LoginError      LoginResult = "error"       // protocol violation or a server-side failure
)

// LoginTimings are the durations of a login's phases.
type LoginTimings struct {
	Startup time.Duration // first byte to StartupMessage parsed
	Auth    time.Duration // authentication, including verification against Postgres
	Ready   time.Duration // authenticated to ReadyForQuery written
	Total   time.Duration
}

// LoginRecorder receives the pooler's login events. The metrics package
// implements it; the pooler holds a never-nil no-op by default so the login
// path calls it unconditionally. Implementations must be cheap and safe for
// concurrent use: they run on every login.
type LoginRecorder interface {
	// LoginStarted is called when a connection sends its first byte: from
	// then until LoginFinished or LoginAbandoned it is a login in flight. A
	// connection that closes without sending a byte is not a login.
	LoginStarted()
	// LoginFinished is called once per started login that pgtender ended,
	// by admitting it (LoginOK) or refusing it.
	LoginFinished(result LoginResult, timings LoginTimings)
	// LoginAbandoned is called once per started login that the client left,
	// or that ran out of client_login_timeout, before ReadyForQuery.
	LoginAbandoned(stage LoginStage)
	// LoginCancelRequest is called when a started connection turned out to
	// carry a CancelRequest: it leaves the in-flight count without being a
	// login.
	LoginCancelRequest()
}

type nopRecorder struct{}

func (nopRecorder) LoginStarted()                           {}
func (nopRecorder) LoginFinished(LoginResult, LoginTimings) {}
func (nopRecorder) LoginAbandoned(LoginStage)               {}
func (nopRecorder) LoginCancelRequest()                     {}
