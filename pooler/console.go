package pooler

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/pgtender/pgtender/auth"
	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/pooler/admin"
	"github.com/pgtender/pgtender/pooler/wire"
)

// The admin console is a virtual database, [admin] name (or "pgbouncer",
// the name PgBouncer's console has and exporters default to), that
// answers PgBouncer's console commands (SHOW POOLS, RELOAD, ...) instead
// of relaying to Postgres. pooler/admin parses the commands and frames
// the results; this file logs the operator in and runs the commands
// against the pooler. docs/admin.md is the user's description.

// consoleAlias is the console's second name: PgBouncer's, which exporters
// and scripts written for PgBouncer connect to by default.
const consoleAlias = "pgbouncer"

// maxConsoleMessageLen bounds a console message: its queries are a few
// words, so a longer one is not an operator's.
const maxConsoleMessageLen = 64 << 10

// ConsoleHooks are what console commands need from outside the pooler,
// set by the program that runs it (SetConsoleHooks); a nil hook makes its
// command answer 0A000.
type ConsoleHooks struct {
	// Version is what SHOW VERSION prints.
	Version string
	// Reload builds the configuration from the files and applies it, as
	// SIGHUP does, and returns why it could not (RELOAD).
	Reload func() error
	// Shutdown begins the drain SIGTERM begins (SHUTDOWN, SHUTDOWN
	// WAIT_FOR_SERVERS) or, with waitForClients, the shutdown of SHUTDOWN
	// WAIT_FOR_CLIENTS, after the console has stopped accepting
	// (StopAccepting): the process ends once ClientCount is 0. It must not
	// wait for either.
	Shutdown func(waitForClients bool)
	// Logins returns pgtender's login figures (SHOW LOGINS) that the
	// pooler does not keep itself: the login recorder's and the kernel's.
	Logins func() []LoginFigure
}

// LoginFigure is one row of SHOW LOGINS.
type LoginFigure struct {
	Name  string
	Value int64
}

// SetConsoleHooks sets the console's hooks; safe at any time (a console
// command reads them when it runs).
func (p *Pooler) SetConsoleHooks(hooks ConsoleHooks) { p.consoleHooks.Store(&hooks) }

// isConsoleDatabase reports whether a client asking for database reaches
// the console: [admin] name, or "pgbouncer" unless a configured database
// has that name (config rejects one named like [admin] name).
func isConsoleDatabase(cfg *config.Config, database string) bool {
	if database == cfg.Admin.Name {
		return true
	}
	if database != consoleAlias {
		return false
	}
	_, configured := cfg.Database(database)
	return !configured
}

// consoleAuthMethod is how the console checks the [admin] password: as
// auth_type says, except that trust and passthrough do not apply to it
// (the console always takes a password, checked against [admin]), where
// SCRAM is used, or what the password's form allows.
func consoleAuthMethod(general config.General, creds *auth.Credentials) config.AuthType {
	method := general.AuthType
	if method == config.AuthTrust || general.PassthroughAuth.Enabled() {
		method = config.AuthSCRAM
	}
	if creds.Supports(method) == nil {
		return method
	}
	for _, m := range []config.AuthType{config.AuthSCRAM, config.AuthMD5, config.AuthPlain} {
		if creds.Supports(m) == nil {
			return m
		}
	}
	return method // none serves it; AuthenticateClient says so
}

// consoleLogin authenticates an operator to the console and sends the
// console's welcome. A wrong user is told only after the password
// exchange, as a wrong password is, so that the console's user name
// cannot be probed.
func (s *session) consoleLogin(state *runtimeState, timings *LoginTimings, stage *LoginStage, start time.Time) error {
	p := s.pooler
	if state.adminCredentials == nil {
		return fatalError(sqlstateInvalidAuthorization, "the admin console is closed ([admin] password is not set)", nil)
	}
	timings.Startup = time.Since(start)
	p.loginSlots.progress()
	s.clientWaitEnd()

	*stage = StageAuth
	s.setState(stateAuth)
	authStart := time.Now()
	creds := state.adminCredentials
	if err := auth.AuthenticateClient(authConn{s}, consoleAuthMethod(state.cfg.General, creds), creds); err != nil {
		if errors.Is(err, auth.ErrPasswordMismatch) {
			return s.passwordFailed(errors.New("wrong admin console password"))
		}
		return s.authExchangeError(err)
	}
	if s.user != state.cfg.Admin.User {
		return s.passwordFailed(errors.New("not the admin console's user ([admin] user)"))
	}
	timings.Auth = time.Since(authStart)
	p.loginSlots.progress()
	s.clientWaitEnd()

	*stage = StageReady
	s.setState(stateReady)
	readyStart := time.Now()
	s.console = true
	reply := wire.AppendAuthenticationOk(nil)
	for _, param := range consoleParameters(p) {
		reply = wire.AppendParameterStatus(reply, param[0], param[1])
	}
	reply = wire.AppendBackendKeyData(reply, s.processID, s.secret)
	reply = wire.AppendReadyForQuery(reply, wire.TxIdle)
	if err := s.sendWelcome(reply, timings, readyStart); err != nil {
		return err
	}
	p.log.Info("admin console login", s.logFields()...)
	return nil
}

