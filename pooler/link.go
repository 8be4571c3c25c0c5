package pooler

import (
	"errors"
	"fmt"

	"github.com/pgtender/pgtender/pooler/wire"
)

// A link is the protocol state between a client and the server connection
// linked to it: which replies the server still owes, in order, and whether
// both streams are at a point where the server connection can go back to
// the pool. It knows nothing of sockets, locks or pools; the session feeds
// it the message types it forwards (clientMessage) and receives
// (serverMessage), and asks it the one question that decides the release
// point (atRest). Its rules are the protocol's, as the PostgreSQL docs
// ("Message Flow") and postgres.c's main loop state them, and they are
// unit-tested without sockets (link_test.go), in the manner of CockroachDB
// sqlproxyccl's interceptor.
//
// Every client message that the server answers becomes an expectation;
// each server message is matched against the oldest one. An expectation
// is met by its terminal reply (ParseComplete for Parse, ReadyForQuery for
// Sync or Query, CommandComplete for Execute…), so more replies than
// requests are a protocol error, not an early release.
//
// A link is not safe for concurrent use: the session guards it with its mu.
type link struct {
	// expected[head:] are the replies the server owes, oldest first. The
	// slice is reused from one link to the next.
	expected []expectation
	head     int

	// batchOpen: extended-protocol messages were sent since the last Sync.
	batchOpen bool
	// clientMid: part of a client message has been forwarded, the rest
	// not yet.
	clientMid bool
	// txStatus is the status of the last ReadyForQuery.
	txStatus byte
	// skipping: an extended-protocol message failed, and the server
	// ignores everything but Sync until the next Sync (postgres.c,
	// ignore_till_sync). Messages sent meanwhile get no reply.
	skipping bool
	// copyIn: the server is in copy-in mode (CopyInResponse seen, the
	// COPY not yet ended).
	copyIn bool
	// uncertain: a COPY in the extended protocol ended with an error the
	// client did not cause, at a point from which it cannot be known
	// which of the Syncs sent inside the COPY the server will answer
	// (copy-in reads and ignores Syncs; after the error the main loop
	// answers them). The link stays linked for the client's life and
	// accepts ReadyForQuery messages it cannot match; the server
	// connection is closed when the client leaves.
	uncertain bool

	// copyDataSent: a CopyData was sent since the last CopyDone or
	// CopyFail (its marker is among the expectations).
	copyDataSent bool

	// readies and idleReadies count the ReadyForQuery messages met since
	// the session last took them (takeReadies), for the pool's query and
	// transaction counters.
	readies, idleReadies int

	// settled are the ops settled since the session last took them.
	settled []settledOp
	// synthetics counts the synthetic expectations among expected, so
	// that looking for pgtender's own replies costs nothing when there
	// are none, the usual case.
	synthetics int
}

// expectKind is what a client message the server answers asks for, and so
// which server message meets it.
type expectKind uint8

const (
	expectParse    expectKind = iota + 1 // met by ParseComplete
	expectBind                           // BindComplete
	expectDescribe                       // RowDescription or NoData (after ParameterDescription for a statement)
	expectExecute                        // CommandComplete, EmptyQueryResponse or PortalSuspended
	expectClose                          // CloseComplete
	expectSync                           // ReadyForQuery
	expectQuery                          // ReadyForQuery (Query or FunctionCall: anything may come before it)
	// expectCopyData and expectCopyEnd mark where the client sent its
	// first CopyData and where it ended a COPY (CopyDone or CopyFail)
	// among the expectations; they get no reply of their own and are
	// dropped when they reach the front. They tell which Syncs the client
	// sent inside a COPY (see copyEnded).
	expectCopyData
	expectCopyEnd
)

func (k expectKind) String() string {
	switch k {
	case expectParse:
		return "Parse"
	case expectBind:
		return "Bind"
	case expectDescribe:
		return "Describe"
	case expectExecute:
		return "Execute"
	case expectClose:
		return "Close"
	case expectSync:
		return "Sync"
	case expectQuery:
		return "Query"
	case expectCopyData:
		return "CopyData"
	case expectCopyEnd:
		return "CopyDone"
	}
	return fmt.Sprintf("expectKind(%d)", uint8(k))
}

