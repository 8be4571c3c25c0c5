package pooler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"

	"github.com/pgtender/pgtender/auth"
	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/pooler/sqlscan"
	"github.com/pgtender/pgtender/pooler/wire"
)

// clientReadBufferLen is the size of a session's read buffer. 8 KiB matches
// libpq's send buffer, so a client's batch usually arrives in one read.
const clientReadBufferLen = 8 << 10

// maxAuthMessageLen bounds messages read during login (passwords, SASL);
// it stays below clientReadBufferLen so the login never grows the buffer.
const maxAuthMessageLen = clientReadBufferLen - wire.HeaderLen

var clientBufferPool = sync.Pool{New: func() any {
	b := make([]byte, clientReadBufferLen)
	return &b
}}

// clientState is where a client session is in its life, and what the
// relay does depends on it. The legal transitions are
//
//	stateStartup → stateAuth → stateReady → stateIdle
//	stateIdle ⇄ stateLinked (a server connection is linked to the client)
//	stateLinked → stateServerLost (the linked server connection failed)
//	stateIdle, stateLinked, stateServerLost → stateShuttingDown
//	any state → stateClosing → stateClosed
//
// From stateServerLost on the states only move forward (endLocked), and
// nothing links a server connection any more. After login they change
// under the session's mu; setState is the only writer.
type clientState int32

const (
	stateStartup clientState = iota // reading SSLRequest/StartupMessage
	stateAuth                       // password exchange and verification
	stateReady                      // sending the pool's parameters and ReadyForQuery
	stateIdle                       // logged in, no server connection linked
	stateLinked                     // a server connection is linked
	// stateServerLost: the linked server connection failed; whatever the
	// client sends now belongs to work that is lost, so it must not run
	// on another server connection. The client is told and closed.
	stateServerLost
	// stateShuttingDown: pgtender ended the session for a shutdown (the
	// client is told 57P01), or is ending it once its transaction ends.
	stateShuttingDown
	// stateClosing: the session is ending; readServer hands a linked
	// server connection over to finish, and nothing is released.
	stateClosing
	stateClosed
)

func (s clientState) String() string {
	switch s {
	case stateStartup:
		return "startup"
	case stateAuth:
		return "auth"
	case stateReady:
		return "ready"
	case stateIdle:
		return "idle"
	case stateLinked:
		return "linked"
	case stateServerLost:
		return "server lost"
	case stateShuttingDown:
		return "shutting down"
	case stateClosing:
		return "closing"
	case stateClosed:
		return "closed"
	}
	return fmt.Sprintf("clientState(%d)", int32(s))
}

