package pooler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/pooler/sqlscan"
	"github.com/pgtender/pgtender/pooler/wire"
)

// relay forwards the client's messages to a linked server connection until
// the client leaves. In transaction mode a server connection is linked when
// the client sends something that needs one and goes back to the pool at the
// release point (see readServer); in session mode it stays linked.
//
// The client stream is forwarded in the chunks it arrives in. Only message
// headers are inspected, to count the Syncs and Queries that the server
// will answer with ReadyForQuery and to notice Terminate. A message header
// split across reads is held back until it is complete, so the server never
// sees part of a header and every forwarded chunk ends at a message boundary
// or inside a message body.
func (s *session) relay() error {
	s.in.init(s)
	s.takeScanner()
	buf := *s.bufRef
	leftover := copy(buf, s.reader.Buffered())
	s.reader = nil
	return s.relayLoop(buf, leftover)
}

// relayLoop is relay's loop, from buf[:leftover] (bytes already read) or,
// when leftover is 0, from the next read of the client. It returns
// errParked when the session parked (park.go): resume calls it again, with
// nothing held, once the client's socket turns readable.
func (s *session) relayLoop(buf []byte, leftover int) error {
	carried := 0    // bytes of a partial header kept at buf[:carried]
	var long []byte // while a message longer than the pooled buffer arrives: buf
	for {
		n := leftover
		leftover = 0
		if n == 0 {
			var k int
			var err error
			buf, k, err = s.in.read(long, carried)
			if k == 0 {
				if isTimeout(err) {
					// The bound on a client idle in a transaction.
					if expired := s.idleInTransactionExpired(); expired != nil {
						return expired
					}
					// Or the sweep's wake-up of an idle session.
					if carried == 0 && long == nil && s.parkIfAsked() {
						return errParked
					}
					continue
				}
				return err
			}
			n = carried + k
			s.bytesReceived.Add(int64(k))
		}
		chunk := buf[:n]
		if carried == 0 && long == nil {
			if err := s.followReplacedPool(); err != nil {
				return err
			}
		}
		forward, terminate, err := s.scanClientChunk(chunk)
		if err != nil {
			return err
		}
		if !terminate {
			// Hold back a partial header, or a message wanted whole; it is
			// scanned again next time.
			carried = s.scanner.UnreportedLen()
			if need := s.scanner.PendingLen(); need > len(buf) && carried == n {
				// A message longer than the buffer, wanted whole, fills it:
				// a larger one, doubled as the message arrives (so a header
				// alone does not reserve its length), for as long as it
				// takes to arrive.
				grown := make([]byte, min(need, 2*len(buf)))
				copy(grown, chunk[n-carried:])
				s.scanner.DropUnreported()
				if forward > 0 {
					if err := s.forwardClientBytes(chunk[:forward]); err != nil {
						return err
					}
				}
				buf, long = grown, grown
				continue
			}
			s.scanner.DropUnreported()
		}
		if forward > 0 {
			if err := s.forwardClientBytes(chunk[:forward]); err != nil {
				return err
			}
		}
		if terminate {
			return nil
		}
		if carried > 0 {
			copy(buf, chunk[n-carried:])
		} else {
			long = nil // the long message has passed
		}
	}
}

// followReplacedPool runs before the session scans a chunk that begins
// with a new message. When a reload closed its pool, the session moves to
// the pool that replaces it, or ends (FATAL 57P01) when there is none (its
// database or user was removed). When its pool's pooler_mode is not the
// session's (the new pool's differs, or acquire moved it there during a
// checkout), the session takes it, provided no server connection is linked
// (a session-mode client's state lives on its server connection, so it
// keeps session mode until it leaves) and the stream is between messages:
// its scanner is set for the new mode (takeScanner) before the chunk is
// scanned. A pooler_mode change so takes effect for each client at its
// next transaction.
func (s *session) followReplacedPool() error {
	pool := s.pool
	if !pool.retired.Load() && pool.settings.Load().mode == s.mode {
		return nil // the hot path: one pool, its mode the session's
	}
	if !s.scanner.AtBoundary() || s.textLeft > 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.server != nil {
		return nil
	}
	if pool.retired.Load() {
		if pool.removed.Load() {
			return fatalError(sqlstateAdminShutdown, removedMessage(pool.key), nil)
		}
		next, ok := s.pooler.poolFor(s.user, s.database)
		if !ok {
			return fatalError(sqlstateAdminShutdown, removedMessage(pool.key), nil)
		}
		s.pool, pool = next, next
	}
	if mode := pool.settings.Load().mode; mode != s.mode {
		s.pooler.log.Info("client takes its pool's new pooler_mode", s.logFields(zap.String("from", string(s.mode)), zap.String("to", string(mode)))...)
		s.mode = mode
		// A client whose statements are renamed keeps them so (its names
		// map to pool-wide ones); one that was in session mode has linked
		// no server connection yet, so it has no statement, and renames
		// from now on if its new pool does.
		s.renaming = s.renaming || pool.settings.Load().preparedStatements
		s.scanner.Whole = wholeClientMessages(mode, s.renaming)
	}
	return nil
}

// chunkSummary is what scanning a client chunk found.
type chunkSummary struct {
	// localEnd is where the part of the chunk that pgtender answers itself
	// ends: the rest of a batch discarded after a failed checkout, up to and
	// including its Sync.
	localEnd   int
	localSyncs int  // Syncs in that part: each gets ReadyForQuery
	needServer bool // something after localEnd only a server can answer
	// mayChangeSession: a statement in the chunk may change the session's
	// state (sqlscan), or a message runs one that might without showing
	// it (a Bind of a statement that did, a FunctionCall).
	mayChangeSession bool
	// drops: the text of a Query or Parse that began in an earlier chunk
	// ends in this one, and drops prepared statements (dropsAll: DEALLOCATE
	// ALL or DISCARD ALL).
	drops statementDrops
	// messages are the messages after localEnd that the chunk reports, in
	// order: what the link is told (link.clientMessage).
	messages []clientMessage
}

// clientMessage is one message of a client chunk, as scanning found it.
type clientMessage struct {
	typ     byte
	start   int        // offset of its header in the chunk
	end     int        // offset after it, when whole
	whole   bool       // the chunk holds all of it
	length  int        // its body's length
	unnamed unnamedUse // what it does with the unnamed statement
	// The prepared statement it names, for renaming (prepared.go), and
	// what else renaming needs; the slices alias the chunk. name is the
	// statement of a Parse, Bind, or of a Describe or Close whose target
	// is TargetStatement.
	name   []byte
	target byte       // Describe, Close
	portal []byte     // Bind
	rest   int        // Bind: where the body goes on after the names
	parse  wire.Parse // a whole Parse, decoded
	// deallocate is the operand of a whole Query, or of the text of a
	// whole Parse of the unnamed statement, that is only DEALLOCATE name.
	deallocate []byte
	// drops: its text, whole in this chunk, drops prepared statements.
	drops statementDrops
	// resets: its text, whole in this chunk, puts every setting back to
	// its session-start value (RESET ALL, DISCARD ALL).
	resets bool
}

// statementDrops is what a text does to prepared statements, besides a
// DEALLOCATE name pgtender follows.
type statementDrops uint8

const (
	dropsNone    statementDrops = iota
	dropsAll                    // DEALLOCATE ALL, DISCARD ALL: all of the client's
	dropsUnknown                // a DEALLOCATE pgtender does not follow
)

// unnamedUse is what a client message does with the unnamed prepared
// statement, which each server connection has one of: a client's Bind of
// it must never run another client's (planUnnamedLocked).
type unnamedUse uint8

const (
	unnamedNone      unnamedUse = iota
	unnamedParsed               // Parse of the unnamed statement: it is now this client's
	unnamedUsed                 // Bind or Describe of it (or a Bind whose statement name did not fit the inspected bytes)
	unnamedDestroyed            // a simple Query or a Close of it: there is none after
)