// extended reports whether an error in reply to this kind of message makes
// the server skip to the next Sync (postgres.c sets
// doing_extended_query_message for Parse, Bind, Describe, Execute and
// Close; an error in a Query, a FunctionCall or at Sync itself does not).
func (k expectKind) extended() bool {
	return k >= expectParse && k <= expectClose
}

// expectation is one reply the server owes.
type expectation struct {
	kind expectKind
	// swallow: the request was pgtender's, injected into the client's
	// stream (inject); its reply is not forwarded, except an error, which
	// the client must see since the server now skips its messages to Sync.
	swallow bool
	// optional: a Sync sent inside a COPY that failed at a point from
	// which it cannot be known whether the server answers it (see
	// link.uncertain).
	optional bool
	// synthetic: pgtender answers the request itself (a Parse of a
	// statement the server connection already has, a DEALLOCATE of a
	// renamed statement); nothing was sent to the server, and the session
	// writes the reply when the expectation reaches the front
	// (takeSynthetic), after every reply owed before it.
	synthetic bool
	// replaceError: the request is pgtender's, made to fail so that the
	// server skips to Sync as Postgres would after the client's message
	// failed; the server's error is replaced by the one op says.
	replaceError bool
	// op is what the session does to its prepared statements when the
	// request is answered, and undoes when it fails or is skipped
	// (settled). nil for most requests.
	op *statementOp
	// stmt is the renamed statement a Bind or Describe uses: an error
	// that says its result type changed supersedes it.
	stmt *preparedStatement
}

// settledOp is an op whose request was answered (ok) or failed or was
// skipped; the session takes them (takeSettled) in the order they settled.
type settledOp struct {
	op *statementOp
	ok bool
}

// errUnexpectedServerMessage is a server message that answers nothing the
// client sent: the stream is out of step, and the server connection cannot
// be trusted with another client.
var errUnexpectedServerMessage = errors.New("server sent a reply to no request")

// reset prepares the link for a newly linked server connection, which owes
// nothing and is idle.
func (l *link) reset() {
	clear(l.expected)
	clear(l.settled)
	*l = link{expected: l.expected[:0], settled: l.settled[:0], txStatus: wire.TxIdle}
}

// clientMessage records a client message about to be forwarded to the
// server: what reply it will get, and what it does to the batch.
func (l *link) clientMessage(typ byte) {
	if l.skipping && typ != wire.MsgSync {
		// The server reads and drops it (copy data included).
		return
	}
	switch typ {
	case wire.MsgParse:
		l.push(expectParse)
		l.batchOpen = true
	case wire.MsgBind:
		l.push(expectBind)
		l.batchOpen = true
	case wire.MsgDescribe:
		l.push(expectDescribe)
		l.batchOpen = true
	case wire.MsgExecute:
		l.push(expectExecute)
		l.batchOpen = true
		l.copyDataSent = false // a COPY it starts is a new one
	case wire.MsgClose:
		l.push(expectClose)
		l.batchOpen = true
	case wire.MsgSync:
		l.push(expectSync)
		l.batchOpen = false
		l.skipping = false
	case wire.MsgQuery, wire.MsgFunctionCall:
		l.push(expectQuery)
		l.copyDataSent = false
	case wire.MsgCopyData:
		if !l.copyDataSent {
			l.push(expectCopyData)
			l.copyDataSent = true
		}
	case wire.MsgCopyDone, wire.MsgCopyFail:
		l.push(expectCopyEnd)
		l.copyDataSent = false
	}
	// Flush gets no reply. Anything else is not a frontend
	// message: Postgres answers it with a FATAL error and closes, which
	// the relay forwards as it would any server error.
}

func (l *link) push(kind expectKind) {
	if l.head > 0 && l.head == len(l.expected) {
		l.expected = l.expected[:0]
		l.head = 0
	}
	l.expected = append(l.expected, expectation{kind: kind})
}

// inject records a message of pgtender's own about to be written into the
// client's stream to the server: a Parse or a Close before the client
// message it serves, or a Query after one. Its replies are swallowed; an
// error is forwarded (the client must see why the server now skips its
// messages), or replaced when replaceError. op, if any, settles with the
// reply.
func (l *link) inject(typ byte, op *statementOp, replaceError bool) {
	if l.skipping {
		return // the server drops it, like the client's
	}
	switch typ {
	case wire.MsgParse:
		l.push(expectParse)
		l.batchOpen = true
	case wire.MsgClose:
		l.push(expectClose)
		l.batchOpen = true
	case wire.MsgQuery:
		l.push(expectQuery)
	default:
		panic(fmt.Sprintf("link: cannot inject message type %q", typ))
	}
	e := &l.expected[len(l.expected)-1]
	e.swallow, e.op, e.replaceError = true, op, replaceError
}

