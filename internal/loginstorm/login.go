package loginstorm

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/xdg-go/scram"
)

// Class is how one planned login ended. Every planned login gets exactly one.
type Class string

const (
	ClassOnTime        Class = "ontime"         // ReadyForQuery (and the query) within the deadline
	ClassLate          Class = "late"           // completed, but after the deadline (only with -late-window)
	ClassSkipped       Class = "skipped"        // open loop: not dispatched, -max-outstanding was reached
	ClassConnect       Class = "connect"        // TCP connect refused, reset or timed out
	ClassRefused       Class = "refused"        // ErrorResponse during login (SQLSTATE kept)
	ClassProtocol      Class = "protocol"       // an unexpected message, or the connection broke mid-login
	ClassQuery         Class = "query"          // logged in, but the query failed
	ClassTimeout       Class = "timeout"        // the deadline passed before the login completed
	ClassWrongRefused  Class = "wrong_refused"  // a deliberately wrong password refused on time: expected
	ClassWrongAdmitted Class = "wrong_admitted" // a deliberately wrong password was admitted: a failure
	ClassAbandoned     Class = "abandoned"      // deliberately abandoned (-abandon): not in the gate
)

// failureClasses are the classes that count as failures, in report order.
var failureClasses = []Class{ClassLate, ClassSkipped, ClassConnect, ClassRefused, ClassProtocol, ClassQuery, ClassTimeout, ClassWrongAdmitted}

// Stage is where a login was when it ended.
type Stage string

const (
	StageConnect Stage = "connect"
	StageStartup Stage = "startup"
	StageAuth    Stage = "auth"
	StageReady   Stage = "ready"
	StageQuery   Stage = "query"
	StageDone    Stage = "done"
)

// Reach is how far a login got in its conversation with the server. For a
// login that ended without the server's answer (a timeout, a broken
// connection) it bounds what the server can have counted: one that never
// heard the server may be unknown to it, one that sent its password may
// have been admitted after the client left. Reconcile relies on it.
type Reach string

const (
	ReachNone     Reach = ""         // no connection: not dialed, or the connect was refused
	ReachConnect  Reach = "connect"  // the connect timed out: the handshake may have completed on the server's side
	ReachSent     Reach = "sent"     // connected and sent (part of) the StartupMessage; heard nothing back
	ReachHeard    Reach = "heard"    // read a message from the server; the password not sent
	ReachPassword Reach = "password" // sent the password (the SCRAM proof), no AuthenticationOk yet
	ReachAuthOK   Reach = "auth_ok"  // read AuthenticationOk, not ReadyForQuery
	ReachReady    Reach = "ready"    // read ReadyForQuery
)

// Plan is what one login will do, decided before it starts.
type Plan struct {
	Sequence int64
	Target   Target
	Password string
	Wrong    bool
	Abandon  AbandonStage
}

// Outcome is the result of one planned login.
type Outcome struct {
	Sequence int64
	Class    Class
	Stage    Stage
	SQLState string // for ClassRefused, ClassQuery and ClassWrongRefused
	Message  string // the first error seen, for the report's examples
	// Latency runs from the start of the connect to the end of the login
	// (the query, or ReadyForQuery), or, for a refusal, to the moment its
	// ErrorResponse was read.
	Latency time.Duration
	// Connect is how long the TCP connect took, of Latency: the time the
	// server's kernel kept the client waiting (a SYN dropped while its
	// accept queue was full is retried after 1 s and 3 s) before the
	// server could see the connection. Set for refusals only (the summary
	// splits their latency); zero otherwise.
	Connect time.Duration
	Reach   Reach
	// LoggedIn is true when the server sent ReadyForQuery: the server counts
	// it as an admitted login whatever happened after.
	LoggedIn bool
}