// session is one client connection, from its first byte to its close. Its
// own goroutine (serve) reads from the client; while a server connection is
// linked, a second goroutine (readServer) reads from the server and writes
// to the client.
type session struct {
	pooler *Pooler
	// tcp is the client's socket; any goroutine may close it (closeSocket)
	// to end the session. conn is what the session reads and writes: tcp,
	// or the TLS connection over it once answerSSLRequest has run. conn is
	// replaced only under wmu, by the serve goroutine, during login; other
	// goroutines use it only under wmu.
	tcp       *net.TCPConn
	conn      net.Conn
	encrypted bool // TLS was negotiated; owned by the serve goroutine
	// processID and secret are the client's BackendKeyData (cancel.go),
	// set when the session is registered and read-only after.
	processID uint32
	secret    uint32
	state     atomic.Int32
	loggedIn  atomic.Bool
	// clientWaitSince is when the login began waiting on its client's
	// bytes (loginReader), in loginSlots.clock time plus one; 0 while it
	// is not waiting. endedStalled is set when admission ended the login
	// for it (Pooler.endStalledLogins).
	clientWaitSince atomic.Int64
	endedStalled    atomic.Bool
	// Parking (park.go). waitingIdle: the serve goroutine waits for the
	// client with nothing held (clientReader.readOnce sets it, read clears
	// it); idleWaits counts those waits, and idleWaitsSeen is its value at
	// the previous sweep (owned by the sweep), so that a session that
	// waited throughout an interval is told from one that waits often.
	// parkAsked: the sweep asked the session to park. parked: the session
	// is parked; whoever moves it from true to false owns the session.
	waitingIdle   atomic.Bool
	idleWaits     atomic.Uint32
	idleWaitsSeen uint32
	parkAsked     atomic.Bool
	parked        atomic.Bool

	// Owned by the serve goroutine.
	// bufRef is the pooled read buffer, returned at close; after login
	// it is nil while in (clientReader) has given it back.
	bufRef *[]byte
	reader *wire.Reader // login only
	// loginIn is what reader reads during login (loginReader): a field,
	// so that handing it to the reader allocates nothing.
	loginIn loginReader
	in      clientReader // after login
	// scanner follows the client stream while the relay loop runs: taken
	// from clientScanners by takeScanner, given back when the session
	// parks or ends (a parked session is between messages, so its scanner
	// holds nothing). maxMessageLen is its MaxLen, set at login.
	scanner       *wire.Scanner
	maxMessageLen int
	// The text of the Query or Parse being relayed is followed by sql as
	// it passes (feedText): textLeft bytes of its body are still to come.
	// sql is taken from sqlScanners by beginText and given back when the
	// text has passed; nil between texts.
	sql *sqlscan.Scanner
	// standardConformingStringsOff is how the client's session reads
	// strings, as of its last probe: the next text is lexed so.
	standardConformingStringsOff bool
	textMessage                  byte
	textLeft                     int
	textSkipName                 bool // a Parse's statement name is still passing
	textNamed                    bool // the Parse names its statement
	// effectfulStatements: a named statement the client prepared may
	// change the session's state when executed (its text did, to
	// sqlscan); effectfulUnnamed: the unnamed one may. A Bind then marks
	// the transaction for a probe.
	effectfulStatements bool
	effectfulUnnamed    bool
	// textDeallocate is the name of the DEALLOCATE the text followed last
	// consists of, or nil.
	textDeallocate []byte
	textDrops      statementDrops // and what else it drops
	textResets     bool           // it has RESET ALL or DISCARD ALL
	// restoreAfterSync: a Parse of RESET ALL or DISCARD ALL passed; the
	// client's startup settings are restored after the batch's Sync
	// (restoreStartupLocked).
	restoreAfterSync bool
	// serial names the session for as long as the process runs;
	// unnamedGeneration counts the unnamed statements it made or lost
	// (planChunkLocked).
	serial            uint64
	unnamedGeneration uint64
	// unnamedParse is the client's latest Parse of the unnamed statement,
	// whole, while its statement lasts (planChunkLocked); empty when
	// there is none or it was too long to keep.
	unnamedParse []byte
	// edits, editBytes, keyScratch and writeBuffers are planChunkLocked's
	// and writeEdited's scratch, reused from chunk to chunk.
	edits        []edit
	editBytes    []byte
	keyScratch   []byte
	writeBuffers net.Buffers
	// serverOut and replyScratch are readServer's scratch (under mu) for
	// output with pgtender's own replies in it.
	serverOut    []byte
	replyScratch []byte
	// pendingStatements is prepareWithoutServerLocked's scratch.
	pendingStatements []*preparedStatement
	user              string
	database          string
	// console: the session is on the admin console (console.go), not
	// relayed; set at login, read-only after.
	console bool
	// killed: an operator ended the session (KILL_CLIENT): a server
	// connection it held is closed, not cleaned and returned
	// (returnServer).
	killed       atomic.Bool
	pool         *Pool
	connectedAt  time.Time
	localReplies []byte       // scratch for replies pgtender sends itself
	chunk        chunkSummary // what the last client chunk held

	wmu sync.Mutex // serialises writes to conn, so messages never interleave
	// writeDeadline is conn's write deadline after login, as write last
	// set it (boundWriteLocked); zero when none is set. writeTimedOut: a
	// write to the client ran out of client_write_timeout. Both under wmu.
	writeDeadline time.Time
	writeTimedOut bool
	// out writes to tcp while conn is tcp (rawsocket.go); nil once conn
	// is TLS. Under wmu.
	out *socketWriter

	// mu guards the link between the client and a server connection. The
	// release point is decided under it: see releaseIfAtRestLocked.
	mu     sync.Mutex
	cond   sync.Cond // on mu; signalled when writing turns false
	server *ServerConn
	// readers counts the readServer goroutines that have not returned:
	// finish waits for them. Nothing links after finish has begun, so no
	// Add follows its Wait.
	readers    sync.WaitGroup
	link       link // protocol state of the link to server (link.go)
	writing    bool // serve is writing client bytes to server
	discarding bool // after a failed checkout: drop extended messages until Sync
	// clientPeeker watches the client's socket while the session waits
	// for a server connection (watchClientWhileWaiting); made at the first
	// wait. Owned by the serve goroutine.
	clientPeeker *socketPeeker
	// checkoutCancel ends the checkout the session waits in, for a
	// CancelRequest from its client (Pooler.cancelRequest); nil when it
	// waits in none. Under mu.
	checkoutCancel context.CancelCauseFunc
	// waitingSince is when the checkout the session waits in began (SHOW
	// CLIENTS's wait); zero when it waits in none. Under mu.
	waitingSince time.Time
	// idleTxDeadline is the client socket's read deadline while the client
	// is idle in a transaction under client_idle_in_transaction_timeout
	// (timeouts.go); zero when none is set.
	idleTxDeadline time.Time
	// The query_timeout clock (timeouts.go): queryClock is made at the
	// first timed request; a run-out counts only if queryClockRunning and
	// queryClockStarted is a timeout ago; queryTimedOut tells readServer
	// to end the session.
	queryClock        *time.Timer
	queryClockRunning bool
	queryClockStarted time.Time
	queryTimedOut     bool
	// woken says a read deadline in the past was given to the server
	// connection to make readServer look at the session again
	// (wakeReaderLocked); readServer clears both.
	woken bool
	// readBudget says the server connection's read deadline is the budget
	// of a read on the serve goroutine (readServerInline), which whoever
	// ends that read clears. Under mu.
	readBudget bool
	// cancelsInFlight counts cancel requests being forwarded to the linked
	// server; the link is not released until they are delivered.
	cancelsInFlight int
	mode            config.PoolerMode
	// settings are the client's session settings (params.go): what each
	// server connection it is linked to must carry. Replaced, never
	// changed in place, so alignServer may read it without the lock held.
	settings sessionSettings
	// settingsMayHaveChanged: something the client sent on the linked
	// server connection may have changed its session's state; the server
	// connection is probed before it is released (probeAtRest).
	settingsMayHaveChanged bool
	// pinned: the server connection's session holds what cannot follow
	// the client (sessionPins, or untrackedSettings); it stays linked
	// until a probe finds it released.
	pinned bool
	// ownCustomNames are the custom parameters ("app.tenant") the client
	// was seen to set (noteCustomSettings), lower-cased: every probe of
	// its server connections asks for them, whatever the pool's registry
	// holds. Written by the serve goroutine under mu; replaced, never
	// changed in place.
	ownCustomNames []string
	// untrackedSettings: the client may have set a custom parameter whose
	// name pgtender could not see (sqlscan.UnknownCustomName). No probe
	// can find it, so the server connection is pinned to the client for
	// the rest of its life and closed after (returnServer).
	untrackedSettings bool
	// probing: readServer is probing the server connection; serve does
	// not write to it meanwhile (it waits on cond).
	probing bool
	// startupSettings are the settings of the client's startup packet, as
	// Postgres spells them; set at login, then read-only.
	startupSettings sessionSettings
	// statements are the client's named prepared statements, by the
	// client's names (truncated as Postgres truncates them), when they are
	// renamed (prepared.go).
	statements map[string]*preparedStatement
	// renaming: the client's named statements are renamed (the pool's
	// prepared_statements when the client logged in).
	renaming bool

	bytesReceived atomic.Int64
	bytesSent     atomic.Int64
	transactions  atomic.Int64
}