// attach gives op to the expectation the last client message pushed
// (clientMessage): it settles with that message's reply. It must follow a
// clientMessage of a message the server answers, outside skipping.
func (l *link) attach(op *statementOp) {
	l.expected[len(l.expected)-1].op = op
}

// attachStatement gives stmt to the expectation the last client message
// pushed, as attach does.
func (l *link) attachStatement(stmt *preparedStatement) {
	l.expected[len(l.expected)-1].stmt = stmt
}

// owedStatement returns the statement of the oldest expectation (see
// attachStatement), or nil.
func (l *link) owedStatement() *preparedStatement {
	if e := l.owed(); e != nil {
		return e.stmt
	}
	return nil
}

// synthesize records a client message that pgtender answers itself instead
// of forwarding it: a Parse (ParseComplete) or a Query (its whole reply). The answer waits its turn behind the replies
// the server owes (takeSynthetic). Outside skipping only: a message the
// server would skip is forwarded for it to skip.
func (l *link) synthesize(kind expectKind, op *statementOp) {
	l.push(kind)
	e := &l.expected[len(l.expected)-1]
	e.synthetic, e.op = true, op
	l.synthetics++
	if kind.extended() {
		l.batchOpen = true
	}
}

// syntheticDue reports whether the oldest reply owed is pgtender's own:
// nothing from the server will come before it, so the session must be
// told to write it (the reader is woken).
func (l *link) syntheticDue() bool {
	if l.synthetics == 0 {
		return false
	}
	e := l.owed()
	return e != nil && e.synthetic
}

// takeSynthetic removes and returns the oldest expectation if pgtender
// answers it, for the session to write its reply; the session settles its
// op. A synthetic Query's reply ends with a ReadyForQuery of the current
// transaction status, which it counts.
func (l *link) takeSynthetic() (expectation, bool) {
	if l.synthetics == 0 {
		return expectation{}, false
	}
	e := l.owed()
	if e == nil || !e.synthetic {
		return expectation{}, false
	}
	taken := *e
	l.pop()
	if taken.kind == expectQuery {
		l.readies++
		if l.txStatus == wire.TxIdle {
			l.idleReadies++
		}
	}
	return taken, true
}

// errorReplacement returns the op of the oldest expectation when it is
// pgtender's failing request (replaceError): the ErrorResponse that
// answers it is to be replaced. Call it before serverMessage.
func (l *link) errorReplacement() *statementOp {
	if e := l.owed(); e != nil && e.replaceError {
		return e.op
	}
	return nil
}

// opsPending reports whether a request still owed a reply carries an op.
func (l *link) opsPending() bool {
	for i := l.head; i < len(l.expected); i++ {
		if l.expected[i].op != nil {
			return true
		}
	}
	return false
}

// settle notes that e's request was answered (ok) or failed or was skipped.
func (l *link) settle(e *expectation, ok bool) {
	if e.op != nil {
		l.settled = append(l.settled, settledOp{op: e.op, ok: ok})
	}
}

// takeSettled returns the ops settled since the last call, in order; the
// slice is valid until the link's next change.
func (l *link) takeSettled() []settledOp {
	settled := l.settled
	l.settled = l.settled[:0]
	return settled
}

// owed returns the oldest expectation with a reply of its own, dropping
// copy-end markers that reached the front, or nil when nothing is owed.
func (l *link) owed() *expectation {
	for l.head < len(l.expected) {
		if e := &l.expected[l.head]; e.kind != expectCopyData && e.kind != expectCopyEnd {
			return e
		}
		l.pop()
	}
	return nil
}

func (l *link) pop() {
	if l.expected[l.head].synthetic {
		l.synthetics--
	}
	l.expected[l.head] = expectation{}
	l.head++
	if l.head == len(l.expected) {
		l.expected = l.expected[:0]
		l.head = 0
	}
}