// scanClientChunk scans a chunk from the client. It returns how many bytes
// of it to forward and whether the client sent Terminate.
func (s *session) scanClientChunk(chunk []byte) (forward int, terminate bool, err error) {
	summary := &s.chunk
	summary.localEnd = 0
	summary.localSyncs = 0
	summary.needServer = false
	summary.mayChangeSession = false
	summary.drops = dropsNone
	summary.messages = summary.messages[:0]
	discarding := s.discarding
	if s.textLeft > 0 {
		// The rest of a Query or Parse whose text began in an earlier chunk.
		s.feedText(chunk[:min(s.textLeft, len(chunk))])
		if s.textLeft == 0 {
			summary.drops = s.textDrops
		}
	}
	for off := 0; off < len(chunk); {
		var msg wire.Message
		var ok bool
		off, msg, ok, err = s.scanner.Next(chunk, off)
		if err != nil {
			return 0, false, s.pooler.clientProtocolError(err)
		}
		if !ok {
			break
		}
		if msg.Type == wire.MsgTerminate {
			if discarding {
				summary.localEnd = msg.Start
			}
			return msg.Start, true, nil
		}
		if discarding {
			// After a failed checkout, Postgres-style: skip to the Sync.
			summary.localEnd = off
			if msg.Type == wire.MsgSync {
				summary.localSyncs++
				discarding = false
			}
			continue
		}
		// Filled in place: the struct is large for a copy per message.
		summary.messages = append(summary.messages, clientMessage{typ: msg.Type, start: msg.Start, length: msg.Length})
		m := &summary.messages[len(summary.messages)-1]
		if end := msg.Start + wire.HeaderLen + msg.Length; end <= len(chunk) {
			m.whole, m.end = true, end
		}
		// What the scanner inspected lies in the chunk (the relay holds
		// back a message until it does), where it stays valid.
		inspected := chunk[msg.Start+wire.HeaderLen : msg.Start+wire.HeaderLen+len(msg.Body)]
		switch msg.Type {
		case wire.MsgSync, wire.MsgFlush, wire.MsgCopyData, wire.MsgCopyDone, wire.MsgCopyFail:
			// Meaningful only to a linked server; answered or harmless
			// otherwise (answerWithoutServer).
		case wire.MsgQuery, wire.MsgParse:
			summary.needServer = true
			s.beginText(msg)
			body := msg.Start + wire.HeaderLen
			s.feedText(chunk[body:min(body+msg.Length, len(chunk))])
			if s.textLeft == 0 {
				m.drops, m.resets = s.textDrops, s.textResets
			}
			switch {
			case msg.Type == wire.MsgQuery:
				m.unnamed = unnamedDestroyed
				if m.whole {
					m.deallocate = s.textDeallocate
				}
			case !s.textNamed:
				m.unnamed = unnamedParsed
				if m.whole && s.textDeallocate != nil {
					if parse, err := wire.DecodeParse(inspected); err == nil {
						m.parse, m.deallocate = parse, s.textDeallocate
					}
				}
			case !m.whole && msg.Length > maxWholeParseLen && s.renaming:
				// Its text is needed whole to rename it.
				return 0, false, fatalError(sqlstateProgramLimitExceeded, fmt.Sprintf(
					"prepared statement of %d bytes: pgtender renames named statements of up to %d bytes; use the unnamed statement for longer ones",
					msg.Length, maxWholeParseLen), nil)
			case m.whole && s.renaming:
				if parse, err := wire.DecodeParse(inspected); err == nil {
					m.parse, m.name = parse, parse.Name
				}
			}
		case wire.MsgBind:
			summary.needServer = true
			if s.effectfulStatements || s.effectfulUnnamed {
				summary.mayChangeSession = true
			}
			// A statement name that does not fit the inspected bytes is
			// taken for the unnamed one: guarding it costs nothing wrong.
			portal, statement, rest, err := wire.BindNames(inspected)
			if err != nil && s.renaming && !m.whole && len(inspected) == inspectBindNames {
				// The names are longer than pgtender looks at: it could
				// rename neither them nor guard them.
				return 0, false, fatalError(sqlstateProgramLimitExceeded, fmt.Sprintf(
					"Bind with portal and statement names over %d bytes: pgtender renames prepared statements and looks at no more (Postgres keeps %d bytes of each name)",
					inspectBindNames-2, maxStatementNameLen), nil)
			}
			if err != nil || len(statement) == 0 {
				m.unnamed = unnamedUsed
			} else {
				m.portal, m.name, m.rest = portal, statement, rest
			}
		case wire.MsgDescribe, wire.MsgClose:
			summary.needServer = true
			if kind, name, err := wire.DecodeTarget(inspected); err == nil && kind == wire.TargetStatement {
				m.target, m.name = kind, name
				if len(name) == 0 {
					m.unnamed = unnamedUsed
					if msg.Type == wire.MsgClose {
						m.unnamed = unnamedDestroyed
					}
				}
			}
		case wire.MsgFunctionCall:
			summary.needServer = true
			summary.mayChangeSession = true // a function by OID: its effects cannot be seen
		case wire.MsgExecute:
			summary.needServer = true
		default:
			// Not a message a logged-in client may send (a password
			// message included): Postgres would end the session, but
			// forwarded, it gets no answer the link expects, so the
			// connection would go back to the pool with Postgres's FATAL
			// on its way to the next client. Refused here, as Postgres
			// refuses it (postgres.c, SocketBackend).
			return 0, false, s.pooler.unknownMessageType(msg.Type)
		}
	}
	forward = len(chunk) - s.scanner.UnreportedLen()
	if discarding {
		summary.localEnd = forward
	}
	return forward, false, nil
}

// inspectClientMessage tells the client stream's scanner which message
// bodies the relay must see in part: the first byte of a Parse too long to
// be held whole, which says whether it names its statement; the names at
// the start of a Bind; the first bytes of a Describe or Close too long to
// be held whole.
func inspectClientMessage(typ byte) int {
	switch typ {
	case wire.MsgParse:
		return 1
	case wire.MsgBind:
		return inspectBindNames
	case wire.MsgDescribe, wire.MsgClose:
		return 2
	}
	return 0
}

// wholeClientMessage tells the client stream's scanner which messages the
// relay must see whole, to rename the prepared statements they name or
// answer them itself: Parse, Describe and Close, and a short Query (a
// DEALLOCATE), up to a bound.
func wholeClientMessage(typ byte, length int) bool {
	switch typ {
	case wire.MsgParse:
		return length <= maxWholeParseLen
	case wire.MsgDescribe, wire.MsgClose, wire.MsgQuery:
		return length <= maxWholeShortLen
	}
	return false
}

// maxWholeShortLen bounds the Describe, Close and Query messages held
// whole: a name Postgres keeps is at most 63 bytes.
const maxWholeShortLen = 1 << 10

// inspectBindNames is how much of a Bind the relay looks at: enough for
// the longest portal and statement names Postgres keeps (63 bytes each),
// and longer ones drivers never send.
const inspectBindNames = 256

// beginText starts following the text of a Query or Parse message, whose
// body the chunk begins to hold.
func (s *session) beginText(msg wire.Message) {
	if s.sql == nil {
		s.sql = sqlScanners.Get().(*sqlscan.Scanner)
	}
	s.sql.Reset()
	s.sql.StandardConformingStringsOff = s.standardConformingStringsOff
	s.textMessage = msg.Type
	s.textLeft = msg.Length
	// Parse: the statement's name comes first; a named one begins with a
	// non-NUL byte.
	s.textSkipName = msg.Type == wire.MsgParse
	s.textNamed = msg.Type == wire.MsgParse && len(msg.Body) > 0 && msg.Body[0] != 0
}

// sqlScanners holds the SQL scanners of texts being followed: a session
// holds one only while a text passes, so an idle session does not hold one
// (docs/pooling.md, "What an idle client holds").
var sqlScanners = sync.Pool{New: func() any { return new(sqlscan.Scanner) }}