// planFor decides the plan of login number sequence, elapsed into the run.
// Choices are drawn from a generator seeded by (seed, sequence) so a run is
// reproducible.
func (c *Config) planFor(sequence int64, elapsed time.Duration) Plan {
	random := rand.New(rand.NewPCG(c.Seed, uint64(sequence)))
	target := c.Targets[sequence%int64(len(c.Targets))]
	plan := Plan{Sequence: sequence, Target: target}
	switch {
	case target.Password != "":
		plan.Password = target.Password
	case len(c.Passwords) == 1:
		plan.Password = c.Passwords[0]
	case c.PasswordSwitchAfter > 0:
		plan.Password = c.Passwords[int64(elapsed/c.PasswordSwitchAfter)%int64(len(c.Passwords))]
	default:
		plan.Password = c.Passwords[random.IntN(len(c.Passwords))]
	}
	if c.WrongShare > 0 && random.Float64() < c.WrongShare {
		plan.Wrong = true
		plan.Password += "-loginstorm-wrong"
	}
	if c.AbandonShare > 0 && random.Float64() < c.AbandonShare {
		plan.Abandon = c.Abandon
	}
	return plan
}

// Client performs logins. It holds only settings and is safe for
// concurrent use.
type Client struct {
	Address    string
	Deadline   time.Duration
	LateWindow time.Duration
	Query      string
	Graceful   bool
	// Now is the clock used for latencies; nil means time.Now.
	Now func() time.Time

	scramClients sync.Map // password → *scram.Client
}

// scramClient returns a SCRAM client for password, shared by every login
// with that password. xdg-go/scram's client caches the PBKDF2-derived keys
// per salt and iteration count, so the generator derives them once per
// password instead of once per login and does not become the bottleneck.
// Postgres takes the user from the StartupMessage and ignores the SCRAM user
// name; libpq sends it empty, and so do we.
func (c *Client) scramClient(password string) (*scram.Client, error) {
	if client, ok := c.scramClients.Load(password); ok {
		return client.(*scram.Client), nil
	}
	client, err := scram.SHA256.NewClient("", password, "")
	if err != nil {
		return nil, err
	}
	actual, _ := c.scramClients.LoadOrStore(password, client)
	return actual.(*scram.Client), nil
}

func (c *Client) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Login performs one complete login as planned and classifies it. The whole
// attempt, connect included, is bounded by Deadline (plus LateWindow, during
// which a completion counts as late).
func (c *Client) Login(ctx context.Context, plan Plan) Outcome {
	start := c.now()
	outcome, conn := c.login(ctx, plan, start, false)
	if conn != nil {
		c.close(conn)
	}
	outcome.Sequence = plan.Sequence
	if !isRefusal(outcome.Class) { // a refusal was timed when its error was read
		outcome.Latency = c.now().Sub(start)
	}
	if outcome.Class == ClassOnTime && outcome.Latency > c.Deadline {
		outcome.Class = ClassLate
	}
	return outcome
}

// Open logs in without running the query and returns the open connection,
// for -hold. The caller must call CloseHeld.
func (c *Client) Open(ctx context.Context, plan Plan) (net.Conn, Outcome) {
	outcome, conn := c.login(ctx, plan, c.now(), true)
	if outcome.Class != ClassOnTime && conn != nil {
		c.close(conn)
		conn = nil
	}
	return conn, outcome
}

// CloseHeld sends Terminate and closes a connection returned by Open.
func (c *Client) CloseHeld(conn net.Conn) {
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	c.close(conn)
}

// close sends Terminate (best effort) and closes with RST unless Graceful.
func (c *Client) close(conn net.Conn) {
	if terminate, err := (&pgproto3.Terminate{}).Encode(nil); err == nil {
		_, _ = conn.Write(terminate)
	}
	c.closeOnly(conn)
}

func (c *Client) closeOnly(conn net.Conn) {
	if tcp, ok := conn.(*net.TCPConn); ok && !c.Graceful {
		// SO_LINGER 0: the close sends RST and leaves no TIME_WAIT, so
		// the generator does not run out of ephemeral ports.
		_ = tcp.SetLinger(0)
	}
	_ = conn.Close()
}