// consoleParameters are the ParameterStatus values the console sends at
// login, PgBouncer's (src/admin.c, admin_setup: its server_version is
// "<version>/bouncer"), so that drivers which read server_version or
// client_encoding start cleanly.
func consoleParameters(p *Pooler) [][2]string {
	version := "pgtender"
	if hooks := p.consoleHooks.Load(); hooks != nil && hooks.Version != "" {
		version = hooks.Version + "/pgtender"
	}
	return [][2]string{
		{"server_version", version},
		{"client_encoding", "UTF8"},
		{"server_encoding", "UTF8"},
		{"DateStyle", "ISO"},
		{"TimeZone", "GMT"},
		{"standard_conforming_strings", "on"},
		{"is_superuser", "on"},
	}
}

// errConsoleTerminate ends a console session whose client sent Terminate.
var errConsoleTerminate = io.EOF

// serveConsole runs a logged-in console session: simple queries, each
// answered in full with ReadyForQuery. Extended-protocol messages get one
// error and are skipped to their Sync, which is answered with
// ReadyForQuery, so a driver that tries them is told, not hung (PgBouncer
// closes the connection instead). Whatever else the client sends ends
// the session with 08P01.
func (s *session) serveConsole() error {
	// What the client sent after its login's last message (a query
	// pipelined behind its password) is the console's first input.
	pending := bytes.Clone(s.reader.Buffered())
	s.reader = nil
	reader := wire.NewReader(io.MultiReader(bytes.NewReader(pending), s.conn), *s.bufRef, maxConsoleMessageLen)
	skipping := false // an extended-protocol batch is being skipped to its Sync
	for {
		typ, body, err := reader.ReadMessage()
		if err != nil {
			if errors.Is(err, wire.ErrBadMessageLength) {
				s.pooler.protocolErrors.tooLarge.Add(1)
				return fatalError(sqlstateProtocolViolation, "message too long for the admin console", err)
			}
			return err
		}
		s.bytesReceived.Add(int64(len(body) + wire.HeaderLen))
		var out []byte
		switch typ {
		case 'Q':
			query, ok := strings.CutSuffix(string(body), "\x00")
			if !ok || strings.IndexByte(query, 0) >= 0 {
				s.pooler.protocolErrors.malformed.Add(1)
				return fatalError(sqlstateProtocolViolation, "malformed Query message", nil)
			}
			out = s.runConsoleQuery(query, nil)
			out = wire.AppendReadyForQuery(out, wire.TxIdle)
		case 'X':
			return errConsoleTerminate
		case 'P', 'B', 'D', 'E', 'C', 'H':
			if !skipping {
				skipping = true
				out = wire.AppendErrorResponse(nil, wire.SeverityError, sqlstateFeatureNotSupported,
					"the admin console takes only the simple query protocol (simple protocol in pgx, or psql)")
			}
		case 'S':
			skipping = false
			out = wire.AppendReadyForQuery(nil, wire.TxIdle)
		default:
			s.pooler.protocolErrors.unknownType.Add(1)
			return fatalError(sqlstateProtocolViolation, fmt.Sprintf("unexpected message type %q on the admin console", typ), nil)
		}
		if len(out) > 0 {
			if err := s.write(out); err != nil {
				return err
			}
		}
	}
}

// databaseConfigured reports whether the running configuration has a
// [[databases]] entry named name, for the commands that take one.
func (p *Pooler) databaseConfigured(name string) bool {
	_, ok := p.state.Load().cfg.Database(name)
	return ok
}

// noSuchDatabase is the console's answer to a command naming a database
// that is not configured.
func noSuchDatabase(dst []byte, name string) []byte {
	return consoleError(dst, sqlstateUndefinedObject, "no such database: "+name)
}