// clientScanners holds the client-stream framing scanners of sessions
// whose relay loop is not running: a parked session holds none.
var clientScanners = sync.Pool{New: func() any { return new(wire.Scanner) }}

// takeScanner gives s a framing scanner for its client stream, set for its
// mode: in transaction mode, statements renamed, and the unnamed one
// prepared again on another server connection, need their messages whole.
func (s *session) takeScanner() {
	scanner := clientScanners.Get().(*wire.Scanner)
	*scanner = wire.Scanner{Inspect: inspectClientMessage, Whole: wholeClientMessages(s.mode, s.renaming), MaxLen: s.maxMessageLen}
	s.scanner = scanner
}

// wholeClientMessages is the scanner's Whole for a session in mode, whose
// named statements are renamed or not.
func wholeClientMessages(mode config.PoolerMode, renaming bool) func(typ byte, length int) bool {
	if mode == config.PoolerModeTransaction || renaming {
		return wholeClientMessage
	}
	return nil
}

// returnScanner gives s's scanner back, if it holds one.
func (s *session) returnScanner() {
	if s.scanner != nil {
		clientScanners.Put(s.scanner)
		s.scanner = nil
	}
}

// feedText passes the next bytes of the body of the Query or Parse being
// followed to the SQL scanner and, once the whole body has passed, takes
// in what the scanner found (sqlscan). The body is never copied: a query of
// any size costs one pass over its bytes.
func (s *session) feedText(p []byte) {
	s.textLeft -= len(p)
	if s.textSkipName {
		i := bytes.IndexByte(p, 0)
		if i < 0 {
			p = nil
		} else {
			s.textSkipName = false
			p = p[i+1:]
		}
	}
	if len(p) > 0 {
		_, _ = s.sql.Write(p)
	}
	if s.textLeft > 0 {
		return
	}
	effects := s.sql.Effects()
	// DEALLOCATE and DISCARD ALL, whether run by a Query or by the
	// unnamed statement of a Parse (psycopg 3 sends its commands so).
	s.textDeallocate, s.textDrops = nil, dropsNone
	s.textResets = effects&sqlscan.ResetsAll != 0
	if effects&sqlscan.DiscardAll != 0 {
		s.textDrops = dropsAll
	}
	if effects&sqlscan.Deallocate != 0 {
		name, all, single := s.sql.SingleDeallocate()
		switch {
		case single && all:
			s.textDrops = dropsAll
		case single && (s.textMessage == wire.MsgQuery || !s.textNamed):
			// The scanner's copy lasts only until its next text.
			s.textDeallocate = bytes.Clone(name)
		case s.textDrops == dropsNone:
			// Among other statements, or run by a named statement: which
			// it drops is not followed.
			s.textDrops = dropsUnknown
		}
	}
	if s.textMessage == wire.MsgParse {
		// Its effects come when it is executed, maybe in a later batch.
		if s.textNamed {
			s.effectfulStatements = s.effectfulStatements || effects != 0
		} else {
			s.effectfulUnnamed = effects != 0
		}
	}
	if effects != 0 {
		s.chunk.mayChangeSession = true
		s.noteCustomSettings(effects)
	}
	sqlScanners.Put(s.sql)
	s.sql = nil
}

// forwardClientBytes sends a scanned chunk to the linked server connection,
// linking one first when needed, or answers it without a server.
func (s *session) forwardClientBytes(chunk []byte) error {
	summary := &s.chunk
	if summary.localEnd > 0 {
		// The end of a batch whose checkout failed: Postgres would have
		// skipped it up to its Sync and answered that with ReadyForQuery.
		reply := s.localReplies[:0]
		for range summary.localSyncs {
			reply = wire.AppendReadyForQuery(reply, wire.TxIdle)
		}
		s.localReplies = reply[:0]
		if summary.localSyncs > 0 {
			s.discarding = false
		}
		if len(reply) > 0 {
			if err := s.write(reply); err != nil {
				return err
			}
		}
		chunk = chunk[summary.localEnd:]
		if len(chunk) == 0 {
			return nil
		}
	}
	s.mu.Lock()
	for s.probing {
		// readServer is asking the server connection what the last
		// transaction left; it may release it after.
		s.cond.Wait()
	}
	if s.stateLocked() == stateServerLost {
		s.mu.Unlock()
		return fatalError(sqlstateConnectionFailure, "server connection lost", nil)
	}
	linked := false // sc is linked by this call, and no reader runs yet
	if s.server == nil {
		if !summary.needServer {
			s.mu.Unlock()
			return s.answerWithoutServer(nil)
		}
		if reply, ok := s.prepareWithoutServerLocked(summary); ok {
			s.mu.Unlock()
			return s.write(reply)
		}
		s.mu.Unlock()
		if s.pooler.draining.Load() {
			return fatalError(sqlstateAdminShutdown, "pgtender is shutting down", nil)
		}
		sc, err := s.acquire()
		if err == errClientLeft {
			return err
		}
		if err != nil {
			s.pooler.log.Info("checkout failed", s.logFields(zap.Error(err))...)
			return s.answerWithoutServer(s.checkoutError(err))
		}
		if err := s.alignServer(sc); err != nil {
			s.pooler.log.Warn("could not set a client's parameters on a server connection", s.logFields(zap.Error(err))...)
			sc.pool.Discard(sc)
			return s.answerWithoutServer(&clientError{severity: wire.SeverityError, code: sqlstateConnectionFailure,
				message: "could not prepare a server connection for this client", err: err})
		}
		s.mu.Lock()
		if s.stateLocked() >= stateShuttingDown || s.pooler.draining.Load() {
			s.mu.Unlock()
			s.pool.Release(sc)
			if s.killed.Load() {
				return errKilled // told by kill already
			}
			return fatalError(sqlstateAdminShutdown, "pgtender is shutting down", nil)
		}
		s.linkServer(sc)
		linked = true
	}
	sc := s.server
	// Told before the bytes are written, so that no reply can arrive for
	// a request the link does not know of.
	edits := s.planChunkLocked(sc, summary, chunk)
	if linked && editedLen(chunk, edits) > inlineChunkMax {
		// The server may answer the first requests of a long write (the
		// chunk with the Parses pgtender injects) before it has read the
		// rest, and stop reading while its output waits to be read: the
		// reader must run during the write.
		s.startReaderLocked(sc)
		linked = false
	}
	s.startQueryClockLocked()
	if summary.mayChangeSession {
		s.settingsMayHaveChanged = true
	}
	// Strings are lexed as the client's session reads them (the value as
	// of its last probe).
	s.standardConformingStringsOff = s.settings["standard_conforming_strings"].value == "off"
	s.link.clientMid = !s.scanner.AtBoundary()
	s.writing = true
	s.mu.Unlock()

	var err error
	if len(edits) == 0 {
		_, err = sc.write(chunk)
	} else {
		err = s.writeEdited(sc, chunk, edits)
	}
	sc.pool.stats.stripe(s.processID).bytesReceived.Add(uint64(len(chunk)))

	s.mu.Lock()
	s.writing = false
	if err != nil {
		// Part of the chunk may have gone: the server may be inside a
		// message only the client could finish.
		s.link.clientMid = true
	}
	s.cond.Broadcast()
	if linked {
		if err == nil && s.readInlineLocked(sc) {
			s.mu.Unlock()
			s.readServerInline(sc)
			return nil
		}
		s.startReaderLocked(sc)
	}
	if err == nil && s.server == sc && (s.mayReleaseLocked() || s.link.syntheticDue()) {
		// What was just written may need no answer (a Flush, the end of a
		// message body) and leave the link at its release point, while
		// readServer looked before the write ended and went back to
		// reading; or the next reply owed is pgtender's own, which
		// readServer writes in its turn.
		s.wakeReaderLocked(sc)
	}
	s.mu.Unlock()
	if err != nil {
		// The server is gone; readServer sees it too, tells the client
		// and closes the session.
		s.pooler.log.Debug("write to server failed", s.logFields(zap.Error(err))...)
	}
	return nil
}