// sessionSerials numbers sessions, from 1.
var sessionSerials atomic.Uint64

func newSession(p *Pooler, conn *net.TCPConn) *session {
	s := &session{
		pooler:      p,
		tcp:         conn,
		conn:        conn,
		connectedAt: time.Now(),
		serial:      sessionSerials.Add(1),
	}
	s.out = newSocketWriter(conn)
	s.link.reset()
	s.cond.L = &s.mu
	return s
}

func (s *session) setState(state clientState) {
	s.state.Store(int32(state))
}

// stateLocked returns the session's state. After login s.mu must be held.
func (s *session) stateLocked() clientState {
	return clientState(s.state.Load())
}

// endLocked moves the session toward its end: to state, one of
// stateServerLost, stateShuttingDown and stateClosing, unless it is there
// or further already. s.mu must be held.
func (s *session) endLocked(state clientState) {
	if s.stateLocked() < state {
		s.setState(state)
	}
}

// closingLocked reports whether the session is ending (stateClosing):
// readServer must hand its server connection over. s.mu must be held.
func (s *session) closingLocked() bool {
	return s.stateLocked() >= stateClosing
}

// serve runs the session from its first byte until it ends or parks
// (park.go). A panic is logged with its stack and ends only this session.
func (s *session) serve() {
	s.bufRef = clientBufferPool.Get().(*[]byte)
	parked := false
	defer func() { s.endUnlessParked(recover(), parked) }()
	s.setState(stateStartup)
	err := func() error {
		defer s.pooler.loginSlots.release() // taken by the accept loop (admission.go)
		return s.login()
	}()
	if cancel, ok := err.(*cancelRequest); ok {
		s.pooler.cancelRequest(s.tcp.RemoteAddr(), cancel.processID, cancel.secret)
		return
	}
	if err != nil {
		return
	}
	if s.console {
		err = s.serveConsole()
	} else {
		err = s.relay()
	}
	if parked = err == errParked; !parked {
		s.relayEnded(err)
	}
}

// resume goes on with the relay loop of a session that was parked, on a
// goroutine of its own, after its socket turned readable or was closed.
// The caller took ownership (moved s.parked from true to false).
func (s *session) resume() {
	parked := false
	defer func() { s.endUnlessParked(recover(), parked) }()
	s.pooler.parker.Load().remove(s) // set, since s parked
	s.takeScanner()
	err := s.relayLoop(nil, 0)
	if parked = err == errParked; !parked {
		s.relayEnded(err)
	}
}

