package pooler

import (
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// fakePG is a scripted fake Postgres for protocol tests: a TCP server on
// 127.0.0.1:0 speaking the backend side of the protocol with
// pgproto3.Backend. It accepts any StartupMessage (optionally asking for a
// cleartext password), gives every connection a distinct backend pid, and
// then interprets a tiny SQL dialect (see fakeConn.run). Everything each
// connection receives is recorded so that tests can assert what the pooler
// sent to which backend.
//
// Output is buffered and flushed where Postgres flushes: after a simple
// Query's ReadyForQuery, on Sync and on Flush.
type fakePG struct {
	t        testing.TB
	ln       net.Listener
	password string // "" = no password asked
	done     chan struct{}
	wg       sync.WaitGroup

	mu             sync.Mutex
	nextPID        uint32
	conns          []*fakeConn
	cancels        []fakeCancel
	cancelArrivals int  // CancelRequests read, including held ones
	holdCancels    bool // CancelRequests wait for openGate("cancels")
	resetCancels   bool // cancel connections are reset, nothing canceled
	gates          map[string]chan struct{}
	closed         bool
	// reported are ParameterStatus values that connections opened from
	// now on report at login, over the defaults (setReported).
	reported map[string]string
	// Probe scripting (fakeConn.probe): the next probeCancels probes fail
	// in their first statement (cancelProbes), probes wait for the gate
	// probeGate when it is set (holdProbes), and probeReports are
	// ParameterStatus values every probe's reply carries
	// (reportDuringProbes).
	probeCancels int
	probeGate    string
	probeReports map[string]string
	// startupRefusal, when set, is the SQLSTATE every StartupMessage is
	// answered with, as FATAL (refuseStartups): Postgres starting up says
	// 57P03.
	startupRefusal string
	// breakTLS makes an SSLRequest get 'S' and then a close, a TLS
	// attempt that fails for another reason than a refusal (breakTLSAttempts).
	breakTLS bool
	// silent makes new connections get no answer at all, a server that
	// accepts and then hangs (answerNothing).
	silent bool
	// accepts counts the TCP connections accepted, CancelRequests and
	// TLS refusals included: each dial of the pooler's.
	accepts atomic.Int64
}

// fakeCancel is a CancelRequest the fake acted on.
type fakeCancel struct {
	PID         uint32
	Matched     bool // pid and secret named a connection
	Interrupted bool // that connection was running SLEEP, which it canceled
}

// fakeConn is one server connection of the fake. Fields below mu are
// guarded by fakePG.mu.
type fakeConn struct {
	f      *fakePG
	pid    uint32
	secret uint32
	nc     net.Conn
	be     *pgproto3.Backend
	cancel chan struct{} // a matching CancelRequest arrived

	// Guarded by f.mu.
	params   map[string]string
	settings map[string]string // set at session level by SET name = value
	log      []string          // "Q <sql>", "P <sql>", "B", "D", "E", "S", "H", "C", "d", "c", "f", "X"
	txStatus byte
	sleeping bool
	gate     string // the gate the connection is waiting on
	ended    bool   // the connection's goroutine returned

	// Owned by the connection's goroutine.
	statements map[string]string
	portals    map[string]string
	skipToSync bool // extended protocol: an error happened, skip to Sync
	readySent  bool // the statement sent its own ReadyForQuery (HOLD)
}

func newFakePG(t testing.TB, password string) *fakePG {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("fake postgres: listen: %v", err)
	}
	f := &fakePG{
		t:        t,
		ln:       ln,
		password: password,
		done:     make(chan struct{}),
		nextPID:  1000,
		gates:    make(map[string]chan struct{}),
	}
	f.wg.Add(1)
	go f.acceptLoop()
	t.Cleanup(f.close)
	return f
}

func (f *fakePG) hostPort() (string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	addr := f.ln.Addr().(*net.TCPAddr)
	return addr.IP.String(), addr.Port
}

func (f *fakePG) close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	close(f.done)
	conns := append([]*fakeConn(nil), f.conns...)
	ln := f.ln
	f.mu.Unlock()
	ln.Close()
	for _, c := range conns {
		c.nc.Close()
	}
	f.wg.Wait()
}