// closeUnnamedStatement is the Close pgtender injects before a client's
// Bind or Describe of the unnamed statement when the server connection's
// unnamed statement is not the client's and pgtender cannot prepare the
// client's there (planChunkLocked): the client's Bind must not run another
// client's statement.
var closeUnnamedStatement = wire.AppendClose(nil, wire.TargetStatement, nil)

// writeEdited writes chunk to sc with the edits planChunkLocked made,
// in one writev.
func (s *session) writeEdited(sc *ServerConn, chunk []byte, edits []edit) error {
	buffers := s.editedBuffers(chunk, edits)
	if len(buffers) == 0 {
		return nil
	}
	_, err := sc.writeBuffers(buffers)
	return err
}

// editedLen is the length of chunk with the edits made: what writeEdited
// writes.
func editedLen(chunk []byte, edits []edit) int {
	n := len(chunk)
	for _, e := range edits {
		n += (e.to - e.from) - (e.end - e.start)
	}
	return n
}

// editedBuffers returns chunk with the edits made, as the pieces to write.
// The slice is the session's, reused.
func (s *session) editedBuffers(chunk []byte, edits []edit) net.Buffers {
	buffers := s.writeBuffers[:0]
	prev := 0
	for _, e := range edits {
		if e.start > prev {
			buffers = append(buffers, chunk[prev:e.start])
		}
		if e.to > e.from {
			buffers = append(buffers, s.editBytes[e.from:e.to])
		}
		prev = e.end
	}
	if prev < len(chunk) {
		buffers = append(buffers, chunk[prev:])
	}
	s.writeBuffers = buffers[:0]
	return buffers
}

// acquire checks out a server connection from the session's pool. When a
// reload replaced the pool, the session moves to the new one.
//
// While it waits, the client's socket is watched (watchClientWhileWaiting):
// a client that leaves is taken out of the pool's queue (errClientLeft),
// and one that sends a CancelRequest gets 57014 (errCanceledWhileWaiting),
// instead of a connection, its settings and its query run for nobody.
func (s *session) acquire() (*ServerConn, error) {
	sc, err := s.acquireFromPool()
	if err == nil {
		sc.pool.stats.stripe(s.processID).assignments.Add(1)
	}
	return sc, err
}

// acquireFromPool is acquire without the count.
func (s *session) acquireFromPool() (*ServerConn, error) {
	if sc := s.pool.tryAcquireIdle(nil, s.pool.stats.stripe(s.processID)); sc != nil {
		return sc, nil
	}
	ctx, cancel := s.checkoutContext(time.Time{})
	defer cancel()
	ctx, stopWatching := s.watchClientWhileWaiting(ctx)
	sc, err := s.pool.acquire(ctx, s.pool.stats.stripe(s.processID))
	if errors.Is(err, ErrPoolClosed) && !s.pooler.draining.Load() {
		if pool, ok := s.pooler.poolFor(s.user, s.database); ok {
			s.pool = pool
			sc, err = pool.acquire(ctx, pool.stats.stripe(s.processID))
		}
	}
	if left := stopWatching(); err != nil && left != nil {
		return nil, left
	}
	return sc, err
}

// errCanceledWhileWaiting is the end of a checkout whose client sent a
// CancelRequest while it waited (Pooler.cancelRequest).
var errCanceledWhileWaiting = errors.New("canceled by the client while waiting for a server connection")

// watchClientWhileWaiting returns ctx, which also ends when the client
// leaves (errClientLeft) or cancels (errCanceledWhileWaiting), and the
// function that stops the watch and returns which of the two ended it, if
// either did. A cancel ends ctx at once (Pooler.cancelRequest). The watch
// for a client leaving is a goroutine waiting for the client's socket to
// turn readable (a peek: it consumes nothing), ended by a read deadline in
// the past; bytes from the client (it pipelines) end it too, since then it
// cannot tell a close that follows them. It starts only once the checkout
// has waited clientWatchDelay: most waits end sooner (a connection comes
// back as another client's transaction ends), and for those the goroutine,
// its peeks and the two deadline changes would be spent for nothing.
func (s *session) watchClientWhileWaiting(ctx context.Context) (context.Context, func() error) {
	ctx, cancel := context.WithCancelCause(ctx)
	if s.clientPeeker == nil {
		s.clientPeeker = newSocketPeeker(s.tcp)
	}
	s.mu.Lock()
	s.checkoutCancel = cancel
	s.waitingSince = time.Now()
	s.mu.Unlock()
	done := make(chan struct{})
	watch := time.AfterFunc(clientWatchDelay, func() {
		defer close(done)
		if s.clientPeeker.wait() == peekClosed {
			cancel(errClientLeft)
		}
	})
	return ctx, func() error {
		s.mu.Lock()
		s.checkoutCancel = nil
		s.waitingSince = time.Time{}
		s.mu.Unlock()
		if !watch.Stop() {
			// The watch runs, or is about to: a deadline in the past ends
			// its wait, or its first peek if it starts after this.
			_ = s.tcp.SetReadDeadline(time.Now())
			<-done
			// No server connection is linked while the session checks
			// one out, so no idle-in-transaction deadline is due.
			_ = s.tcp.SetReadDeadline(time.Time{})
		}
		cause := context.Cause(ctx)
		cancel(nil)
		if cause == errClientLeft || cause == errCanceledWhileWaiting {
			return cause
		}
		return nil
	}
}

// clientWatchDelay is how long a checkout waits before the client's socket
// is watched for the client leaving (watchClientWhileWaiting). A client
// that leaves sooner is noticed up to this much later: its checkout is
// abandoned when the watch starts, unless a connection comes back first;
// then its request runs and the relay finds the client gone when it writes
// the reply, as Postgres runs a query whose client closed just after
// sending it and finds out when it answers.
const clientWatchDelay = 2 * time.Millisecond

// linkServer makes sc the session's server connection. Its output is
// relayed by readServer: on a goroutine of its own (startReaderLocked) or,
// for a request answered without more from the client, on the serve
// goroutine (readServerInline). s.mu must be held.
func (s *session) linkServer(sc *ServerConn) {
	s.server = sc
	s.link.reset()
	s.setState(stateLinked)
}

// startReaderLocked starts the goroutine that relays sc's output. s.mu
// must be held.
func (s *session) startReaderLocked(sc *ServerConn) {
	s.pooler.wg.Add(1)
	s.readers.Add(1)
	go s.readServer(sc)
}

// inlineChunkMax is the longest write (the client's chunk with pgtender's
// edits, editedLen) to a freshly linked server connection before its
// reader starts. A server that has read everything sent before (as one at
// the release point has) takes a write this short into its socket's
// receive buffer whatever it does, so the write cannot wait for the
// server to be read.
const inlineChunkMax = 4096

// inlineReadBudget bounds a read of the server on the serve goroutine
// (readServerInline). Meanwhile the client's socket is not read: a client
// that leaves, or an operator's KILL_CLIENT, is noticed up to this much
// later, as a reply that takes longer is relayed by a reader of its own.
const inlineReadBudget = 5 * time.Millisecond

// readInlineLocked reports whether the serve goroutine may relay the reply
// to what it just wrote to sc itself (readServerInline), and if so sets
// the read's budget. That is the usual transaction-mode request: sc linked
// for it, and the server owing replies that come without more from the
// client (not a COPY from the client, a half-sent batch or message). The
// serve goroutine would otherwise start a goroutine to read the reply,
// and go back to waiting for a client that waits for that reply; relaying
// it itself saves the goroutine, and a wake-up of another thread to run
// it, at every transaction. The client is not read meanwhile, as
// Postgres reads no more of a client's input while it answers a query.
// s.mu must be held.
func (s *session) readInlineLocked(sc *ServerConn) bool {
	budget := s.pooler.inlineReadBudget
	if budget == 0 {
		budget = inlineReadBudget
	}
	if budget < 0 || s.mode != config.PoolerModeTransaction || s.stateLocked() >= stateShuttingDown || s.server != sc ||
		s.link.owed() == nil || !s.link.finishable() || s.link.syntheticDue() || s.woken {
		return false
	}
	_ = sc.conn.SetReadDeadline(time.Now().Add(budget))
	s.readBudget = true
	return true
}