// relayEnded tells the client why its relay loop returned err, if it did
// not end normally.
func (s *session) relayEnded(err error) {
	s.mu.Lock()
	s.endLocked(stateClosing) // from here on nothing links or releases; finish cleans up
	s.mu.Unlock()
	if !isNormalClose(err) {
		var ce *clientError
		if errors.As(err, &ce) {
			s.sendError(ce.severity, ce.code, ce.message)
		}
		s.pooler.log.Info("client session ended with an error", s.logFields(zap.Error(err))...)
	}
}

// endUnlessParked is the deferred end of serve and resume: unless the
// session parked (another goroutine owns it now), it logs a panic the
// goroutine recovered from (r), and ends the session: its server
// connection is handed back, its buffer returned, and it leaves the
// pooler's books.
func (s *session) endUnlessParked(r any, parked bool) {
	if r != nil {
		s.pooler.log.Error("panic in client session", zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
		s.sendError(wire.SeverityFatal, sqlstateInternalError, "internal error in pgtender")
	} else if parked {
		return
	}
	s.finish()
	s.setState(stateClosed)
	s.returnScanner()
	if s.bufRef != nil {
		clientBufferPool.Put(s.bufRef)
		s.bufRef = nil
	}
	p := s.pooler
	p.clientCount.Add(-1)
	p.unregisterSession(s)
	p.wg.Done() // the session's, added by the accept loop
}

func (s *session) logFields(extra ...zap.Field) []zap.Field {
	return append([]zap.Field{
		zap.Uint32("client_id", s.processID),
		zap.String("remote", s.tcp.RemoteAddr().String()),
		zap.String("user", s.user),
		zap.String("database", s.database),
	}, extra...)
}

// login runs the startup and authentication exchange and leaves the client
// ready for queries. It reports the login to the recorder whatever happens.
func (s *session) login() error {
	p := s.pooler
	state := p.state.Load()
	general := state.cfg.General
	var deadline time.Time
	if general.ClientLoginTimeout > 0 {
		deadline = time.Now().Add(general.ClientLoginTimeout.Duration())
		_ = s.conn.SetDeadline(deadline)
	}
	s.loginIn = loginReader{s, s.conn}
	s.reader = wire.NewReader(&s.loginIn, *s.bufRef, maxAuthMessageLen)
	defer s.clientWaitEnd() // a login that ended waits on nobody

	// A connection that closes before sending a byte (a TCP health check)
	// is not a login.
	if err := s.reader.Fill(1); err != nil {
		if s.endedStalled.Load() {
			p.recorder.LoginStarted()
			return s.loginEndedStalled(LoginTimings{}, StageStartup)
		}
		return err
	}
	start := time.Now()
	p.recorder.LoginStarted()
	var timings LoginTimings
	stage := StageStartup
	err := s.loginPhases(state, deadline, &timings, &stage, start)
	if _, ok := err.(*cancelRequest); ok {
		p.recorder.LoginCancelRequest()
		return err
	}
	if handshake, ok := errors.AsType[*tlsHandshakeError](err); ok {
		// No error message can be sent: the client expects TLS records,
		// and there is no TLS session to send one in.
		if s.endedStalled.Load() && isTimeout(handshake.err) {
			p.recorder.LoginFinished(LoginShed, timings)
			s.logEndedStalled(stage)
		} else if isNormalClose(handshake.err) || isTimeout(handshake.err) {
			p.recorder.LoginAbandoned(stage)
		} else {
			p.recorder.LoginFinished(LoginError, timings)
		}
		p.log.Info("TLS handshake failed", s.logFields(zap.Error(handshake.err))...)
		return err
	}
	if err == nil {
		timings.Total = time.Since(start)
		p.recorder.LoginFinished(LoginOK, timings)
		if s.pool != nil {
			s.pool.stats.logins.Add(1)
		}
		_ = s.conn.SetDeadline(time.Time{})
		s.loggedIn.Store(true)
		s.setState(stateIdle)
		if general.LogConnections {
			p.log.Info("client logged in", s.logFields(zap.Duration("login_duration", timings.Total))...)
		}
		return nil
	}
	var ce *clientError
	if errors.As(err, &ce) {
		s.sendError(ce.severity, ce.code, ce.message)
		timings.Total = time.Since(start)
		p.recorder.LoginFinished(loginResultOf(ce), timings)
		p.log.Info("login refused", s.logFields(zap.String("sqlstate", ce.code), zap.String("stage", string(stage)), zap.Error(ce))...)
		return err
	}
	if s.endedStalled.Load() && isTimeout(err) {
		timings.Total = time.Since(start)
		return s.loginEndedStalled(timings, stage)
	}
	// The client went away or ran out of client_login_timeout.
	p.recorder.LoginAbandoned(stage)
	if isTimeout(err) {
		s.sendError(wire.SeverityFatal, sqlstateProtocolViolation, "client_login_timeout expired during login")
		p.log.Info("login timed out", s.logFields(zap.String("stage", string(stage)))...)
	}
	return err
}

// slowReadyStage is how long the ready stage may take before pgtender
// checks that the client is still there.
const slowReadyStage = time.Millisecond

// errClientLeft ends a login whose client went away while it waited.
var errClientLeft = errors.New("client left during login")

// cancelRequest is what login returns for a connection that carried a
// CancelRequest: serve forwards it once the login slot is given back, so
// that a cancel waiting on Postgres never holds one.
type cancelRequest struct {
	processID uint32
	secret    []byte // a copy: the startup packet's buffer is reused
}

func (*cancelRequest) Error() string { return "the connection carried a cancel request" }

func loginResultOf(ce *clientError) LoginResult {
	if ce.result != "" {
		return ce.result
	}
	switch ce.code {
	case sqlstateInvalidPassword, sqlstateInvalidAuthorization:
		return LoginAuthFailed
	case sqlstateProtocolViolation, sqlstateConnectionFailure, sqlstateInternalError:
		return LoginError
	}
	return LoginRejected
}

func (s *session) loginPhases(state *runtimeState, deadline time.Time, timings *LoginTimings, stage *LoginStage, start time.Time) error {
	p := s.pooler
	general := state.cfg.General
	var startup wire.Startup
	for {
		var err error
		startup, err = wire.ReadStartup(s.reader, nil)
		if err != nil {
			// A packet cut short by the client hanging up is an abandoned
			// login, not a malformed one.
			if errors.Is(err, wire.ErrMalformedStartup) && !errors.Is(err, io.ErrUnexpectedEOF) {
				return fatalError(sqlstateProtocolViolation, "invalid startup packet", err)
			}
			return err
		}
		switch startup.Kind {
		case wire.SSLRequest:
			if err := s.answerSSLRequest(state); err != nil {
				return err
			}
			continue
		case wire.GSSEncRequest:
			// GSS encryption is not offered: the client goes on without
			// it or gives up.
			if err := s.write([]byte{'N'}); err != nil {
				return err
			}
			continue
		case wire.CancelRequest:
			return &cancelRequest{processID: startup.CancelProcessID, secret: bytes.Clone(startup.CancelSecret)}
		}
		break
	}
	if general.TLSClientRequired && !s.encrypted {
		return sslRequired("tls_client_required is on")
	}
	if startup.ProtocolMajor != 3 {
		return fatalError(sqlstateFeatureNotSupported,
			fmt.Sprintf("unsupported frontend protocol %d.%d: pgtender supports 3.0", startup.ProtocolMajor, startup.ProtocolMinor), nil)
	}
	var unrecognized []string
	for _, param := range startup.Parameters {
		if len(param.Name) > 5 && param.Name[:5] == "_pq_." {
			unrecognized = append(unrecognized, param.Name)
		}
	}
	if startup.ProtocolMinor > 0 || len(unrecognized) > 0 {
		// Protocol 3.2 (or options) asked for: say we speak 3.0 and go on.
		if err := s.write(wire.AppendNegotiateProtocolVersion(nil, 0, unrecognized)); err != nil {
			return err
		}
	}
	user, _ := startup.Parameter("user")
	if user == "" {
		return fatalError(sqlstateInvalidAuthorization, "no PostgreSQL user name specified in startup packet", nil)
	}
	database, ok := startup.Parameter("database")
	if !ok || database == "" {
		database = user
	}
	s.user, s.database = user, database
	if replication, ok := startup.Parameter("replication"); ok && replication != "false" && replication != "0" && replication != "off" {
		return fatalError(sqlstateFeatureNotSupported, "replication connections are not supported by pgtender", nil)
	}
	if max := general.MaxClientConnections; max > 0 && p.clientCount.Load() > int64(max) {
		return fatalError(sqlstateTooManyConnections, "too many client connections (max_client_connections)", nil)
	}
	if isConsoleDatabase(state.cfg, database) {
		return s.consoleLogin(state, timings, stage, start)
	}
	if _, ok := state.cfg.Database(database); !ok {
		return fatalError(sqlstateInvalidCatalogName, fmt.Sprintf("database %q does not exist", database), nil)
	}
	if p.databaseDisabled(database) {
		return fatalError(sqlstateObjectNotInPrerequisiteState,
			fmt.Sprintf("database %q does not allow connections: disabled on pgtender's admin console (ENABLE)", database), nil)
	}
	requested, refused := startupSettingsOf(&startup)
	if refused != nil {
		return refused
	}
	timings.Startup = time.Since(start)
	p.loginSlots.progress()
	s.clientWaitEnd()

	*stage = StageAuth
	s.setState(stateAuth)
	authStart := time.Now()
	if err := s.authenticate(state, deadline); err != nil {
		return err
	}
	timings.Auth = time.Since(authStart)
	p.loginSlots.progress()
	s.clientWaitEnd()

	*stage = StageReady
	s.setState(stateReady)
	readyStart := time.Now()
	pool, ok := p.poolFor(user, database)
	if !ok {
		return fatalError(sqlstateInvalidCatalogName, fmt.Sprintf("database %q does not exist", database), nil)
	}
	s.pool = pool
	s.mu.Lock()
	s.mode = pool.settings.Load().mode
	s.renaming = pool.settings.Load().preparedStatements
	s.maxMessageLen = general.MaxMessageSize
	s.mu.Unlock()
	params, err := s.poolParameters(pool, requested, deadline)
	// A cold pool makes the client wait for the first server connection;
	// a client that gave up meanwhile is an abandoned login, not a
	// completed or refused one. One peek at its socket tells.
	if time.Since(readyStart) > slowReadyStage && peekConn(s.tcp) == peekClosed {
		return errClientLeft
	}
	if err != nil {
		if _, refused := errors.AsType[*serverError](err); refused {
			return s.startupSettingsError(err)
		}
		return s.checkoutError(err)
	}
	s.mu.Lock()
	s.settings = s.startupSettings
	s.mu.Unlock()
	// The client is told its own values of the reported parameters it set,
	// as Postgres would tell it.
	replyRef := loginReplies.Get().(*[]byte)
	defer loginReplies.Put(replyRef)
	reply := wire.AppendAuthenticationOk((*replyRef)[:0])
	for _, param := range params {
		value := param.value
		if own, ok := s.startupSettings[param.key]; ok && reportedParameter(param.name) != "" {
			value = own.value
		}
		reply = wire.AppendParameterStatus(reply, param.name, value)
	}
	reply = wire.AppendBackendKeyData(reply, s.processID, s.secret)
	reply = wire.AppendReadyForQuery(reply, wire.TxIdle)
	*replyRef = reply // grown, if it had to, for the next login
	return s.sendWelcome(reply, timings, readyStart)
}

// sendWelcome ends a login: it sends reply (AuthenticationOk to
// ReadyForQuery) unless a drain began meanwhile, and times the ready phase.
func (s *session) sendWelcome(reply []byte, timings *LoginTimings, readyStart time.Time) error {
	if s.pooler.draining.Load() {
		return fatalError(sqlstateAdminShutdown, "pgtender is shutting down", nil)
	}
	if err := s.write(reply); err != nil {
		return err
	}
	timings.Ready = time.Since(readyStart)
	return nil
}

// loginReplies holds the buffers login replies are built in (AuthenticationOk
// to ReadyForQuery, with every ParameterStatus), each owned by one login
// from Get until its reply is written: not kept by the session, since an
// idle session should cost little, nor made anew at every login.
var loginReplies = sync.Pool{New: func() any {
	b := make([]byte, 0, 1024)
	return &b
}}

// authenticate checks the client's password: against Postgres itself under
// passthrough, else against users.toml.
func (s *session) authenticate(state *runtimeState, deadline time.Time) error {
	general := state.cfg.General
	if general.PassthroughAuth.Enabled() {
		if general.PassthroughAuth.RequiresTLS() && !s.encrypted {
			// Refused before the password is asked for, so that it never
			// crosses the network in cleartext.
			return sslRequired(fmt.Sprintf("passthrough_auth %q takes passwords only over TLS", general.PassthroughAuth))
		}
		password, err := auth.ReadCleartextPassword(authConn{s})
		if err != nil {
			return s.authExchangeError(err)
		}
		key := auth.Key{User: s.user, Database: s.database}
		login := auth.Login{Key: key, Password: password, ClientAddr: remoteIP(s.tcp.RemoteAddr())}
		// A password verified before needs no wait, so no context bounds it.
		done, err := s.pooler.registry.AuthenticateCached(context.Background(), login, s.pooler.verify)
		if !done {
			ctx := context.Background()
			if !deadline.IsZero() {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, deadline)
				defer cancel()
			}
			err = s.awaitPassthroughVerification(ctx, login)
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, auth.ErrPasswordMismatch):
			// The cause says whether Postgres was asked, or the refusal came
			// from the negative cache or a failure limit (ErrCachedRejection,
			// ErrThrottled): it goes to the "login refused" line, which the
			// logger samples under a storm. It never holds the password.
			return s.passwordFailed(err)
		default:
			if down, ok := errors.AsType[*serverDownError](err); ok {
				return fatalError(down.code, serverDownMessage(down.code, poolKey{user: s.user, database: s.database}), err)
			}
			return fatalError(sqlstateConnectionFailure, "could not verify the password with the database server", err)
		}
	}
	if _, ok := state.cfg.User(s.user, s.database); !ok {
		return s.passwordFailed(errors.New("user not in users.toml"))
	}
	creds := state.credentials[auth.Key{User: s.user, Database: s.database}]
	if creds == nil && general.AuthType != config.AuthTrust {
		return s.passwordFailed(errors.New("user has no password in users.toml"))
	}
	if err := auth.AuthenticateClient(authConn{s}, general.AuthType, creds); err != nil {
		if errors.Is(err, auth.ErrPasswordMismatch) {
			return s.passwordFailed(nil)
		}
		return s.authExchangeError(err)
	}
	return nil
}