func (f *fakePG) acceptLoop() {
	defer f.wg.Done()
	f.mu.Lock()
	ln := f.ln
	f.mu.Unlock()
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		f.accepts.Add(1)
		f.wg.Add(1)
		go f.serve(nc)
	}
}

// stopListening closes the listener and every connection, as a stopped
// Postgres would: connects to its address are refused until listenAgain.
func (f *fakePG) stopListening() {
	f.mu.Lock()
	ln := f.ln
	conns := append([]*fakeConn(nil), f.conns...)
	f.mu.Unlock()
	ln.Close()
	for _, c := range conns {
		c.nc.Close()
	}
}

// listenAgain listens on the address stopListening gave up.
func (f *fakePG) listenAgain() {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	ln, err := net.Listen("tcp", f.ln.Addr().String())
	if err != nil {
		f.t.Fatalf("fake postgres: listen again: %v", err)
	}
	f.ln = ln
	f.wg.Add(1)
	go f.acceptLoop()
}

// refuseStartups makes every StartupMessage from now on get a FATAL error
// with code ("" to accept them again).
func (f *fakePG) refuseStartups(code string) {
	f.mu.Lock()
	f.startupRefusal = code
	f.mu.Unlock()
}

// breakTLSAttempts makes every SSLRequest from now on get 'S' and then a
// close (false: 'N' again).
func (f *fakePG) breakTLSAttempts(broken bool) {
	f.mu.Lock()
	f.breakTLS = broken
	f.mu.Unlock()
}

// answerNothing makes connections accepted from now on get no answer, as
// from a Postgres that is frozen or behind a path that drops its replies
// (false: answer again). Such a connection is read until the pooler gives
// up on it, or for at most ten seconds.
func (f *fakePG) answerNothing(silent bool) {
	f.mu.Lock()
	f.silent = silent
	f.mu.Unlock()
}

// gate returns the channel a GATE or HOLD statement waits on.
func (f *fakePG) gate(name string) chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch, ok := f.gates[name]
	if !ok {
		ch = make(chan struct{})
		f.gates[name] = ch
	}
	return ch
}

// openGate lets statements waiting on the gate name go on.
func (f *fakePG) openGate(name string) {
	ch := f.gate(name)
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// connList returns the connections opened so far, oldest first.
func (f *fakePG) connList() []*fakeConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*fakeConn(nil), f.conns...)
}

func (f *fakePG) connCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}

// byPID returns the connection with backend pid pid, or nil.
func (f *fakePG) byPID(pid uint32) *fakeConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		if c.pid == pid {
			return c
		}
	}
	return nil
}

// find returns the first connection for which match (called under f.mu)
// is true, or nil.
func (f *fakePG) find(match func(c *fakeConn) bool) *fakeConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		if match(c) {
			return c
		}
	}
	return nil
}

// sleeper returns the connection running SLEEP now, or nil.
func (f *fakePG) sleeper() *fakeConn {
	return f.find(func(c *fakeConn) bool { return c.sleeping })
}

// atGate returns the connection waiting on gate name now, or nil.
func (f *fakePG) atGate(name string) *fakeConn {
	return f.find(func(c *fakeConn) bool { return c.gate == name })
}

func (f *fakePG) cancelList() []fakeCancel {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeCancel(nil), f.cancels...)
}

// setReported makes connections opened from now on report value for the
// parameter name at login, as a server whose configuration changed would.
func (f *fakePG) setReported(name, value string) { f.setParameter(&f.reported, name, value) }

// setParameter sets name = value in *params, a map f.mu guards.
func (f *fakePG) setParameter(params *map[string]string, name, value string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if *params == nil {
		*params = make(map[string]string)
	}
	(*params)[name] = value
}

// cancelProbes makes the next n probes fail in their first statement with
// 57014, as the client's own very small statement_timeout cancels the
// statement that reads it before the probe turns it off.
func (f *fakePG) cancelProbes(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probeCancels = n
}