// readServerInline relays sc's output on the serve goroutine, as readServer
// does, until sc is released or discarded, or the session is closing
// (finish takes sc over); or until the link waits for the client (in a
// transaction, a COPY from the client), the budget runs out or anything
// wakes the reader (wakeReaderLocked): then a reader goroutine takes over,
// and the serve goroutine goes back to reading the client.
func (s *session) readServerInline(sc *ServerConn) {
	for {
		switch s.readServerStep(sc, true) {
		case readerDone:
			return
		case readerHandsOff:
			s.mu.Lock()
			if s.readBudget && !s.woken {
				// A wake-up's deadline stays for the reader to see.
				_ = sc.conn.SetReadDeadline(time.Time{})
			}
			s.readBudget = false
			s.startReaderLocked(sc)
			s.mu.Unlock()
			return
		}
	}
}

// readerStep is what a step of readServer leaves to do.
type readerStep int

const (
	readerReads    readerStep = iota // read sc again
	readerDone                       // sc was released or discarded, or finish takes it over
	readerHandsOff                   // inline only: a reader goroutine takes over
)

// answerWithoutServer replies to a chunk that no server connection will
// see: Sync gets ReadyForQuery, and after a failed checkout (failure != nil)
// each Query gets the error and extended-protocol messages are dropped up
// to their Sync, as Postgres does after an error.
func (s *session) answerWithoutServer(failure *clientError) error {
	reply := s.localReplies[:0]
	errorSent := false
	appendError := func() {
		if failure != nil {
			reply = wire.AppendErrorResponse(reply, failure.severity, failure.code, failure.message)
		}
	}
	for _, m := range s.chunk.messages {
		typ := m.typ
		if s.discarding {
			if typ == wire.MsgSync {
				s.discarding = false
				errorSent = false
				reply = wire.AppendReadyForQuery(reply, wire.TxIdle)
			}
			continue
		}
		switch typ {
		case wire.MsgQuery, wire.MsgFunctionCall:
			appendError()
			reply = wire.AppendReadyForQuery(reply, wire.TxIdle)
		case wire.MsgSync:
			errorSent = false
			reply = wire.AppendReadyForQuery(reply, wire.TxIdle)
		case wire.MsgParse, wire.MsgBind, wire.MsgDescribe, wire.MsgExecute, wire.MsgClose:
			if !errorSent {
				appendError()
				errorSent = true
			}
			s.discarding = true
		}
	}
	s.localReplies = reply[:0]
	if len(reply) == 0 {
		return nil
	}
	return s.write(reply)
}

// readServer relays a linked server connection's output to the client and
// decides the release point: in transaction mode the connection goes back
// to the pool once every Sync and Query the client sent has been answered,
// the last ReadyForQuery says idle, and both streams are at a message
// boundary. The output up to and including that ReadyForQuery is written to
// the client before the release, so a later server's output can never
// overtake it.
//
// readServer owns sc's read side while it runs. It returns in one of three
// ways: after releasing sc to the pool; after discarding a broken sc (and
// ending the client session); or, when the session is closing, leaving sc
// linked for finish to clean up.
func (s *session) readServer(sc *ServerConn) {
	defer s.pooler.wg.Done()
	defer s.readers.Done()
	for s.readServerStep(sc, false) == readerReads {
	}
}

// readServerStep is one read of sc and what follows it, for readServer
// or, with inline set, readServerInline.
func (s *session) readServerStep(sc *ServerConn, inline bool) readerStep {
	n, readErr := sc.read(sc.buf[sc.carried:])
	if n == 0 && readErr != nil {
		s.mu.Lock()
		if s.closingLocked() {
			s.mu.Unlock()
			return readerDone // finish takes sc over
		}
		if s.woken && isTimeout(readErr) {
			s.woken = false
			s.readBudget = false
			_ = sc.conn.SetReadDeadline(time.Time{})
			if s.queryTimedOut {
				s.endTimedOutQueryLocked(sc)
				return readerDone // finish takes sc over
			}
			if s.link.syntheticDue() && s.writeSyntheticLocked(sc) {
				return readerDone
			}
			if s.releaseIfAtRestLocked(sc) {
				return readerDone
			}
			s.mu.Unlock()
			if inline {
				return readerHandsOff
			}
			return readerReads
		}
		if inline && s.readBudget && isTimeout(readErr) {
			s.mu.Unlock()
			return readerHandsOff
		}
		s.mu.Unlock()
		s.dropServer(sc, readErr)
		return readerDone
	}
	total := sc.carried + n
	sc.carried = 0
	s.mu.Lock()
	forward, err := s.takeServerChunkLocked(sc, sc.buf[:total])
	readies, idleReadies := s.link.takeReadies()
	s.mu.Unlock()
	if err != nil {
		s.dropServer(sc, err)
		return readerDone
	}
	var writeErr error
	if len(forward) > 0 {
		writeErr = s.write(forward)
	}
	if partial := sc.scanner.UnreportedLen(); partial > 0 {
		// Held back until the header is whole, so that a reply to be
		// swallowed is never half forwarded; scanned again next time.
		sc.carried = copy(sc.buf, sc.buf[total-partial:total])
		sc.scanner.DropUnreported()
	}
	sc.pool.stats.stripe(s.processID).bytesSent.Add(uint64(len(forward)))
	if readies > 0 {
		s.countReadies(sc, readies, idleReadies)
	}

	s.mu.Lock()
	if writeErr != nil && !s.closingLocked() {
		// The client is gone, or took nothing within
		// client_write_timeout. Closing its connection wakes serve,
		// whose finish takes sc over. serve may be blocked writing
		// the client's requests to the server, which does not read
		// them while its own output waits: the deadline ends that
		// write.
		s.endLocked(stateClosing)
		if s.writing {
			_ = sc.conn.SetWriteDeadline(time.Now())
		}
		s.mu.Unlock()
		s.closeSocket()
		return readerDone
	}
	if s.closingLocked() {
		s.mu.Unlock()
		return readerDone
	}
	if readies > 0 {
		s.watchIdleInTransactionLocked()
		s.queryAnsweredLocked()
	}
	if readies > 0 && s.mode == config.PoolerModeSession && (s.pooler.draining.Load() || sc.pool.removed.Load()) {
		s.mu.Unlock()
		s.endIfLeaving(sc.pool)
		return readerReads
	}
	if readies > 0 && s.releaseIfAtRestLocked(sc) {
		return readerDone
	}
	if inline && (s.link.owed() == nil || !s.link.finishable() || !s.readBudget) {
		// Waiting for the client now (or the budget's deadline went
		// with a probe): a reader of its own waits for the server.
		s.mu.Unlock()
		return readerHandsOff
	}
	s.mu.Unlock()
	return readerReads
}