// consoleError appends an ErrorResponse of severity ERROR: the console
// session goes on.
func consoleError(dst []byte, code, message string) []byte {
	return wire.AppendErrorResponse(dst, wire.SeverityError, code, message)
}

// runConsoleQuery runs one console query and appends its reply, without
// ReadyForQuery.
func (s *session) runConsoleQuery(query string, dst []byte) []byte {
	cmd, err := admin.ParseCommand(query)
	if err != nil {
		return consoleError(dst, sqlstateSyntaxError, err.Error())
	}
	p := s.pooler
	switch cmd.Verb {
	case "":
		return wire.AppendEmptyQueryResponse(dst)
	case "SHOW":
		return p.consoleShow(dst, cmd.Arg)
	case "SELECT":
		// PgBouncer reads SELECT x as SHOW x (admin.c), for the drivers
		// that ask for a setting so.
		return p.consoleShow(dst, strings.ToLower(cmd.Arg))
	case "RELOAD", "SHUTDOWN", "KILL_CLIENT", "DISABLE", "ENABLE", "RECONNECT", "PAUSE", "RESUME":
		p.log.Info("admin console command", s.logFields(zap.String("command", strings.TrimSpace(query)))...)
	}
	hooks := p.consoleHooks.Load()
	switch cmd.Verb {
	case "RELOAD":
		if cmd.Arg != "" {
			return consoleError(dst, sqlstateSyntaxError, "RELOAD takes no argument")
		}
		if hooks == nil || hooks.Reload == nil {
			return consoleError(dst, sqlstateFeatureNotSupported, "RELOAD is not available: pgtender was started without its configuration files")
		}
		if err := hooks.Reload(); err != nil {
			return consoleError(dst, sqlstateConfigFileError, "reload failed; the running configuration is unchanged: "+err.Error())
		}
		return wire.AppendCommandComplete(dst, "RELOAD")
	case "SHUTDOWN":
		var waitForClients bool
		switch strings.ToUpper(cmd.Arg) {
		case "", "WAIT_FOR_SERVERS":
		case "WAIT_FOR_CLIENTS":
			waitForClients = true
		default:
			return consoleError(dst, sqlstateSyntaxError, "SHUTDOWN takes WAIT_FOR_SERVERS, WAIT_FOR_CLIENTS or nothing")
		}
		if hooks == nil || hooks.Shutdown == nil {
			return consoleError(dst, sqlstateFeatureNotSupported, "SHUTDOWN is not available in this process")
		}
		if waitForClients {
			// As PgBouncer's: no new connections from now on, and the
			// clients logged in (this one too) are served until they leave.
			p.StopAccepting()
		}
		hooks.Shutdown(waitForClients)
		return wire.AppendCommandComplete(dst, "SHUTDOWN")
	case "KILL_CLIENT":
		return s.killClient(dst, cmd.Arg)
	case "DISABLE", "ENABLE":
		if cmd.Arg == "" {
			return consoleError(dst, sqlstateSyntaxError, cmd.Verb+" takes a database name")
		}
		if !p.databaseConfigured(cmd.Arg) {
			return noSuchDatabase(dst, cmd.Arg)
		}
		p.setDatabaseDisabled(cmd.Arg, cmd.Verb == "DISABLE")
		return wire.AppendCommandComplete(dst, cmd.Verb)
	case "RECONNECT":
		if cmd.Arg != "" && !p.databaseConfigured(cmd.Arg) {
			return noSuchDatabase(dst, cmd.Arg)
		}
		pools, closed := p.reconnectPools(cmd.Arg)
		p.log.Info("RECONNECT: server connections are replaced as they come back", zap.String("database", cmd.Arg),
			zap.Int("pools", pools), zap.Int("idle_closed", closed))
		return wire.AppendCommandComplete(dst, "RECONNECT")
	case "PAUSE":
		return s.pause(dst, cmd.Arg)
	case "RESUME":
		if cmd.Arg != "" && !p.databaseConfigured(cmd.Arg) {
			return noSuchDatabase(dst, cmd.Arg)
		}
		if err := p.resumeDatabases(cmd.Arg); err != nil {
			return consoleError(dst, sqlstateObjectNotInPrerequisiteState, err.Error())
		}
		return wire.AppendCommandComplete(dst, "RESUME")
	case "KILL", "SUSPEND", "WAIT_CLOSE", "SET":
		return consoleError(dst, sqlstateFeatureNotSupported, cmd.Verb+" is not supported by pgtender's admin console yet (docs/admin.md)")
	}
	return consoleError(dst, sqlstateSyntaxError, (&admin.SyntaxError{Query: query}).Error())
}