// passwordFailed is the 28P01 a client gets for a wrong password (or an
// unknown user, which it must not be able to tell apart); cause is for the
// log. Built only on failure: a login that succeeds formats nothing.
func (s *session) passwordFailed(cause error) *clientError {
	return fatalError(sqlstateInvalidPassword, fmt.Sprintf("password authentication failed for user %q", s.user), cause)
}

// awaitPassthroughVerification checks a passthrough password with the
// registry, which may ask Postgres (through Pooler.verifyPassthrough). The
// wait is marked as a wait on Postgres for admission control
// (loginSlots.serverWaits), panics included.
func (s *session) awaitPassthroughVerification(ctx context.Context, login auth.Login) error {
	s.pooler.loginSlots.serverWaitBegin()
	defer s.pooler.loginSlots.serverWaitEnd()
	s.clientWaitEnd() // waiting on Postgres now, not on the client
	return s.pooler.registry.Authenticate(ctx, login, s.pooler.verify)
}

// poolParameters waits for the pool's server parameters (a cold pool's
// first server connection) and checks the settings the client's startup
// packet asked for (checkStartupSettings), which become its
// startupSettings; marked as a wait on Postgres like
// awaitPassthroughVerification. A warm pool, with the parameters known and
// the same settings seen before, needs no wait, and no context bounding
// one is made: most logins of a fleet.
func (s *session) poolParameters(pool *Pool, requested sessionSettings, deadline time.Time) ([]serverParameter, error) {
	if params := pool.params.Load(); params != nil {
		if len(requested) == 0 {
			return *params, nil
		}
		if shared := pool.sharedSettings.find(requested, &pool.validSettings); shared != nil {
			s.startupSettings = shared
			return *params, nil
		}
	}
	ctx, cancel := s.checkoutContext(deadline)
	defer cancel()
	s.pooler.loginSlots.serverWaitBegin()
	defer s.pooler.loginSlots.serverWaitEnd()
	s.clientWaitEnd() // waiting on Postgres now, not on the client
	params, err := pool.parameters(ctx)
	if err != nil || len(requested) == 0 {
		return params, err
	}
	s.startupSettings, err = pool.checkStartupSettings(ctx, requested)
	return params, err
}