// takeServerChunkLocked passes each message of a chunk of server output
// to the link, notes the parameters the server reports, and returns what
// is to be forwarded: the chunk without the replies the link swallows and
// without a partial header at the end (which the caller holds back), with
// pgtender's own replies (link.takeSynthetic) and replaced errors in their
// places. The result is the front of chunk, changed in place, unless
// something was inserted; then it is the session's serverOut. An error
// means the server connection is out of step or broken. s.mu must be
// held.
func (s *session) takeServerChunkLocked(sc *ServerConn, chunk []byte) ([]byte, error) {
	out := serverOutput{chunk: chunk, buf: keptScratch(s.serverOut)}
	if sc.skip > 0 {
		// The rest of a swallowed reply that began in an earlier chunk.
		end := min(sc.skip, len(chunk))
		sc.skip -= end
		out.cut(0, end)
	}
	for off := 0; off < len(chunk); {
		var msg wire.Message
		var ok bool
		var err error
		off, msg, ok, err = sc.scanner.Next(chunk, off)
		if err != nil {
			return nil, fmt.Errorf("invalid message from server: %w", err)
		}
		if !ok {
			break
		}
		if s.link.synthetics > 0 && !isAsynchronous(msg.Type) {
			s.insertSyntheticLocked(&out, msg.Start)
		}
		var replaced *statementOp
		if msg.Type == wire.MsgErrorResponse {
			replaced = s.takeServerErrorLocked(sc, msg.Body)
		}
		swallow, err := s.link.serverMessage(msg.Type, msg.Body)
		if err != nil {
			return nil, err
		}
		if swallow {
			// Swallowed replies are of types the scanner reports at their
			// header, which the chunk holds whole (see the caller).
			end := msg.Start + wire.HeaderLen + msg.Length
			if end > len(chunk) {
				sc.skip = end - len(chunk)
				end = len(chunk)
			}
			if replaced != nil {
				s.insertReplacedErrorLocked(&out, msg.Start, replaced)
			}
			out.cut(msg.Start, end)
		}
		if msg.Type == wire.MsgParameterStatus {
			if reportedParameter(parameterStatusName(msg.Body)) != "" {
				// Something the client ran changed a setting, perhaps
				// inside a function where its text did not show it.
				s.settingsMayHaveChanged = true
			}
			sc.noteParameterStatus(msg.Body) // news for the pool's logins (serverparams.go)
		}
	}
	forwardEnd := len(chunk) - sc.scanner.UnreportedLen()
	if s.link.synthetics > 0 && (sc.scanner.UnreportedLen() > 0 || sc.scanner.AtBoundary()) {
		// Between two messages: pgtender's replies due now go here.
		s.insertSyntheticLocked(&out, forwardEnd)
	}
	if len(s.link.settled) > 0 {
		s.applySettledLocked()
	}
	result := out.result(forwardEnd)
	s.serverOut = out.buf[:0]
	return result, nil
}

// insertReplacedErrorLocked puts the error op says in place of the
// server's into out at offset at. Out of line, as takeServerErrorLocked
// is.
//
//go:noinline
func (s *session) insertReplacedErrorLocked(out *serverOutput, at int, op *statementOp) {
	s.replyScratch = appendReplacedError(s.replyScratch[:0], op)
	out.insert(at, s.replyScratch)
}

// takeServerErrorLocked takes in an ErrorResponse before the link does,
// and returns the op whose error replaces it, if any. It is kept out of
// line: readServer starts on a small stack with each link, and the usual
// chunk has no error (see docs/PERFORMANCE.md).
//
//go:noinline
func (s *session) takeServerErrorLocked(sc *ServerConn, body []byte) *statementOp {
	if stmt := s.link.owedStatement(); stmt != nil {
		switch code, message := wire.ErrorFields(body); {
		case string(code) == sqlstateFeatureNotSupported && bytes.HasPrefix(message, []byte(cachedPlanChanged)):
			// A table the statement reads changed shape: every client
			// that prepared it gets this error once it uses it, as from
			// its own backend.
			sc.pool.statements.supersede(stmt)
		case string(code) == sqlstateInvalidStatementName:
			// sc does not hold it after all (something dropped it where
			// pgtender could not see): prepared again next time.
			sc.statements.remove(stmt)
		}
	}
	return s.link.errorReplacement()
}

// isAsynchronous reports whether a server message may come at any time,
// answering no request.
func isAsynchronous(typ byte) bool {
	return typ == wire.MsgNoticeResponse || typ == wire.MsgParameterStatus || typ == wire.MsgNotification
}

// insertSyntheticLocked puts pgtender's replies that are due (their
// requests' turn has come) into out at offset at. s.mu must be held.
func (s *session) insertSyntheticLocked(out *serverOutput, at int) {
	for {
		e, ok := s.link.takeSynthetic()
		if !ok {
			return
		}
		reply, succeeded := appendSyntheticReply(s.replyScratch[:0], e, s.link.txStatus)
		s.replyScratch = reply[:0]
		out.insert(at, reply)
		if !succeeded && e.op != nil {
			e.op.undo(s)
		}
	}
}

// countReadies adds the ReadyForQuery messages passed to the client to the
// session's and the pool's counters: every one answers a request, and
// every one that says idle ends a transaction (an explicit block, or a
// statement run in autocommit).
func (s *session) countReadies(sc *ServerConn, readies, idle int) {
	s.transactions.Add(int64(idle))
	counters := sc.pool.stats.stripe(s.processID)
	counters.transactions.Add(uint64(idle))
	counters.queries.Add(uint64(readies))
}

// writeSyntheticLocked writes pgtender's replies that are due, for
// readServer woken with nothing from the server, and reports whether
// readServer must stop: the client is gone, or the session is closing.
// Only readServer writes the server's side of the stream, so nothing can
// overtake the replies while mu is let go for the write (a client that
// does not read must not hold it). s.mu must be held; it is held on
// return when the result is false, released when true. Out of line, as
// takeServerErrorLocked is.
//
//go:noinline
func (s *session) writeSyntheticLocked(sc *ServerConn) bool {
	replies := s.syntheticRepliesLocked(sc)
	if len(replies) == 0 {
		return false
	}
	readies, idleReadies := s.link.takeReadies()
	s.mu.Unlock()
	s.countReadies(sc, readies, idleReadies)
	writeErr := s.write(replies)
	s.mu.Lock()
	if writeErr != nil && !s.closingLocked() {
		s.endLocked(stateClosing)
		s.mu.Unlock()
		s.closeSocket()
		return true
	}
	if s.closingLocked() {
		s.mu.Unlock()
		return true
	}
	return false
}

// syntheticRepliesLocked returns pgtender's replies that are due, for
// readServer to write when it was woken with nothing from the server
// (link.syntheticDue), or nil. The slice is the session's serverOut. s.mu
// must be held.
func (s *session) syntheticRepliesLocked(sc *ServerConn) []byte {
	if !s.link.syntheticDue() || !(sc.carried > 0 || sc.scanner.AtBoundary()) {
		return nil
	}
	out := serverOutput{buf: s.serverOut[:0]}
	s.insertSyntheticLocked(&out, 0)
	s.serverOut = out.buf[:0]
	return out.result(0)
}

// serverOutput assembles what a chunk of server output becomes on its way
// to the client. Cutting alone changes the chunk in place (the usual case:
// nothing, or a swallowed reply); the first insertion copies what is kept
// so far into buf, where the rest is assembled.
type serverOutput struct {
	chunk []byte
	kept  int // in place: chunk[:kept] is final
	from  int // chunk[from:] is not yet placed
	buf   []byte
	// copying: the output is in buf, not in place.
	copying bool
}

// place moves chunk[from:end] to the output.
func (o *serverOutput) place(end int) {
	if end <= o.from {
		return
	}
	if o.copying {
		o.buf = append(o.buf, o.chunk[o.from:end]...)
	} else {
		if o.kept != o.from {
			copy(o.chunk[o.kept:], o.chunk[o.from:end])
		}
		o.kept += end - o.from
	}
	o.from = end
}

// cut leaves chunk[start:end] out.
func (o *serverOutput) cut(start, end int) {
	o.place(start)
	o.from = max(o.from, end)
}

// insert puts p into the output before chunk[at:]. p is copied.
func (o *serverOutput) insert(at int, p []byte) {
	o.place(at)
	if !o.copying {
		o.buf = append(o.buf[:0], o.chunk[:o.kept]...)
		o.copying = true
	}
	o.buf = append(o.buf, p...)
}

// result places chunk[from:end] and returns the output.
func (o *serverOutput) result(end int) []byte {
	o.place(end)
	if o.copying {
		return o.buf
	}
	return o.chunk[:o.kept]
}