// login runs the attempt up to ReadyForQuery (and the query unless
// skipQuery). It returns the connection still open when the login reached
// ReadyForQuery or a stage where Terminate makes sense; the caller closes it.
func (c *Client) login(ctx context.Context, plan Plan, start time.Time, skipQuery bool) (Outcome, net.Conn) {
	hardDeadline := start.Add(c.Deadline + c.LateWindow)
	ctx, cancel := context.WithDeadline(ctx, hardDeadline)
	defer cancel()
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "tcp", c.Address)
	if err != nil {
		reach := ReachNone
		if isTimeout(err) {
			// The server may have completed the handshake as the client
			// gave up, and accepted (even shed) a connection it never used.
			reach = ReachConnect
		}
		return Outcome{Class: ClassConnect, Stage: StageConnect, Message: err.Error(), Reach: reach}, nil
	}
	connected := c.now().Sub(start)
	// The context bounds the dial; the deadline bounds every read and write.
	// A cancelled parent context (the run was interrupted) closes the socket.
	_ = conn.SetDeadline(hardDeadline)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	// reach is set before each send: a write that fails may still have
	// delivered its bytes, and the server may act on them.
	reach := ReachSent
	failed := func(class Class, stage Stage, err error) (Outcome, net.Conn) {
		if isTimeout(err) {
			class = ClassTimeout
		}
		return Outcome{Class: class, Stage: stage, Message: err.Error(), Reach: reach}, conn
	}

	frontend := pgproto3.NewFrontend(conn, conn)
	startup := &pgproto3.StartupMessage{
		ProtocolVersion: pgproto3.ProtocolVersionNumber,
		Parameters:      map[string]string{"user": plan.Target.User, "database": plan.Target.Database, "application_name": "loginstorm"},
	}
	if plan.Abandon == AbandonStartup {
		// Send the length word only: the server has seen a first byte (so
		// it is a login in flight) but never a whole StartupMessage.
		encoded, err := startup.Encode(nil)
		if err == nil {
			_, err = conn.Write(encoded[:4])
		}
		if err != nil {
			return failed(ClassProtocol, StageStartup, err)
		}
		c.closeOnly(conn)
		return Outcome{Class: ClassAbandoned, Stage: StageStartup}, nil
	}
	frontend.Send(startup)
	if err := frontend.Flush(); err != nil {
		return failed(ClassProtocol, StageStartup, err)
	}

	stage := StageAuth
	var conversation *scram.ClientConversation
	for {
		message, err := frontend.Receive()
		if err != nil {
			return failed(ClassProtocol, stage, err)
		}
		if reach == ReachSent {
			reach = ReachHeard
		}
		if plan.Abandon == AbandonAuth && isPasswordRequest(message) {
			c.closeOnly(conn)
			return Outcome{Class: ClassAbandoned, Stage: StageAuth}, nil
		}
		switch message := message.(type) {
		case *pgproto3.AuthenticationCleartextPassword:
			reach = ReachPassword
			frontend.Send(&pgproto3.PasswordMessage{Password: plan.Password})
		case *pgproto3.AuthenticationMD5Password:
			reach = ReachPassword
			frontend.Send(&pgproto3.PasswordMessage{Password: md5Password(plan.Target.User, plan.Password, message.Salt)})
		case *pgproto3.AuthenticationSASL:
			if !contains(message.AuthMechanisms, "SCRAM-SHA-256") {
				return failed(ClassProtocol, stage, fmt.Errorf("server offers SASL mechanisms %q, not SCRAM-SHA-256", message.AuthMechanisms))
			}
			client, err := c.scramClient(plan.Password)
			if err != nil {
				return failed(ClassProtocol, stage, err)
			}
			conversation = client.NewConversation()
			first, err := conversation.Step("")
			if err != nil {
				return failed(ClassProtocol, stage, err)
			}
			frontend.Send(&pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: []byte(first)})
		case *pgproto3.AuthenticationSASLContinue:
			if conversation == nil {
				return failed(ClassProtocol, stage, errors.New("SASLContinue before SASL"))
			}
			final, err := conversation.Step(string(message.Data))
			if err != nil {
				return failed(ClassProtocol, stage, err)
			}
			reach = ReachPassword // the proof: the server can now admit the login
			frontend.Send(&pgproto3.SASLResponse{Data: []byte(final)})
		case *pgproto3.AuthenticationSASLFinal:
			if conversation == nil {
				return failed(ClassProtocol, stage, errors.New("SASLFinal before SASL"))
			}
			if _, err := conversation.Step(string(message.Data)); err != nil || !conversation.Valid() {
				return failed(ClassProtocol, stage, fmt.Errorf("server's SCRAM signature did not verify: %v", err))
			}
			continue
		case *pgproto3.AuthenticationOk:
			stage = StageReady
			reach = ReachAuthOK
			if plan.Abandon == AbandonReady {
				c.closeOnly(conn)
				return Outcome{Class: ClassAbandoned, Stage: StageReady}, nil
			}
			continue
		case *pgproto3.ParameterStatus, *pgproto3.BackendKeyData, *pgproto3.NoticeResponse, *pgproto3.NegotiateProtocolVersion:
			continue
		case *pgproto3.ErrorResponse:
			// Timed before the close: how soon a refusal arrives is what a
			// refused client feels, the close is the generator's business.
			latency := c.now().Sub(start)
			class := ClassRefused
			if plan.Wrong && (message.Code == "28P01" || message.Code == "28000") {
				class = ClassWrongRefused
			}
			c.closeOnly(conn)
			return Outcome{Class: class, Stage: stage, SQLState: message.Code, Message: message.Message, Latency: latency, Connect: connected, Reach: reach}, nil
		case *pgproto3.ReadyForQuery:
			if stage != StageReady {
				return failed(ClassProtocol, stage, errors.New("ReadyForQuery before AuthenticationOk"))
			}
			return c.afterReady(frontend, conn, plan, skipQuery)
		default:
			return failed(ClassProtocol, stage, fmt.Errorf("unexpected %T during login", message))
		}
		if err := frontend.Flush(); err != nil {
			return failed(ClassProtocol, stage, err)
		}
	}
}