func (s *session) authExchangeError(err error) error {
	if errors.Is(err, auth.ErrProtocol) || errors.Is(err, wire.ErrBadMessageLength) {
		return fatalError(sqlstateProtocolViolation, "invalid authentication message", err)
	}
	if isNormalClose(err) || isTimeout(err) {
		return err
	}
	return s.passwordFailed(err)
}

// checkoutContext bounds a wait for a server connection by checkout_timeout
// and, during login, by the login deadline.
func (s *session) checkoutContext(deadline time.Time) (context.Context, context.CancelFunc) {
	timeout := s.pool.settings.Load().checkoutTimeout
	ctx := s.pooler.ctx
	if timeout > 0 {
		d := time.Now().Add(timeout)
		if deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
	}
	if deadline.IsZero() {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, deadline)
}

// checkoutError turns a failed Acquire into what the client sees.
func (s *session) checkoutError(err error) *clientError {
	if err == errCanceledWhileWaiting {
		// What Postgres says of a statement canceled at the client's
		// request.
		return &clientError{severity: wire.SeverityError, code: sqlstateQueryCanceled,
			message: "canceling statement due to user request", err: err}
	}
	if down, ok := errors.AsType[*serverDownError](err); ok {
		return &clientError{severity: wire.SeverityError, code: down.code, message: serverDownMessage(down.code, s.pool.key), err: err}
	}
	if !errors.Is(err, ErrCheckoutTimeout) {
		// This checkout's own connect found the server down: no answer
		// within connect_timeout, a refused or reset connection (08006),
		// or Postgres not accepting connections now (57P03). A connect
		// timeout is not a checkout timeout, whose 53300 would send the
		// operator to the pool's size.
		if outcome, code := classifyConnect(err, false); outcome == connectUnreachable {
			return &clientError{severity: wire.SeverityError, code: code, message: serverDownMessage(code, s.pool.key), err: err}
		}
	}
	switch {
	case errors.Is(err, ErrCheckoutTimeout), errors.Is(err, context.DeadlineExceeded):
		return &clientError{severity: wire.SeverityError, code: sqlstateTooManyConnections,
			message: fmt.Sprintf("no server connection available in pool %s within checkout_timeout", s.pool.key), err: err}
	case errors.Is(err, ErrPoolClosed), errors.Is(err, context.Canceled):
		return &clientError{severity: wire.SeverityError, code: sqlstateCannotConnectNow,
			message: fmt.Sprintf("pool %s is closed", s.pool.key), err: err}
	case errors.Is(err, auth.ErrRejected):
		return &clientError{severity: wire.SeverityError, code: sqlstateInvalidPassword,
			message: fmt.Sprintf("the database server refused the credentials of pool %s", s.pool.key), err: err}
	}
	return &clientError{severity: wire.SeverityError, code: sqlstateConnectionFailure,
		message: fmt.Sprintf("could not connect to the database server for pool %s", s.pool.key), err: err}
}