// dropServer ends the session after its linked server connection failed
// or went out of step: the connection is closed, and the client is told
// that what it was doing on it is lost.
func (s *session) dropServer(sc *ServerConn, err error) {
	s.mu.Lock()
	s.unpinLocked(sc)
	s.server = nil
	s.endLocked(stateServerLost)
	s.mu.Unlock()
	sc.pool.Discard(sc)
	s.serverLost(err)
}

// releaseIfAtRestLocked gives sc back to the pool if the link is at the
// release point of transaction mode, probing it first when the client may
// have changed its session's state, and reports whether readServer must
// stop: sc went back to the pool, or the probe failed and sc was
// discarded. It is the one place that decides the release point. It waits
// for a write of client bytes in progress (which can only be of messages
// the server does not answer, since the link learns of answered ones
// before the write begins). s.mu must be held, by the goroutine that reads
// sc; it is released when the result is true.
func (s *session) releaseIfAtRestLocked(sc *ServerConn) bool {
	if s.mode != config.PoolerModeTransaction || !s.releasableLocked(sc) {
		return false
	}
	for s.writing {
		s.cond.Wait()
	}
	if s.closingLocked() || s.server != sc || !s.releasableLocked(sc) {
		return false
	}
	if s.probeDueLocked() {
		release, err := s.probeAtRest(sc)
		if s.closingLocked() {
			// The client left during the probe, which was let finish
			// (wakeReaderLocked): a client that sends SET and closes, as
			// Django does at each connection whose server reports another
			// time zone than its own, would otherwise cost its
			// server connection and the next client a connect. What the
			// probe found clean goes back to the pool; finish would only
			// probe it again.
			return s.releaseAfterProbeLocked(sc, release && err == nil && !s.killed.Load())
		}
		if err != nil {
			// The client's settings are now unknown: its session cannot
			// go on as if they were kept.
			s.mu.Unlock()
			s.dropServer(sc, err)
			return true
		}
		if !release || s.server != sc || !s.releasableLocked(sc) {
			// Pinned, or the client sent more meanwhile.
			return false
		}
	}
	s.releaseLocked(sc)
	return true
}

// releaseAfterProbeLocked ends the link of a session whose client left
// during the probe at its release point: sc goes back to the pool when
// clean (the probe succeeded and found nothing that pins it), and is closed
// otherwise. It always returns true: readServer stops. s.mu must be held;
// it is released.
func (s *session) releaseAfterProbeLocked(sc *ServerConn, clean bool) bool {
	if !clean {
		s.unpinLocked(sc)
		s.server = nil
		s.mu.Unlock()
		sc.pool.Discard(sc)
		return true
	}
	// A cancel of this client's may still be on its way to the backend
	// (a driver cancels, then closes); released now, it could land on the
	// next client's query. returnServer waits so too.
	for s.cancelsInFlight > 0 {
		s.cond.Wait()
	}
	// Shutdown's forceClose may have set a write deadline, and the probe's
	// end a read deadline (the wake-up it gave again): none may go to the
	// pool with the connection.
	_ = sc.conn.SetDeadline(time.Time{})
	s.woken, s.readBudget = false, false
	s.releaseLocked(sc)
	return true
}

// wakeReaderLocked makes readServer, which may be blocked reading sc, look
// at the session again now: when the session is closing it hands sc over
// (to finish), else it checks the release point. It is the one way
// anything interrupts readServer: a read deadline in the past, which
// readServer clears. s.mu must be held and sc must be s.server.
//
// During a probe (probeAtRest) readServer is at the release point already
// and the probe is reading sc: a deadline now would cut the probe short,
// losing the client's session, or, when the session is ending, a server
// connection that the probe, bounded by rollback_timeout, is about to
// find clean. So a wake-up is only noted, and probeAtRest gives it again
// once the probe is done.
func (s *session) wakeReaderLocked(sc *ServerConn) {
	s.woken = true
	if s.probing {
		return
	}
	_ = sc.conn.SetReadDeadline(time.Now())
}

// mayReleaseLocked reports whether the link may be at the release point of
// transaction mode, apart from the server stream, which only readServer
// may look at: then waking readServer (wakeReaderLocked) lets it release.
// s.mu must be held.
func (s *session) mayReleaseLocked() bool {
	return !s.closingLocked() && s.mode == config.PoolerModeTransaction && s.cancelsInFlight == 0 && s.link.atRest()
}

// releaseLocked unlinks sc and gives it back to the pool. s.mu must be held
// by readServer; it is released.
func (s *session) releaseLocked(sc *ServerConn) {
	if s.woken || s.readBudget {
		s.woken, s.readBudget = false, false
		_ = sc.conn.SetReadDeadline(time.Time{})
	}
	s.server = nil
	if s.stateLocked() == stateLinked {
		s.setState(stateIdle)
	}
	s.mu.Unlock()
	pool := sc.pool
	if sc.statements.unknown {
		s.resetAndRelease(sc)
	} else {
		pool.Release(sc)
	}
	s.endIfLeaving(pool)
}

// resetAndRelease resets sc's prepared statements (resetUnknownStatements)
// and gives it back to the pool, or closes it. Out of line, as
// takeServerErrorLocked is.
//
//go:noinline
func (s *session) resetAndRelease(sc *ServerConn) {
	if err := sc.resetUnknownStatements(sc.pool.settings.Load().rollbackTimeout); err != nil {
		s.pooler.log.Info("could not reset a server connection's prepared statements; closing it", s.logFields(zap.Error(err))...)
		sc.pool.Discard(sc)
		return
	}
	sc.pool.Release(sc)
}

// releasableLocked reports whether sc is at the release point, apart from a
// write of client bytes that may still be in progress. s.mu must be held,
// by the goroutine that reads sc.
func (s *session) releasableLocked(sc *ServerConn) bool {
	return s.link.atRest() && s.cancelsInFlight == 0 && sc.atBoundary()
}

// serverLost tells the client its server connection failed and ends the
// session: what the client was doing on it is lost.
func (s *session) serverLost(err error) {
	if !isNormalClose(err) {
		s.pooler.log.Warn("server connection lost", s.logFields(zap.Error(err))...)
	} else {
		s.pooler.log.Info("server connection closed by the server", s.logFields()...)
	}
	s.sendError(wire.SeverityFatal, sqlstateConnectionFailure, "server connection lost")
	s.closeSocket()
}

// finish ends the session: it stops the server reader, if any, and gives
// the server connection back clean (rolled back, and reset in session mode)
// or closes it.
func (s *session) finish() {
	s.mu.Lock()
	s.endLocked(stateClosing)
	s.stopQueryClockLocked()
	sc := s.server
	if sc != nil {
		s.wakeReaderLocked(sc) // it sees closing and hands sc over
	}
	s.mu.Unlock()
	_ = s.conn.Close()
	s.readers.Wait()
	s.mu.Lock()
	sc = s.server
	s.server = nil
	pending, finishable, txStatus := s.link.readiesOwed(), s.link.finishable(), s.link.txStatus
	probe := s.probeDueLocked()
	if sc != nil {
		s.unpinLocked(sc)
		if s.link.opsPending() {
			// Replies that returnServer drops without the link: whether
			// the Parses and Closes in them succeeded is not known.
			sc.statements.unknown = true
		}
	}
	s.mu.Unlock()
	if sc != nil {
		// A half-sent batch or message, or a COPY from the client, can be
		// finished only by the client.
		s.returnServer(sc, pending, !finishable, txStatus, probe)
	}
	s.logDisconnect()
}

// drainBeforeCancel is how long returnServer waits for the replies to a
// departed client's requests before it cancels them: a short query (the
// SELECT 1 of a client that timed out waiting for it) ends sooner, and a
// cancel costs Postgres a connection of its own.
const drainBeforeCancel = 50 * time.Millisecond