// pause runs PAUSE [db]: it pauses the pools (Pooler.pauseDatabases) and
// answers once their transactions in flight have ended and their server
// connections are closed, as PgBouncer's PAUSE does. While it waits, a
// CancelRequest from the console's client (psql's ^C) ends the wait and
// resumes what it paused, as PgBouncer's admin_handle_cancel does; a
// client that leaves leaves the pause on (RESUME from another session
// ends it), and so does shutdown, which drains regardless.
func (s *session) pause(dst []byte, database string) []byte {
	p := s.pooler
	if database != "" && !p.databaseConfigured(database) {
		return noSuchDatabase(dst, database)
	}
	if p.draining.Load() {
		return consoleError(dst, sqlstateObjectNotInPrerequisiteState, "pgtender is shutting down")
	}
	if err := p.pauseDatabases(database); err != nil {
		return consoleError(dst, sqlstateObjectNotInPrerequisiteState, err.Error())
	}
	ctx, stopWatching := s.watchClientWhileWaiting(p.ctx)
	err := p.waitPaused(ctx, database)
	if left := stopWatching(); left != nil {
		err = left
	}
	switch {
	case err == nil:
		p.log.Info("PAUSE: paused; transactions wait for RESUME", zap.String("database", database))
		return wire.AppendCommandComplete(dst, "PAUSE")
	case errors.Is(err, errCanceledWhileWaiting):
		resumeErr := p.resumeDatabases(database)
		p.log.Info("PAUSE canceled by its client: resumed", zap.String("database", database), zap.NamedError("resume_error", resumeErr))
		return wire.AppendErrorResponse(dst, wire.SeverityError, sqlstateQueryCanceled, "PAUSE canceled: resumed")
	case errors.Is(err, errClientLeft):
		p.log.Warn("the console client left while PAUSE waited: the pause stays on until RESUME", zap.String("database", database))
		return dst // nobody to answer
	default:
		return consoleError(dst, sqlstateAdminShutdown, "PAUSE ended: pgtender is shutting down")
	}
}

// killClient ends the client whose id (SHOW CLIENTS) is arg, at once, as
// PgBouncer's KILL_CLIENT does: it gets 57P01, and a server connection it
// held in a transaction is closed rather than returned to the pool.
func (s *session) killClient(dst []byte, arg string) []byte {
	var id uint32
	if _, err := fmt.Sscanf(arg, "%d", &id); err != nil || fmt.Sprint(id) != arg {
		return consoleError(dst, sqlstateSyntaxError, "KILL_CLIENT takes a client id from SHOW CLIENTS")
	}
	p := s.pooler
	p.sessionsMu.Lock()
	target := p.sessions[id]
	p.sessionsMu.Unlock()
	if target == nil || !target.loggedIn.Load() {
		return consoleError(dst, sqlstateUndefinedObject, "client not found")
	}
	if target == s {
		return consoleError(dst, sqlstateObjectInUse, "KILL_CLIENT cannot end the session that runs it")
	}
	target.kill()
	return wire.AppendCommandComplete(dst, "KILL_CLIENT")
}

// errKilled ends a session an operator ended (kill), which has told its
// client already.
var errKilled = errors.New("terminated by an administrator (KILL_CLIENT)")

// kill ends the session for an operator: the client is told 57P01 and its
// socket is closed; a server connection linked in a transaction is
// closed rather than returned (finish), since its transaction is cut.
func (s *session) kill() {
	s.mu.Lock()
	if s.stateLocked() >= stateClosing {
		s.mu.Unlock()
		return
	}
	s.endLocked(stateShuttingDown)
	if sc := s.server; sc != nil && s.readBudget {
		// The serve goroutine reads the reply (readServerInline): woken,
		// it goes back to the client's socket, which the close ends.
		s.wakeReaderLocked(sc)
	}
	s.mu.Unlock()
	s.killed.Store(true)
	notice := wire.AppendErrorResponse(nil, wire.SeverityFatal, sqlstateAdminShutdown, "terminated by an administrator (KILL_CLIENT)")
	s.pooler.wg.Add(1)
	go func() {
		defer s.pooler.wg.Done()
		// A write in progress may hold wmu for up to client_write_timeout:
		// the deadline ends it within a second, and the notice follows.
		_ = s.tcp.SetWriteDeadline(time.Now().Add(time.Second))
		s.wmu.Lock()
		s.sendErrorLocked(notice)
		s.wmu.Unlock()
		s.closeSocket()
	}()
}