// write sends b to the client as one write. After login, a write the
// client takes nothing of within client_write_timeout fails
// (boundWriteLocked); during login, the login deadline bounds it.
func (s *session) write(b []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.loggedIn.Load() {
		s.boundWriteLocked(time.Now())
	}
	var n int
	var err error
	if s.out != nil {
		n, err = s.out.write(b)
	} else {
		n, err = s.conn.Write(b)
	}
	s.bytesSent.Add(int64(n))
	if err != nil && isTimeout(err) && !s.writeTimedOut {
		s.writeTimedOut = true
		s.pooler.clientTimeouts.write.Add(1)
		s.pooler.log.Warn("client took none of pgtender's output within client_write_timeout; disconnecting it",
			s.logFields(zap.Int("unwritten_bytes", len(b)-n))...)
	}
	return err
}

// boundWriteLocked gives the client's writes a deadline at least
// client_write_timeout away. Setting a deadline re-arms a runtime timer,
// which the relay would otherwise pay at every write, so it is renewed
// only once less than the timeout is left, to one and a half timeouts from
// now: a write the client takes nothing of fails after between one and one
// and a half timeouts. A slow client is not cut: the relay's writes are
// small (one server read), and each finishes as soon as the client has
// read enough to make room for it. wmu must be held.
func (s *session) boundWriteLocked(now time.Time) {
	timeout := s.pooler.state.Load().cfg.General.ClientWriteTimeout.Duration()
	if timeout <= 0 {
		if !s.writeDeadline.IsZero() { // turned off by a reload
			s.writeDeadline = time.Time{}
			_ = s.conn.SetWriteDeadline(s.writeDeadline)
		}
		return
	}
	if s.writeDeadline.Sub(now) >= timeout {
		return
	}
	s.writeDeadline = now.Add(timeout + timeout/2)
	_ = s.conn.SetWriteDeadline(s.writeDeadline)
}