// serverMessage matches a message from the server against what the
// client's messages asked for, and says whether the relay must swallow it
// (a reply to pgtender's own request) rather than forward it. body holds
// the first bytes of the message body the relay's scanner inspected
// (ReadyForQuery's status byte, the start of an ErrorResponse). An error
// means the server stream is out of step with the client's: the server
// connection must be discarded.
func (l *link) serverMessage(typ byte, body []byte) (swallow bool, err error) {
	switch typ {
	case wire.MsgNoticeResponse, wire.MsgParameterStatus, wire.MsgNotification:
		return false, nil // asynchronous: any time, answering nothing
	}
	if e := l.owed(); e != nil && e.swallow && (typ != wire.MsgErrorResponse || e.replaceError) {
		swallow = true
	}
	return swallow, l.match(typ, body)
}

// match is serverMessage's matching.
func (l *link) match(typ byte, body []byte) error {
	e := l.owed()
	for e != nil && e.kind == expectSync && (e.optional || l.uncertain) && typ != wire.MsgReadyForQuery {
		// That Sync was read inside the COPY, or the ReadyForQuery taken
		// for an earlier one answered it: this message answers a later
		// request.
		l.pop()
		e = l.owed()
	}
	if e != nil && l.copyIn && (typ == wire.MsgCommandComplete || typ == wire.MsgErrorResponse) {
		l.copyEnded(typ == wire.MsgCommandComplete || copyFailedByClient(body))
	}
	if e != nil && e.synthetic {
		// The session writes pgtender's replies before it passes on the
		// server's next message (takeSynthetic).
		return syntheticDueError(typ, e.kind)
	}
	if e == nil {
		switch {
		case typ == wire.MsgErrorResponse:
			// A FATAL error before Postgres ends the session (a shutdown,
			// pg_terminate_backend): forwarded, then the connection ends.
			return nil
		case l.uncertain && typ == wire.MsgReadyForQuery:
			return l.ready(body)
		}
		return fmt.Errorf("%w: message type %q", errUnexpectedServerMessage, typ)
	}
	if typ == wire.MsgErrorResponse {
		if e.kind.extended() {
			// The message failed; the server now skips to Sync.
			l.settle(e, false)
			l.pop()
			l.skipToSync()
		}
		return nil // in a Query or at Sync: the ReadyForQuery still comes
	}
	switch e.kind {
	case expectParse:
		return l.meet(typ, wire.MsgParseComplete)
	case expectBind:
		return l.meet(typ, wire.MsgBindComplete)
	case expectClose:
		return l.meet(typ, wire.MsgCloseComplete)
	case expectDescribe:
		switch typ {
		case wire.MsgParameterDescription:
			return nil // a statement's: its RowDescription or NoData follows
		case wire.MsgRowDescription, wire.MsgNoData:
			l.pop()
			return nil
		}
	case expectExecute:
		switch typ {
		case wire.MsgDataRow, wire.MsgCopyOutResponse, wire.MsgCopyData, wire.MsgCopyDone, wire.MsgCopyBothResponse:
			return nil
		case wire.MsgCopyInResponse:
			l.copyIn = true
			return nil
		case wire.MsgCommandComplete, wire.MsgEmptyQueryResponse, wire.MsgPortalSuspended:
			l.pop()
			return nil
		}
	case expectSync:
		if typ == wire.MsgReadyForQuery {
			l.pop()
			return l.ready(body)
		}
	case expectQuery:
		switch typ {
		case wire.MsgReadyForQuery:
			// pgtender's own Query counts too: it ran on the server, and
			// its ReadyForQuery is what makes the reader look for the
			// release point.
			l.pop()
			return l.ready(body)
		case wire.MsgCopyInResponse:
			l.copyIn = true
		}
		return nil // rows, results, errors, COPY: all part of the query
	}
	return fmt.Errorf("%w: message type %q in reply to %s", errUnexpectedServerMessage, typ, e.kind)
}

// syntheticDueError is match's error for a server message that came where
// pgtender's own reply was due; out of line, to keep match's frame small.
//
//go:noinline
func syntheticDueError(typ byte, kind expectKind) error {
	return fmt.Errorf("%w: message type %q where pgtender's own reply to %s was due", errUnexpectedServerMessage, typ, kind)
}