// afterReady runs the query, if any, on a logged-in connection.
func (c *Client) afterReady(frontend *pgproto3.Frontend, conn net.Conn, plan Plan, skipQuery bool) (Outcome, net.Conn) {
	if plan.Wrong {
		return Outcome{Class: ClassWrongAdmitted, Stage: StageReady, LoggedIn: true, Reach: ReachReady, Message: "a wrong password was admitted"}, conn
	}
	if skipQuery || c.Query == "" {
		return Outcome{Class: ClassOnTime, Stage: StageDone, LoggedIn: true, Reach: ReachReady}, conn
	}
	frontend.SendQuery(&pgproto3.Query{String: c.Query})
	if err := frontend.Flush(); err != nil {
		return queryFailure(err), conn
	}
	var queryError *pgproto3.ErrorResponse
	for {
		message, err := frontend.Receive()
		if err != nil {
			return queryFailure(err), conn
		}
		switch message := message.(type) {
		case *pgproto3.ErrorResponse:
			if queryError == nil {
				queryError = &pgproto3.ErrorResponse{Code: message.Code, Message: message.Message}
			}
		case *pgproto3.ReadyForQuery:
			if queryError != nil {
				return Outcome{Class: ClassQuery, Stage: StageQuery, LoggedIn: true, Reach: ReachReady, SQLState: queryError.Code, Message: queryError.Message}, conn
			}
			return Outcome{Class: ClassOnTime, Stage: StageDone, LoggedIn: true, Reach: ReachReady}, conn
		}
	}
}

func queryFailure(err error) Outcome {
	class := ClassQuery
	if isTimeout(err) {
		class = ClassTimeout
	}
	return Outcome{Class: class, Stage: StageQuery, LoggedIn: true, Reach: ReachReady, Message: err.Error()}
}

// isRefusal is true for the classes of a login refused with an
// ErrorResponse.
func isRefusal(class Class) bool {
	return class == ClassRefused || class == ClassWrongRefused
}

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var netError net.Error
	return errors.As(err, &netError) && netError.Timeout()
}

// md5Password is Postgres's md5 answer: "md5" + md5(md5(password+user)+salt).
func md5Password(user, password string, salt [4]byte) string {
	inner := md5.Sum([]byte(password + user))
	innerHex := hex.EncodeToString(inner[:])
	outer := md5.Sum(append([]byte(innerHex), salt[:]...))
	return "md5" + hex.EncodeToString(outer[:])
}

func contains(list []string, want string) bool {
	for _, item := range list {
		if item == want {
			return true
		}
	}
	return false
}

func isPasswordRequest(message pgproto3.BackendMessage) bool {
	switch message.(type) {
	case *pgproto3.AuthenticationCleartextPassword, *pgproto3.AuthenticationMD5Password, *pgproto3.AuthenticationSASL:
		return true
	}
	return false
}