// holdProbes makes probes wait for openGate(gate) before they answer, as a
// busy server would keep pgtender waiting for the reply.
func (f *fakePG) holdProbes(gate string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probeGate = gate
}

// reportDuringProbes makes every probe's reply carry ParameterStatus
// name = value, as a server reports news (a promotion) at the next
// statement any session runs.
func (f *fakePG) reportDuringProbes(name, value string) {
	f.setParameter(&f.probeReports, name, value)
}

// kill closes the server side of connection pid, as a crashed or
// terminated backend would.
func (f *fakePG) kill(pid uint32) {
	if c := f.byPID(pid); c != nil {
		c.nc.Close()
	}
}

// Log returns what the connection received so far.
func (c *fakeConn) Log() []string {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	return append([]string(nil), c.log...)
}

// Queries returns the SQL of every Query and Parse the connection received.
func (c *fakeConn) Queries() []string {
	var out []string
	for _, entry := range c.Log() {
		if sql, ok := strings.CutPrefix(entry, "Q "); ok {
			out = append(out, sql)
		} else if sql, ok := strings.CutPrefix(entry, "P "); ok {
			out = append(out, sql)
		}
	}
	return out
}

// probes counts the probes (probeQuery) the connection received.
func (c *fakeConn) probes() int {
	n := 0
	for _, q := range c.Queries() {
		if isProbe(q) {
			n++
		}
	}
	return n
}

// received reports whether the connection received the SQL statement sql.
func (c *fakeConn) received(sql string) bool {
	for _, q := range c.Queries() {
		if q == sql {
			return true
		}
	}
	return false
}

func (c *fakeConn) Ended() bool {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	return c.ended
}

func (c *fakeConn) TxStatus() byte {
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	return c.txStatus
}

func (c *fakeConn) record(entry string) {
	c.f.mu.Lock()
	c.log = append(c.log, entry)
	c.f.mu.Unlock()
}

func (c *fakeConn) setGate(name string) {
	c.f.mu.Lock()
	c.gate = name
	c.f.mu.Unlock()
}

// waitGate waits, seen at the gate name (atGate), for openGate(name); false
// means the fake closed meanwhile.
func (c *fakeConn) waitGate(name string) bool {
	c.setGate(name)
	select {
	case <-c.f.gate(name):
	case <-c.f.done:
		return false
	}
	c.setGate("")
	return true
}

func (c *fakeConn) setTx(status byte) {
	c.f.mu.Lock()
	c.txStatus = status
	c.f.mu.Unlock()
}

func (f *fakePG) serve(nc net.Conn) {
	defer f.wg.Done()
	defer nc.Close()
	f.mu.Lock()
	silent := f.silent
	f.mu.Unlock()
	if silent {
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.Copy(io.Discard, nc)
		return
	}
	be := pgproto3.NewBackend(nc, nc)
	var startup *pgproto3.StartupMessage
	for startup == nil {
		msg, err := be.ReceiveStartupMessage()
		if err != nil {
			return
		}
		switch msg := msg.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			f.mu.Lock()
			broken := f.breakTLS
			f.mu.Unlock()
			if broken {
				_, _ = nc.Write([]byte{'S'})
				return
			}
			if _, err := nc.Write([]byte{'N'}); err != nil {
				return
			}
		case *pgproto3.CancelRequest:
			if reset := f.handleCancel(msg.ProcessID, msg.SecretKey); reset {
				_ = nc.(*net.TCPConn).SetLinger(0) // the close sends a reset
			}
			return
		case *pgproto3.StartupMessage:
			startup = msg
		}
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	if code := f.startupRefusal; code != "" {
		f.mu.Unlock()
		be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: code,
			Message: "the database system is starting up"})
		_ = be.Flush()
		return
	}
	f.nextPID++
	c := &fakeConn{
		f:          f,
		pid:        f.nextPID,
		secret:     f.nextPID*7919 + 17,
		nc:         nc,
		be:         be,
		cancel:     make(chan struct{}, 1),
		params:     startup.Parameters,
		txStatus:   'I',
		statements: make(map[string]string),
		portals:    make(map[string]string),
	}
	f.conns = append(f.conns, c)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		c.ended = true
		c.sleeping = false
		c.gate = ""
		f.mu.Unlock()
	}()
	if !c.authenticate() {
		return
	}
	c.serveMessages()
}