// sendError writes an ErrorResponse; failures are ignored because the
// connection is usually being closed anyway.
func (s *session) sendError(severity, code, message string) {
	b := wire.AppendErrorResponse(nil, severity, code, message)
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.sendErrorLocked(b)
}

// sendErrorLocked writes the ErrorResponse b within a second. The
// deadline is set under wmu, so it cannot cut short a write of
// readServer's that is in progress. wmu must be held.
func (s *session) sendErrorLocked(b []byte) {
	_ = s.conn.SetWriteDeadline(time.Now().Add(time.Second))
	n, _ := s.conn.Write(b)
	s.bytesSent.Add(int64(n))
	s.writeDeadline = time.Time{} // the next write sets its own
	_ = s.conn.SetWriteDeadline(s.writeDeadline)
}

// closeSocket closes the client's socket, from any goroutine: the serve
// goroutine's reads and writes fail at once, and the session ends. A TLS
// client is not sent close_notify; finish, on the serve goroutine, closes
// conn itself. A parked session has no goroutine to see its reads fail:
// one is started to end it (closing the descriptor took it off the
// parker's set without an event).
func (s *session) closeSocket() {
	_ = s.tcp.Close()
	s.unpark()
}

// authConn adapts a session to auth.ClientConn.
type authConn struct{ s *session }

func (a authConn) Send(msg pgproto3.BackendMessage) error {
	b, err := msg.Encode(nil)
	if err != nil {
		return err
	}
	return a.s.write(b)
}

func (a authConn) Receive() (byte, []byte, error) {
	typ, body, err := a.s.reader.ReadMessage()
	if err == nil {
		a.s.bytesReceived.Add(int64(len(body) + wire.HeaderLen))
	}
	return typ, body, err
}

// remoteIP is the IP of a TCP peer, for the per-address limit on failed
// passthrough verifications; the zero Addr for anything else (Unix sockets).
func remoteIP(addr net.Addr) netip.Addr {
	if tcp, ok := addr.(*net.TCPAddr); ok {
		return tcp.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