// returnServer cleans up a server connection whose client left and gives
// it back to the pool, or closes it when it cannot be made clean within
// rollback_timeout. Requests the client sent whole (queries, Syncs) are
// let finish, or canceled after drainBeforeCancel, and their replies
// dropped; the connection is then rolled back if in a transaction, and
// reused. Replacing it instead would cost a connect and an authentication
// (a SCRAM key derivation), and in a reconnect wave, where clients time out
// with queries pending, that churn starved the logins of CPU
// (docs/PERFORMANCE.md, "Where the time goes"). A connection in the middle
// of an extended-protocol batch or a message, or in a COPY from the client,
// cannot be finished without the client: it is canceled and closed.
//
// When the client may have changed its session's state (probe), the
// connection is probed after that: what it found becomes the connection's
// settings, and a session that holds what only its client could use (a
// LISTEN, an advisory lock: sessionPins) is closed instead.
func (s *session) returnServer(sc *ServerConn, pending int, unfinishable bool, txStatus byte, probe bool) {
	_ = sc.conn.SetDeadline(time.Time{}) // finish's or forceClose's wake-up

	settings := sc.pool.settings.Load()
	cancelRunning := func() {
		ctx, cancel := context.WithTimeout(s.pooler.ctx, time.Second)
		_ = sendCancel(ctx, sc.address, sc.processID, sc.secretKey)
		cancel()
	}
	if s.untrackedSettings || s.killed.Load() {
		// Its session may carry a custom parameter no one can name to
		// reset: not clean whatever a rollback or a probe would find. Or
		// an operator ended the client (KILL_CLIENT), whose transaction
		// is cut: it goes with its connection, as in PgBouncer.
		if unfinishable || pending > 0 {
			cancelRunning()
		}
		sc.pool.Discard(sc)
		return
	}
	if unfinishable {
		// An Execute sent with Flush and no Sync, or a COPY from the
		// client, may still be running: cancel it rather than let it run
		// for nobody.
		cancelRunning()
		sc.pool.Discard(sc)
		return
	}
	if pending > 0 {
		// Errors in those replies do not matter: the client is gone, and
		// a failed transaction is rolled back below.
		status, _, err := sc.drain(pending, time.Now().Add(drainBeforeCancel))
		if isTimeout(err) {
			// Still running: cancel it, then read on to its end. The
			// cancel has reached Postgres when sendCancel returns, so it
			// cannot land on the next client's query.
			cancelRunning()
			status, _, err = sc.drain(pending, time.Now().Add(settings.rollbackTimeout))
		}
		if err != nil {
			if errors.Is(err, errCopyWithoutClient) {
				cancelRunning()
			}
			s.pooler.log.Info("could not finish a departed client's requests; closing the server connection", s.logFields(zap.Error(err))...)
			sc.pool.Discard(sc)
			return
		}
		txStatus = status
	}
	if !sc.scanner.AtBoundary() {
		sc.pool.Discard(sc)
		return
	}
	if txStatus != wire.TxIdle {
		if err := sc.exec("ROLLBACK", settings.rollbackTimeout); err != nil {
			s.pooler.log.Info("could not roll back a server connection; closing it", s.logFields(zap.Error(err))...)
			sc.pool.Discard(sc)
			return
		}
	}
	if settings.mode == config.PoolerModeSession || s.mode == config.PoolerModeSession {
		if err := sc.exec("DISCARD ALL", settings.rollbackTimeout); err != nil {
			s.pooler.log.Info("could not reset a server connection; closing it", s.logFields(zap.Error(err))...)
			sc.pool.Discard(sc)
			return
		}
		sc.settings = nil
		sc.statements.clear()
	} else if probe {
		result, _, err := sc.probe(s.customNamesToProbe(sc), nil)
		if err != nil || result.pins.any() {
			if err != nil {
				s.pooler.log.Info("could not probe a departed client's server connection; closing it", s.logFields(zap.Error(err))...)
			}
			sc.pool.Discard(sc)
			return
		}
		sc.settings = result.settings
	}
	if err := sc.resetUnknownStatements(settings.rollbackTimeout); err != nil {
		s.pooler.log.Info("could not reset a server connection's prepared statements; closing it", s.logFields(zap.Error(err))...)
		sc.pool.Discard(sc)
		return
	}
	// A cancel of this client's may still be on its way to the backend;
	// released now, it could land on the next client's query.
	s.mu.Lock()
	for s.cancelsInFlight > 0 {
		s.cond.Wait()
	}
	s.mu.Unlock()
	sc.pool.Release(sc)
}

// endIfIdle ends the session during shutdown when no transaction is in
// flight on it; a linked session ends when its transaction does.
//
// A session-mode client that is linked but between transactions counts as
// idle: its server connection is reset and released by finish.
func (s *session) endIfIdle() {
	s.endIfIdleBecause("pgtender is shutting down")
}

// endIfLeaving ends the session, if no transaction is in flight on it,
// when nothing will serve its next one: pgtender is draining, or pool (the
// session's, or its server connection's) was closed by a reload that
// removed its database or user. It is called where a transaction ends.
func (s *session) endIfLeaving(pool *Pool) {
	switch {
	case s.pooler.draining.Load():
		s.endIfIdle()
	case pool.removed.Load():
		s.endIfIdleBecause(removedMessage(pool.key))
	}
}

// removedMessage is what a client of a database or user a reload removed
// is told when its session ends.
func removedMessage(key poolKey) string {
	return fmt.Sprintf("pool %s was removed from pgtender's configuration", key)
}

// endIfIdleBecause is endIfIdle, telling the client message (FATAL 57P01).
func (s *session) endIfIdleBecause(message string) {
	s.mu.Lock()
	betweenTransactions := s.mode == config.PoolerModeSession && !s.writing && s.link.atRest()
	if (s.server != nil && !betweenTransactions) || s.stateLocked() >= stateShuttingDown {
		s.mu.Unlock()
		return
	}
	s.endLocked(stateShuttingDown)
	s.mu.Unlock()
	notice := wire.AppendErrorResponse(nil, wire.SeverityFatal, sqlstateAdminShutdown, message)
	if s.wmu.TryLock() {
		s.sendErrorLocked(notice)
		s.wmu.Unlock()
		s.closeSocket()
		return
	}
	// A write is in progress, and may be blocked on a client that does not
	// read (for up to client_write_timeout, or for ever without one):
	// Shutdown, which calls this for every session in turn, must not wait
	// for it. The deadline, set on the socket under any TLS layer, ends
	// that write within a second; the notice follows it.
	_ = s.tcp.SetWriteDeadline(time.Now().Add(time.Second))
	s.pooler.wg.Add(1) // before Shutdown's Wait: this session is not finished yet
	go func() {
		defer s.pooler.wg.Done()
		s.wmu.Lock()
		s.sendErrorLocked(notice)
		s.wmu.Unlock()
		s.closeSocket()
	}()
}

// forceClose ends the session at once, whatever it is doing.
func (s *session) forceClose() {
	s.mu.Lock()
	s.endLocked(stateClosing) // readServer hands the server to finish, which closes it
	if sc := s.server; sc != nil {
		// Under s.mu, so sc cannot have gone back to the pool meanwhile.
		// The write deadline ends a write of serve's that the server does
		// not read.
		s.wakeReaderLocked(sc)
		_ = sc.conn.SetWriteDeadline(time.Now())
	}
	s.mu.Unlock()
	s.closeSocket()
}

func (s *session) logDisconnect() {
	if !s.loggedIn.Load() || !s.pooler.state.Load().cfg.General.LogDisconnections {
		return
	}
	s.pooler.log.Info("client disconnected", s.logFields(
		zap.Duration("duration", time.Since(s.connectedAt)),
		zap.Int64("transactions", s.transactions.Load()),
		zap.Int64("bytes_received", s.bytesReceived.Load()),
		zap.Int64("bytes_sent", s.bytesSent.Load()),
	)...)
}