// handleCancel acts on a CancelRequest as Postgres does: it interrupts the
// statement the backend runs now (SLEEP here) and is a no-op otherwise. It
// reports whether the cancel connection is to be reset instead
// (resetCancelRequests).
func (f *fakePG) handleCancel(pid uint32, secret []byte) (reset bool) {
	f.mu.Lock()
	f.cancelArrivals++
	hold, reset := f.holdCancels, f.resetCancels
	f.mu.Unlock()
	if reset {
		return true
	}
	if hold {
		select {
		case <-f.gate("cancels"):
		case <-f.done:
			return false
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	record := fakeCancel{PID: pid}
	for _, c := range f.conns {
		if c.pid == pid && len(secret) == 4 && binary.BigEndian.Uint32(secret) == c.secret {
			record.Matched = true
			if c.sleeping {
				record.Interrupted = true
				select {
				case c.cancel <- struct{}{}:
				default:
				}
			}
		}
	}
	f.cancels = append(f.cancels, record)
	return false
}

// holdCancelRequests makes CancelRequests wait for openGate("cancels")
// before they take effect, as a slow network or a loaded postmaster would.
func (f *fakePG) holdCancelRequests() {
	f.mu.Lock()
	f.holdCancels = true
	f.mu.Unlock()
}

// resetCancelRequests makes the fake reset every cancel connection once
// it has read the request, acting on none, as a postmaster that crashed
// or a middlebox that drops the connection would.
func (f *fakePG) resetCancelRequests() {
	f.mu.Lock()
	f.resetCancels = true
	f.mu.Unlock()
}

func (f *fakePG) cancelArrivalCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cancelArrivals
}

func (c *fakeConn) authenticate() bool {
	if c.f.password != "" {
		c.be.Send(&pgproto3.AuthenticationCleartextPassword{})
		if c.be.Flush() != nil {
			return false
		}
		if err := c.be.SetAuthType(pgproto3.AuthTypeCleartextPassword); err != nil {
			return false
		}
		msg, err := c.be.Receive()
		if err != nil {
			return false
		}
		pw, ok := msg.(*pgproto3.PasswordMessage)
		if !ok || pw.Password != c.f.password {
			c.be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "28P01",
				Message: fmt.Sprintf("password authentication failed for user %q", c.params["user"])})
			_ = c.be.Flush()
			return false
		}
	}
	c.be.Send(&pgproto3.AuthenticationOk{})
	reported := map[string]string{
		"server_version":              "16.4",
		"server_encoding":             "UTF8",
		"client_encoding":             "UTF8",
		"DateStyle":                   "ISO, MDY",
		"integer_datetimes":           "on",
		"standard_conforming_strings": "on",
		"TimeZone":                    "UTC",
	}
	c.f.mu.Lock()
	for name, value := range c.f.reported {
		reported[name] = value
	}
	c.f.mu.Unlock()
	for name, value := range reported {
		c.be.Send(&pgproto3.ParameterStatus{Name: name, Value: value})
	}
	secret := make([]byte, 4)
	binary.BigEndian.PutUint32(secret, c.secret)
	c.be.Send(&pgproto3.BackendKeyData{ProcessID: c.pid, SecretKey: secret})
	c.be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	return c.be.Flush() == nil
}

// serveMessages runs the connection's message loop until the peer leaves,
// sends Terminate, or a statement ends the connection.
func (c *fakeConn) serveMessages() {
	for {
		msg, err := c.be.Receive()
		if err != nil {
			return
		}
		if !c.handle(msg) {
			return
		}
	}
}