// meet pops the oldest expectation if typ is the reply it wants.
func (l *link) meet(typ, want byte) error {
	if typ != want {
		return fmt.Errorf("%w: message type %q where %q was due", errUnexpectedServerMessage, typ, want)
	}
	l.settle(&l.expected[l.head], true)
	l.pop()
	return nil
}

// ready takes in a ReadyForQuery.
func (l *link) ready(body []byte) error {
	if len(body) != 1 {
		return errors.New("malformed ReadyForQuery from server")
	}
	l.txStatus = body[0]
	l.readies++
	if l.txStatus == wire.TxIdle {
		l.idleReadies++
	}
	return nil
}

// skipToSync drops the expectations the server will now skip: everything
// up to the next Sync. With no Sync sent yet, what the client sends until
// its Sync is skipped as well (clientMessage).
func (l *link) skipToSync() {
	for l.head < len(l.expected) {
		if l.expected[l.head].kind == expectSync {
			return
		}
		l.settle(&l.expected[l.head], false)
		l.pop()
	}
	l.skipping = true
}

// copyEnded takes in the end of a COPY from the client; expected[head] is
// the Execute or Query that ran it. Copy-in reads and ignores Sync
// (copyfromparse.c, "for the convenience of client libraries"), so the
// Syncs the client sent inside the COPY get no reply and are dropped. That
// is certain when the COPY ran to the client's end (completed, or failed by
// the client's own CopyFail), and for Syncs sent before any CopyData (as
// libpq sends Execute, Sync, then the data). After an error at another
// point (a bad row) the main loop answers the Syncs the copy reader had not
// read yet; a Sync sent between CopyData messages may be either, and the
// link is then uncertain.
func (l *link) copyEnded(byClient bool) {
	l.copyIn = false
	data, end := -1, -1 // this COPY's markers
	for i := l.head + 1; i < len(l.expected) && end < 0; i++ {
		switch l.expected[i].kind {
		case expectCopyData:
			if data < 0 {
				data = i
			}
		case expectCopyEnd:
			end = i
		}
	}
	inside := end
	if inside < 0 {
		inside = len(l.expected) // the client has not ended the COPY yet
	}
	kept := l.head + 1
	for i := l.head + 1; i < len(l.expected); i++ {
		e := l.expected[i]
		if i <= inside && i < len(l.expected) {
			switch {
			case i == data || i == end:
				continue
			case e.kind == expectSync && (byClient || data < 0 || i < data):
				continue // read and ignored by the copy reader
			case e.kind == expectSync:
				e.optional = true
				l.uncertain = true
			}
		}
		l.expected[kept] = e
		kept++
	}
	clear(l.expected[kept:])
	l.expected = l.expected[:kept]
}

// readiesOwed is how many ReadyForQuery messages the server still owes
// (pgtender's own answers aside).
func (l *link) readiesOwed() int {
	n := 0
	for i := l.head; i < len(l.expected); i++ {
		switch e := l.expected[i]; e.kind {
		case expectSync, expectQuery:
			if !e.synthetic {
				n++
			}
		}
	}
	return n
}

// takeReadies returns and clears the ReadyForQuery counts.
func (l *link) takeReadies() (readies, idle int) {
	readies, idle = l.readies, l.idleReadies
	l.readies, l.idleReadies = 0, 0
	return readies, idle
}

// atRest reports whether the client's side of the link is at rest:
// everything it sent has been answered, no extended-protocol batch or
// message is half sent, and it is outside a transaction. With the server
// stream at a message boundary (which only its reader may look at), that is
// the release point of transaction mode.
func (l *link) atRest() bool {
	return l.owed() == nil && !l.batchOpen && !l.clientMid && !l.uncertain && !l.copyIn &&
		l.txStatus == wire.TxIdle
}

// finishable reports whether the server can be brought to rest without
// the client: whatever is owed comes without more client input. A half-sent
// batch or message, a COPY from the client, or an uncertain link cannot be
// finished.
func (l *link) finishable() bool {
	return !l.batchOpen && !l.clientMid && !l.copyIn && !l.uncertain
}

// idleInTransaction reports whether the client holds its server connection
// in an open transaction with nothing owed (SHOW-style counters).
func (l *link) idleInTransaction() bool {
	return l.owed() == nil && !l.batchOpen && l.txStatus != wire.TxIdle
}