// handle processes one message; false ends the connection.
func (c *fakeConn) handle(msg pgproto3.FrontendMessage) bool {
	switch msg := msg.(type) {
	case *pgproto3.Query:
		c.record("Q " + msg.String)
		if !c.run(msg.String, true) {
			return false
		}
		if c.readySent {
			c.readySent = false
			return true
		}
		c.be.Send(&pgproto3.ReadyForQuery{TxStatus: c.TxStatus()})
		return c.be.Flush() == nil
	case *pgproto3.Parse:
		c.record("P " + msg.Query)
		if c.skipToSync {
			return true
		}
		c.statements[msg.Name] = msg.Query
		c.be.Send(&pgproto3.ParseComplete{})
	case *pgproto3.Bind:
		c.record("B")
		if c.skipToSync {
			return true
		}
		sql, ok := c.statements[msg.PreparedStatement]
		if !ok {
			c.sendError("26000", fmt.Sprintf("prepared statement %q does not exist", msg.PreparedStatement))
			c.skipToSync = true
			return true
		}
		c.portals[msg.DestinationPortal] = sql
		c.be.Send(&pgproto3.BindComplete{})
	case *pgproto3.Describe:
		c.record("D")
		if c.skipToSync {
			return true
		}
		sql := c.portals[msg.Name]
		if msg.ObjectType == 'S' {
			sql = c.statements[msg.Name]
			c.be.Send(&pgproto3.ParameterDescription{})
		}
		if column := resultColumn(sql); column != "" {
			c.be.Send(rowDescription(column))
		} else {
			c.be.Send(&pgproto3.NoData{})
		}
	case *pgproto3.Execute:
		c.record("E")
		if c.skipToSync {
			return true
		}
		return c.run(c.portals[msg.Portal], false)
	case *pgproto3.Close:
		c.record("C")
		if !c.skipToSync {
			c.be.Send(&pgproto3.CloseComplete{})
		}
	case *pgproto3.Sync:
		c.record("S")
		c.skipToSync = false
		c.be.Send(&pgproto3.ReadyForQuery{TxStatus: c.TxStatus()})
		return c.be.Flush() == nil
	case *pgproto3.Flush:
		c.record("H")
		return c.be.Flush() == nil
	case *pgproto3.CopyData:
		c.record("d") // outside COPY: ignored, as Postgres does
	case *pgproto3.CopyDone:
		c.record("c")
	case *pgproto3.CopyFail:
		c.record("f")
	case *pgproto3.Terminate:
		c.record("X")
		return false
	default:
		c.record(fmt.Sprintf("? %T", msg))
		c.sendError("08P01", fmt.Sprintf("unexpected message %T", msg))
		return c.be.Flush() == nil
	}
	return true
}

// resultColumn is the name of the single column a statement returns, or ""
// for statements without rows.
func resultColumn(sql string) string {
	word, _, _ := strings.Cut(sql, " ")
	switch word {
	case "SELECT":
		return "?column?"
	case "WHOAMI":
		return "pid"
	case "GATE":
		return "gate"
	}
	return ""
}

func rowDescription(column string) *pgproto3.RowDescription {
	return &pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{
		Name: []byte(column), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1,
	}}}
}

func (c *fakeConn) sendError(code, message string) {
	c.be.Send(&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: code, Message: message})
	if c.TxStatus() != 'I' {
		c.setTx('E')
	}
}

// fail reports a statement error: in the extended protocol the rest of
// the batch is skipped up to Sync.
func (c *fakeConn) fail(simple bool, code, message string) {
	c.sendError(code, message)
	if !simple {
		c.skipToSync = true
	}
}

// row sends one single-column row (with its RowDescription in the simple
// protocol, where Describe did not send it) and its CommandComplete.
func (c *fakeConn) row(simple bool, column, value string) {
	if simple {
		c.be.Send(rowDescription(column))
	}
	c.be.Send(&pgproto3.DataRow{Values: [][]byte{[]byte(value)}})
	c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")})
}

// run executes one statement of the fake's dialect; false ends the
// connection. The dialect:
//
//	BEGIN, COMMIT, END, ROLLBACK, DISCARD ALL, SET ...   what Postgres does
//	SELECT <text>     one row holding <text>
//	WHOAMI            one row holding the backend pid
//	ERR               ERROR 42601 (a failed transaction block inside one)
//	SLEEP             waits for a CancelRequest for this pid, then ERROR 57014
//	GATE <name>       waits for openGate(name), then one row "gate"
//	HOLD <a> <b>      waits for gate a, answers (flushing), then reads
//	                  nothing more until gate b opens
//	SET <n> = <v>     also records n = v (quotes dropped) as a setting of
//	                  the session, which the probe reports; SET LOCAL and
//	                  several statements in one text (pgtender's own) are
//	                  answered and not recorded
//	<the probe>       pgtender's probe (probeQuery): the timeouts at their
//	                  session-start values, the recorded settings, no
//	                  pins; scripted with cancelProbes, holdProbes and
//	                  reportDuringProbes
//	REPORT <n> <v>    ParameterStatus n = v, as a server reports a change
//	COPY IN           COPY FROM STDIN: CopyInResponse, then CopyData up to
//	                  CopyDone (Sync and Flush ignored meanwhile, as
//	                  Postgres ignores them), "COPY <n>"
//	DIE               closes the connection without answering
func (c *fakeConn) run(sql string, simple bool) bool {
	if c.TxStatus() == 'E' && sql != "ROLLBACK" && sql != "COMMIT" && sql != "END" {
		c.fail(simple, "25P02", "current transaction is aborted, commands ignored until end of transaction block")
		return true
	}
	word, rest, _ := strings.Cut(sql, " ")
	switch {
	case sql == "BEGIN":
		c.setTx('T')
		c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("BEGIN")})
	case sql == "COMMIT" || sql == "END":
		tag := "COMMIT"
		if c.TxStatus() == 'E' {
			tag = "ROLLBACK"
		}
		c.setTx('I')
		c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte(tag)})
	case sql == "ROLLBACK":
		c.setTx('I')
		c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("ROLLBACK")})
	case sql == "DISCARD ALL":
		c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("DISCARD ALL")})
	case word == "SET":
		c.recordSetting(rest)
		c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SET")})
	case isProbe(sql):
		return c.probe()
	case word == "REPORT":
		name, value, _ := strings.Cut(rest, " ")
		c.be.Send(&pgproto3.ParameterStatus{Name: name, Value: value})
		c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SET")})
	case word == "SELECT":
		c.row(simple, "?column?", rest)
	case sql == "WHOAMI":
		c.row(simple, "pid", strconv.FormatUint(uint64(c.pid), 10))
	case sql == "ERR":
		c.fail(simple, "42601", "syntax error at or near \"ERR\"")
	case sql == "SLEEP":
		return c.sleep(simple)
	case word == "GATE":
		if !c.waitGate(rest) {
			return false
		}
		c.row(simple, "gate", "gate")
	case word == "HOLD":
		a, b, _ := strings.Cut(rest, " ")
		c.setGate(a)
		select {
		case <-c.f.gate(a):
		case <-c.f.done:
			return false
		}
		c.setGate(b)
		c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("HOLD")})
		if simple {
			c.be.Send(&pgproto3.ReadyForQuery{TxStatus: c.TxStatus()})
		}
		if c.be.Flush() != nil {
			return false
		}
		select {
		case <-c.f.gate(b):
		case <-c.f.done:
			return false
		}
		c.setGate("")
		// The ReadyForQuery was sent above; the Query handler must not
		// send another.
		c.readySent = simple
	case sql == "COPY IN":
		return c.copyIn(simple)
	case sql == "DIE":
		return false
	default:
		c.fail(simple, "42601", fmt.Sprintf("fake postgres does not understand %q", sql))
	}
	return true
}

// recordSetting takes in the operand of a SET of the form name = value.
func (c *fakeConn) recordSetting(operand string) {
	if strings.Contains(operand, ";") || strings.HasPrefix(operand, "LOCAL ") {
		return
	}
	name, value, ok := strings.Cut(operand, " = ")
	if !ok {
		return
	}
	c.f.setParameter(&c.settings, name, strings.Trim(value, "'"))
}

// isProbe reports whether sql is pgtender's probe (probeQuery).
func isProbe(sql string) bool {
	return strings.Contains(sql, "FROM pg_catalog.pg_settings WHERE source")
}

// probe answers pgtender's probe as Postgres answers its statements: the
// timeouts read, the two SET LOCALs, then every session setting, the
// timeouts' session-start values and the pin counts (all zero), as rows of
// (kind, name, value). A canceled probe gets 57014 in its first statement,
// which ends the text. The Query handler sends the ReadyForQuery.
func (c *fakeConn) probe() bool {
	c.f.mu.Lock()
	canceled := c.f.probeCancels > 0
	if canceled {
		c.f.probeCancels--
	}
	gate := c.f.probeGate
	reports := maps.Clone(c.f.probeReports)
	settings := maps.Clone(c.settings)
	c.f.mu.Unlock()
	if gate != "" && !c.waitGate(gate) {
		return false
	}
	if canceled {
		c.sendError("57014", "canceling statement due to statement timeout")
		return true
	}
	c.be.Send(probeRowDescription)
	c.probeRows([][3]string{{"c", "statement_timeout", "0"}, {"c", "lock_timeout", "0"}})
	for range 2 {
		c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SET")})
	}
	for name, value := range reports {
		c.be.Send(&pgproto3.ParameterStatus{Name: name, Value: value})
	}
	rows := [][3]string{{"d", "statement_timeout", "0"}, {"d", "lock_timeout", "0"}}
	for _, name := range slices.Sorted(maps.Keys(settings)) {
		rows = append(rows, [3]string{"s", name, settings[name]})
	}
	for _, pin := range []string{"listen", "advisory", "cursor", "prepare", "temp"} {
		rows = append(rows, [3]string{"p", pin, "0"})
	}
	c.be.Send(probeRowDescription)
	c.probeRows(rows)
	return true
}

// probeRowDescription describes the probe's rows: kind, name, value.
var probeRowDescription = &pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{
	{Name: []byte("?column?"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1},
	{Name: []byte("name"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1},
	{Name: []byte("current_setting"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1},
}}

// probeRows sends rows of the probe and their statement's CommandComplete.
func (c *fakeConn) probeRows(rows [][3]string) {
	for _, row := range rows {
		c.be.Send(&pgproto3.DataRow{Values: [][]byte{[]byte(row[0]), []byte(row[1]), []byte(row[2])}})
	}
	c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT " + strconv.Itoa(len(rows)))})
}

func (c *fakeConn) sleep(simple bool) bool {
	c.f.mu.Lock()
	c.sleeping = true
	c.f.mu.Unlock()
	defer func() {
		c.f.mu.Lock()
		c.sleeping = false
		c.f.mu.Unlock()
	}()
	select {
	case <-c.cancel:
	case <-c.f.done:
		return false
	case <-time.After(time.Minute):
		// Never reached in a passing test; keeps a broken one from
		// hanging forever.
	}
	c.fail(simple, "57014", "canceling statement due to user request")
	return true
}

func (c *fakeConn) copyIn(simple bool) bool {
	c.be.Send(&pgproto3.CopyInResponse{OverallFormat: 0})
	if c.be.Flush() != nil {
		return false
	}
	rows := 0
	for {
		msg, err := c.be.Receive()
		if err != nil {
			return false
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			c.record("d")
			rows += strings.Count(string(msg.Data), "\n")
		case *pgproto3.CopyDone:
			c.record("c")
			c.be.Send(&pgproto3.CommandComplete{CommandTag: []byte("COPY " + strconv.Itoa(rows))})
			return true
		case *pgproto3.CopyFail:
			c.record("f")
			c.fail(simple, "57014", "COPY from stdin failed: "+msg.Message)
			return true
		case *pgproto3.Sync:
			c.record("S") // ignored during COPY IN, as Postgres does
		case *pgproto3.Flush:
			c.record("H")
		case *pgproto3.Terminate:
			c.record("X")
			return false
		default:
			c.record(fmt.Sprintf("? %T", msg))
			c.fail(simple, "08P01", fmt.Sprintf("unexpected message %T during COPY", msg))
			return true
		}
	}
}
