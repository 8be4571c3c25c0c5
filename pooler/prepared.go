package pooler

import (
	"bytes"
	"cmp"
	"container/list"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/pooler/wire"
)

// Named prepared statements in transaction mode (prepared_statements =
// "extended"). A client's statement lives on whichever server connection
// its transaction lands on, so pgtender gives each distinct statement of a
// pool (its query, parameter types and the client's search_path) one
// server-side name, pgtender_<n>, shared by every client that prepares the
// same one; each client keeps its own names for them (session.statements);
// and each server connection remembers which statements it holds
// (serverStatements), bounded by prepared_statements_limit.
//
// The relay renames the client's Parse, Bind, Describe and Close of its
// statements as they pass (planChunkLocked); before a message that needs a
// statement the server connection lacks it injects the Parse, whose
// ParseComplete is swallowed; a Parse of a statement the connection
// already has is answered by pgtender in its turn (link.synthesize). The
// same design as PgBouncer's (src/server.c, src/client.c: "prepared
// statements" since 1.21) and PgDog's
// (pgdog/src/frontend/prepared_statements).
//
// What a request does to these maps is done when the request is written
// and undone, in reverse order, if Postgres fails or skips the request
// (statementOp, link.settle): the client's names and each connection's
// statements always say what Postgres holds once its replies are in.

// serverStatementPrefix begins every server-side statement name. A client
// name that begins with it and is not one of the client's own is sent
// as the bare prefix, which never names a statement, so that a client
// cannot run another client's statement by guessing its name.
const serverStatementPrefix = "pgtender_"

// maxStatementNameLen is how much of a statement name Postgres keeps: its
// prepared statements are keys of a hash table of NAMEDATALEN-byte keys
// (commands/prepare.c), so names that agree in their first 63 bytes name
// the same statement.
const maxStatementNameLen = 63

// maxWholeParseLen bounds the Parse messages the relay holds back until
// whole (a statement's text is needed whole to rename it). A longer named
// Parse is refused (scanClientChunk); a longer unnamed one is forwarded as
// it arrives. Postgres itself accepts statements up to 1 GB.
const maxWholeParseLen = 16 << 20

// maxPoolStatements and maxPoolStatementBytes (their texts and keys) bound
// a pool's registry. Past them, statements are forgotten to make room:
// clients that prepared one keep it (their names hold it), and a new
// Parse of its text gets a new name.
const (
	maxPoolStatements     = 10000
	maxPoolStatementBytes = 64 << 20
)

// serverStatementNames numbers server-side statement names, from 1, for
// the process's life: a name is never given to two different statements.
var serverStatementNames atomic.Uint64

// preparedStatement is one statement of a pool's registry, shared by the
// registry, the clients that prepared it and the server connections that
// hold it. Only its atomic flags change once it is made.
type preparedStatement struct {
	name  []byte // the server-side name
	parse []byte // a whole Parse message preparing it under name
	key   string // its registry key
	// resets: its text has RESET ALL or DISCARD ALL (restoreStartupLocked
	// follows its execution).
	resets bool
	// prepared: Postgres has prepared it on some server connection, so
	// its text is valid SQL (under the search_path in its key).
	prepared atomic.Bool
	// superseded: Postgres refused to run it because a table it reads
	// changed shape (0A000, "cached plan must not change result type").
	// A client that prepared it before gets the same error, as it would
	// from its own backend, until it prepares its text again, which then
	// makes a new statement.
	superseded atomic.Bool
}

// statementRegistry is a pool's statements, keyed by search_path, query
// text and parameter types.
type statementRegistry struct {
	mu    sync.Mutex
	byKey map[string]*preparedStatement
	bytes int // of the statements' texts and keys
}

// statementKey appends the registry key of a Parse to dst. The client's
// search_path is part of it: the same text names different tables under
// different paths, and a statement Postgres re-plans under another path
// may change its result type (0A000, "cached plan must not change result
// type"), which a client that never changed its path would not expect.
func statementKey(dst []byte, searchPath string, parse wire.Parse) []byte {
	dst = append(dst, searchPath...)
	dst = append(dst, 0)
	dst = append(dst, parse.Query...)
	dst = append(dst, 0)
	return append(dst, parse.ParamTypes...)
}

// intern returns the pool's statement for key (statementKey), making it
// from parse when there is none.
func (r *statementRegistry) intern(key []byte, parse wire.Parse, resets bool) *preparedStatement {
	r.mu.Lock()
	defer r.mu.Unlock()
	if stmt, ok := r.byKey[string(key)]; ok {
		return stmt
	}
	if r.byKey == nil {
		r.byKey = make(map[string]*preparedStatement)
	}
	name := strconv.AppendUint([]byte(serverStatementPrefix), serverStatementNames.Add(1), 10)
	stmt := &preparedStatement{name: name, parse: wire.AppendParse(nil, name, parse.Query, parse.ParamTypes), key: string(key), resets: resets}
	for k, old := range r.byKey { // any ones: Go's map order is unspecified
		if len(r.byKey) < maxPoolStatements && r.bytes+stmt.size() <= maxPoolStatementBytes {
			break
		}
		delete(r.byKey, k)
		r.bytes -= old.size()
	}
	r.byKey[stmt.key] = stmt
	r.bytes += stmt.size()
	return stmt
}

// size is what stmt costs the registry.
func (stmt *preparedStatement) size() int { return len(stmt.parse) + len(stmt.key) }

// lookup returns the pool's statement for key, or nil.
func (r *statementRegistry) lookup(key []byte) *preparedStatement {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byKey[string(key)]
}

// supersede marks stmt superseded and forgets it, so that the next Parse
// of its text makes a new statement.
func (r *statementRegistry) supersede(stmt *preparedStatement) {
	stmt.superseded.Store(true)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byKey[stmt.key] == stmt {
		delete(r.byKey, stmt.key)
		r.bytes -= stmt.size()
	}
}

// statementInfo is what SHOW PREPARED_STATEMENTS shows of a statement.
type statementInfo struct {
	name, searchPath, query string
	parameters              int  // parameter types the Parse declared
	prepared                bool // Postgres has prepared it on some server connection
	bytes                   int  // what it costs the registry (size)
}

// list returns the registry's statements, ordered by name.
func (r *statementRegistry) list() []statementInfo {
	r.mu.Lock()
	stmts := slices.Collect(maps.Values(r.byKey))
	r.mu.Unlock()
	infos := make([]statementInfo, 0, len(stmts))
	for _, stmt := range stmts {
		searchPath, query, paramTypes := splitStatementKey(stmt.key)
		parameters := 0
		if len(paramTypes) >= 2 { // the Parse's raw section: a count, then the OIDs
			parameters = wire.Parse{ParamTypes: []byte(paramTypes)}.ParamCount()
		}
		infos = append(infos, statementInfo{name: string(stmt.name), searchPath: searchPath, query: query,
			parameters: parameters, prepared: stmt.prepared.Load(), bytes: stmt.size()})
	}
	slices.SortFunc(infos, func(a, b statementInfo) int { return cmp.Compare(a.name, b.name) })
	return infos
}

// splitStatementKey undoes statementKey: the search_path, the query text
// (neither holds a zero byte, which Postgres strings cannot) and the
// Parse's parameter type section (wire.Parse.ParamTypes).
func splitStatementKey(key string) (searchPath, query, paramTypes string) {
	searchPath, rest, _ := strings.Cut(key, "\x00")
	query, paramTypes, _ = strings.Cut(rest, "\x00")
	return searchPath, query, paramTypes
}

// len returns the number of statements, for metrics.
func (r *statementRegistry) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byKey)
}

// serverStatements are the statements a server connection holds (or will
// once the requests written to it are answered), least recently used at
// the back. Owned with the connection.
type serverStatements struct {
	lru   list.List // of *serverStatement
	index map[*preparedStatement]*list.Element
	// unknown: a client's DISCARD ALL or DEALLOCATE ALL, or a request
	// whose outcome was never read, may have dropped statements the
	// connection is thought to hold. It is reset (DEALLOCATE ALL) before
	// another client uses it.
	unknown bool
}

type serverStatement struct {
	stmt *preparedStatement
	// confirmed: Postgres answered the Parse that prepared it here; until
	// then it may yet fail, and a client's Parse of it is not answered
	// by pgtender.
	confirmed bool
}

func (ss *serverStatements) get(stmt *preparedStatement) *serverStatement {
	if e, ok := ss.index[stmt]; ok {
		ss.lru.MoveToFront(e)
		return e.Value.(*serverStatement)
	}
	return nil
}

func (ss *serverStatements) add(stmt *preparedStatement) {
	if ss.index == nil {
		ss.index = make(map[*preparedStatement]*list.Element)
	}
	if e, ok := ss.index[stmt]; ok {
		ss.lru.MoveToFront(e)
		return
	}
	ss.index[stmt] = ss.lru.PushFront(&serverStatement{stmt: stmt})
}

// confirm notes that Postgres prepared stmt here.
func (ss *serverStatements) confirm(stmt *preparedStatement) {
	if e, ok := ss.index[stmt]; ok {
		e.Value.(*serverStatement).confirmed = true
	}
}

func (ss *serverStatements) remove(stmt *preparedStatement) {
	if e, ok := ss.index[stmt]; ok {
		ss.lru.Remove(e)
		delete(ss.index, stmt)
	}
}

// oldest returns the least recently used statement, or nil.
func (ss *serverStatements) oldest() *preparedStatement {
	if e := ss.lru.Back(); e != nil {
		return e.Value.(*serverStatement).stmt
	}
	return nil
}

func (ss *serverStatements) len() int { return len(ss.index) }

// clear forgets every statement (after DEALLOCATE ALL).
func (ss *serverStatements) clear() {
	ss.lru.Init()
	clear(ss.index)
	ss.unknown = false
}

// opKind is what a statementOp changes.
type opKind uint8

const (
	opDefine    opKind = iota + 1 // the client's Parse of name: it now names stmt
	opForget                      // the client's Close or DEALLOCATE of name
	opServerAdd                   // pgtender's Parse of stmt on server
	opEvict                       // pgtender's Close of stmt on server
	opRefuse                      // a request Postgres would refuse: code and message say how
)

// statementOp is a change to the client's statement names or to a server
// connection's statements, made when the request is written and undone if
// it fails or is skipped (undo).
type statementOp struct {
	kind opKind             // 0: none of these (unnamed alone)
	name string             // the client's name (opDefine, opForget)
	prev *preparedStatement // what name named before (nil: nothing)
	stmt *preparedStatement
	// server is where stmt is prepared, closed or deallocated: opDefine
	// when the client's Parse goes to the server, opServerAdd, opEvict,
	// opForget of a DEALLOCATE the server runs.
	server *ServerConn
	// code and message are opRefuse's error.
	code, message string
	// unnamed: the request is a Parse of server's unnamed statement;
	// failed or skipped, whose unnamed statement server holds is unknown.
	unnamed bool
}

// undo reverts op on the session s. s.mu must be held.
func (op *statementOp) undo(s *session) {
	switch op.kind {
	case opDefine, opForget:
		if op.prev == nil {
			delete(s.statements, op.name)
		} else {
			s.defineStatement(op.name, op.prev)
		}
	}
	if op.server == nil {
		return
	}
	if op.unnamed {
		// Skipped, the connection's unnamed statement is what it was
		// before, whosever that was; failed, there is none.
		op.server.unnamedOwner = unnamedUnknown
	}
	switch op.kind {
	case opDefine, opServerAdd:
		op.server.statements.remove(op.stmt)
	case opEvict, opForget:
		op.server.statements.add(op.stmt)
	}
}

// unnamedUnknown is a ServerConn.unnamedOwner that is no session: whose
// the connection's unnamed statement is, if any, is not known, and every
// client's Bind of the unnamed statement is guarded.
const unnamedUnknown = ^uint64(0)

// applySettledLocked takes the ops the link settled and undoes those that
// failed, newest first: all of a failed batch's requests settle together,
// and undoing them in reverse restores what the first one found. s.mu
// must be held.
func (s *session) applySettledLocked() {
	settled := s.link.takeSettled()
	for i := len(settled) - 1; i >= 0; i-- {
		op := settled[i].op
		if !settled[i].ok {
			op.undo(s)
			continue
		}
		if op.server != nil && (op.kind == opDefine || op.kind == opServerAdd) {
			op.stmt.prepared.Store(true)
			op.server.statements.confirm(op.stmt)
		}
	}
}

// prepareWithoutServerLocked answers a chunk of nothing but Parses of
// named statements and Syncs (libpq's PQprepare), from a client that holds
// no server connection, when every statement is one Postgres has already
// prepared for the pool: the client's names are defined, and the Parses
// are sent to a server connection when a Bind or Describe needs them
// (ensureLocked). A client that prepares while other clients hold every
// server connection, and cannot go on until it has its answer (pgbench -M
// prepared runs many clients on one thread), is then not stuck waiting
// for them. It reports false, and does nothing, for any other chunk.
// s.mu must be held.
func (s *session) prepareWithoutServerLocked(summary *chunkSummary) ([]byte, bool) {
	if !s.renaming || summary.localEnd > 0 || summary.drops != dropsNone || s.discarding {
		return nil, false
	}
	statements := s.pendingStatements[:0]
	for i := range summary.messages {
		m := &summary.messages[i]
		switch m.typ {
		case wire.MsgSync, wire.MsgFlush:
			continue
		case wire.MsgParse:
			if !m.whole || len(m.name) == 0 || m.drops != dropsNone {
				return nil, false
			}
			name := statementName(m.name)
			if _, held := s.statements[string(name)]; held {
				return nil, false // 42P05: Postgres says it
			}
			for j := range i {
				if m.typ == summary.messages[j].typ && bytes.Equal(statementName(summary.messages[j].name), name) {
					return nil, false // the second is 42P05
				}
			}
			s.keyScratch = statementKey(s.keyScratch[:0], s.settings["search_path"].value, m.parse)
			stmt := s.pool.statements.lookup(s.keyScratch)
			if stmt == nil || !stmt.prepared.Load() || stmt.superseded.Load() {
				return nil, false
			}
			statements = append(statements, stmt)
			continue
		}
		return nil, false
	}
	reply := s.localReplies[:0]
	parsed := 0
	for i := range summary.messages {
		m := &summary.messages[i]
		switch m.typ {
		case wire.MsgParse:
			s.defineStatement(string(statementName(m.name)), statements[parsed])
			parsed++
			reply = wire.AppendParseComplete(reply)
		case wire.MsgSync:
			reply = wire.AppendReadyForQuery(reply, wire.TxIdle)
		}
	}
	clear(statements)
	s.pendingStatements = statements[:0]
	s.localReplies = reply[:0]
	return reply, true
}

// statementName returns the key of a client's statement name.
func statementName(name []byte) []byte {
	return name[:min(len(name), maxStatementNameLen)]
}

// edit is a change planChunkLocked makes to a client chunk on its way to
// the server: chunk[start:end] is replaced by editBytes[from:to] (start ==
// end inserts).
type edit struct {
	start, end int
	from, to   int
}

// planChunkLocked tells the link about the chunk's messages, in order, and
// works out how the chunk (from summary.localEnd on) must be changed on
// its way to sc: statements renamed, Parses injected where sc lacks a
// statement, requests pgtender answers itself taken out, and the unnamed
// statement kept the client's own. It returns the edits, in chunk order,
// with offsets into chunk. s.mu must be held.
//
// The unnamed statement: each server connection has one, and the one a
// connection holds may be another client's (pgx's describe-exec mode
// parses it in one batch and binds it in the next, which may land on
// another connection). Before a client's Bind or Describe of it on a
// connection whose unnamed statement is not the client's latest, the
// client's latest Parse of it is injected again (its ParseComplete
// swallowed); when pgtender does not have that Parse (it was too long to
// keep, or the client's statement is gone), the connection's statement is
// closed instead (closeUnnamedStatement) and Postgres answers 26000, as it
// would a client whose statement is gone.
func (s *session) planChunkLocked(sc *ServerConn, summary *chunkSummary, chunk []byte) []edit {
	s.edits = s.edits[:0]
	s.editBytes = keptScratch(s.editBytes)
	renaming := s.renaming
	if renaming && summary.drops != dropsNone {
		// A text that began in an earlier chunk ends here.
		s.dropStatementsLocked(sc, summary.drops)
	}
	for i := range summary.messages {
		m := &summary.messages[i]
		m.start -= summary.localEnd
		m.end -= summary.localEnd
		if s.link.skipping {
			// The server reads and drops it: it changes nothing.
			s.link.clientMessage(m.typ)
			continue
		}
		if renaming && m.drops != dropsNone {
			s.dropStatementsLocked(sc, m.drops)
		}
		if renaming && s.renameLocked(sc, m) {
			continue
		}
		s.planUnnamedLocked(sc, m, chunk)
		s.link.clientMessage(m.typ)
		if m.unnamed == unnamedParsed {
			s.link.attach(&sc.unnamedOp)
		}
		switch {
		case m.resets && m.typ == wire.MsgQuery && m.whole:
			s.restoreStartupLocked(m.end)
		case m.resets && m.typ == wire.MsgParse && m.unnamed == unnamedParsed:
			// Run by the Execute of this batch (psycopg 3 sends its
			// commands so); a named one is followed at its Bind
			// (renameLocked).
			s.restoreAfterSync = true
		case m.typ == wire.MsgSync && s.restoreAfterSync && m.whole:
			s.restoreAfterSync = false
			s.restoreStartupLocked(m.end)
		}
	}
	return s.edits
}

// restoreStartupLocked puts, at offset at, a Query of pgtender's that sets
// the client's startup settings again, after a RESET ALL or DISCARD ALL of
// the client's: those put every setting back to its session-start value,
// which on a direct connection is the startup packet's, and on a pooled
// one is the server connection's own. The client's next statement on the
// same link must see its startup values, as it would on its own backend.
// The Query's replies are swallowed (its ParameterStatus messages, which
// the client would have had from its RESET, go through). Not in a failed
// transaction, where the client's RESET failed too. s.mu must be held.
func (s *session) restoreStartupLocked(at int) {
	if len(s.startupSettings) == 0 || s.mode != config.PoolerModeTransaction || s.link.txStatus == wire.TxFailed {
		return
	}
	statements := alignStatements(s.startupSettings, nil)
	if statements == "" {
		return
	}
	s.replace(at, at)
	s.editBytes = wire.AppendQuery(s.editBytes, statements)
	s.endEdit()
	s.link.inject(wire.MsgQuery, nil, false)
}

// planUnnamedLocked keeps sc's unnamed statement the client's own (see
// planChunkLocked) for one message. s.mu must be held.
func (s *session) planUnnamedLocked(sc *ServerConn, m *clientMessage, chunk []byte) {
	switch m.unnamed {
	case unnamedParsed:
		s.unnamedGeneration++
		sc.unnamedOwner, sc.unnamedGeneration = s.serial, s.unnamedGeneration
		s.unnamedParse = keptScratch(s.unnamedParse)
		if m.whole && s.mode == config.PoolerModeTransaction {
			s.unnamedParse = append(s.unnamedParse, chunk[m.start:m.end]...)
		}
	case unnamedDestroyed:
		s.unnamedGeneration++ // the client's own is gone too
		s.unnamedParse = s.unnamedParse[:0]
		// Gone, unless the server skips the message after all (an error
		// before it in the batch): not known.
		sc.unnamedOwner = unnamedUnknown
	case unnamedUsed:
		if sc.unnamedOwner == s.serial && sc.unnamedGeneration == s.unnamedGeneration {
			return
		}
		switch {
		case len(s.unnamedParse) > 0:
			s.insert(m.start, s.unnamedParse)
			s.link.inject(wire.MsgParse, &sc.unnamedOp, false)
			sc.unnamedOwner, sc.unnamedGeneration = s.serial, s.unnamedGeneration
		case sc.unnamedOwner != 0:
			s.insert(m.start, closeUnnamedStatement)
			s.link.inject(wire.MsgClose, nil, false)
			sc.unnamedOwner = 0
		}
	}
}

// renameLocked plans a message that names a prepared statement, when the
// session renames them, and reports whether it did (and told the link);
// false leaves the message to planChunkLocked.
func (s *session) renameLocked(sc *ServerConn, m *clientMessage) bool {
	switch {
	case m.typ == wire.MsgParse && m.whole && len(m.name) > 0:
		s.planParseLocked(sc, m)
		return true
	case m.typ == wire.MsgBind && len(m.name) > 0:
		stmt := s.statements[string(statementName(m.name))]
		if stmt == nil {
			s.guardForeignName(m)
			return false
		}
		if stmt.superseded.Load() && m.whole {
			s.refuseLocked(m, sqlstateFeatureNotSupported, cachedPlanChanged)
			return true
		}
		s.ensureLocked(sc, stmt, m.start)
		s.replace(m.start, m.start+wire.HeaderLen+m.rest)
		s.editBytes = wire.AppendBindPrefix(s.editBytes, m.length, m.rest, m.portal, stmt.name)
		s.endEdit()
		s.link.clientMessage(m.typ)
		s.link.attachStatement(stmt)
		if stmt.resets {
			s.restoreAfterSync = true // it runs in this batch
		}
		return true
	case m.typ == wire.MsgDescribe && m.target == wire.TargetStatement && len(m.name) > 0:
		stmt := s.statements[string(statementName(m.name))]
		if stmt == nil {
			s.guardForeignName(m)
			return false
		}
		if stmt.superseded.Load() {
			s.refuseLocked(m, sqlstateFeatureNotSupported, cachedPlanChanged)
			return true
		}
		s.ensureLocked(sc, stmt, m.start)
		s.replace(m.start, m.end)
		s.editBytes = wire.AppendDescribe(s.editBytes, wire.TargetStatement, stmt.name)
		s.endEdit()
		s.link.clientMessage(m.typ)
		s.link.attachStatement(stmt)
		return true
	case m.typ == wire.MsgClose && m.target == wire.TargetStatement && len(m.name) > 0:
		// The statement stays on the server for other clients. Postgres
		// answers a Close of a name that does not exist as it answers one
		// that does, so a Close of the bare prefix, which names nothing,
		// gets the client its CloseComplete in its turn.
		name := string(statementName(m.name))
		op := &statementOp{kind: opForget, name: name, prev: s.statements[name]}
		delete(s.statements, name)
		s.replace(m.start, m.end)
		s.editBytes = wire.AppendClose(s.editBytes, wire.TargetStatement, []byte(serverStatementPrefix))
		s.endEdit()
		s.link.clientMessage(m.typ)
		s.link.attach(op)
		return true
	case m.typ == wire.MsgQuery && m.deallocate != nil:
		return s.planDeallocateLocked(sc, m)
	case m.typ == wire.MsgParse && m.deallocate != nil:
		return s.planDeallocateParseLocked(sc, m)
	}
	return false
}

// planParseLocked plans a client's whole Parse of a named statement.
func (s *session) planParseLocked(sc *ServerConn, m *clientMessage) {
	name := string(statementName(m.name))
	if _, held := s.statements[name]; held {
		s.refuseLocked(m, sqlstateDuplicatePreparedStatement, "prepared statement \""+name+"\" already exists")
		return
	}
	if len(s.statements) >= maxClientStatements {
		s.refuseLocked(m, sqlstateProgramLimitExceeded, fmt.Sprintf(
			"a client of pgtender may hold %d prepared statements; deallocate some first", maxClientStatements))
		return
	}
	s.keyScratch = statementKey(s.keyScratch[:0], s.settings["search_path"].value, m.parse)
	stmt := sc.pool.statements.intern(s.keyScratch, m.parse, m.resets)
	s.defineStatement(name, stmt)
	op := &statementOp{kind: opDefine, name: name, stmt: stmt}
	// Answered by pgtender only when Postgres is known to hold it here and
	// would answer ParseComplete: not in a failed transaction (25P02, but
	// for ROLLBACK), not while it is unknown which replies the server
	// still owes (link.uncertain).
	if held := sc.statements.get(stmt); held != nil && held.confirmed && s.link.txStatus != wire.TxFailed && !s.link.uncertain {
		s.replace(m.start, m.end)
		s.endEdit()
		s.link.synthesize(expectParse, op)
		return
	}
	s.prepareOnServerLocked(sc, stmt, m.start)
	op.server = sc
	s.replace(m.start, m.end)
	s.editBytes = append(s.editBytes, stmt.parse...)
	s.endEdit()
	s.link.clientMessage(wire.MsgParse)
	s.link.attach(op)
}

// maxClientStatements bounds the prepared statements one client holds.
const maxClientStatements = 10000

// ensureLocked makes sure sc holds stmt before the message at offset at:
// when it does not, its Parse is injected there.
func (s *session) ensureLocked(sc *ServerConn, stmt *preparedStatement, at int) {
	if sc.statements.get(stmt) != nil {
		return
	}
	s.prepareOnServerLocked(sc, stmt, at)
	s.insert(at, stmt.parse)
	s.link.inject(wire.MsgParse, &statementOp{kind: opServerAdd, stmt: stmt, server: sc}, false)
}

// prepareOnServerLocked plans, at offset at, what goes before a Parse of
// stmt on sc: Closes that make room within prepared_statements_limit (the
// least recently used statements), and a Close of stmt itself, so that
// the Parse succeeds whether or not sc holds it after all (a request whose
// outcome pgtender could not follow); and it counts stmt as held.
func (s *session) prepareOnServerLocked(sc *ServerConn, stmt *preparedStatement, at int) {
	sc.statements.remove(stmt)
	limit := sc.pool.settings.Load().preparedStatementsLimit
	for limit > 0 && sc.statements.len() >= limit {
		s.closeOnServerLocked(sc, sc.statements.oldest(), at)
		sc.pool.stats.statementsEvicted.Add(1)
	}
	s.insertClose(at, stmt.name)
	s.link.inject(wire.MsgClose, nil, false)
	sc.statements.add(stmt)
	sc.pool.stats.statementParses.Add(1)
}

func (s *session) closeOnServerLocked(sc *ServerConn, stmt *preparedStatement, at int) {
	sc.statements.remove(stmt)
	s.insertClose(at, stmt.name)
	s.link.inject(wire.MsgClose, &statementOp{kind: opEvict, stmt: stmt, server: sc}, false)
}

// guardForeignName sends a name the client never prepared, and that could
// be one of pgtender's, as the bare prefix: Postgres then answers 26000
// (the message names the prefix, not the client's name).
func (s *session) guardForeignName(m *clientMessage) {
	if !bytes.HasPrefix(m.name, []byte(serverStatementPrefix)) || len(m.name) == len(serverStatementPrefix) {
		return
	}
	switch m.typ {
	case wire.MsgBind:
		s.replace(m.start, m.start+wire.HeaderLen+m.rest)
		s.editBytes = wire.AppendBindPrefix(s.editBytes, m.length, m.rest, m.portal, []byte(serverStatementPrefix))
	case wire.MsgDescribe:
		s.replace(m.start, m.end)
		s.editBytes = wire.AppendDescribe(s.editBytes, wire.TargetStatement, []byte(serverStatementPrefix))
	}
	s.endEdit()
}

// planDeallocateParseLocked plans a Parse of the unnamed statement whose
// text is DEALLOCATE name of one of the client's renamed statements: it
// becomes a DEALLOCATE of the server-side name (prepared first if sc lacks
// it), so that its Execute answers as the client expects; sc and the
// client no longer hold the statement. The unnamed statement is then the
// client's, but cannot be prepared again elsewhere.
func (s *session) planDeallocateParseLocked(sc *ServerConn, m *clientMessage) bool {
	name := string(statementName(m.deallocate))
	stmt, held := s.statements[name]
	if !held {
		if bytes.HasPrefix(m.deallocate, []byte(serverStatementPrefix)) {
			s.dropStatementsLocked(sc, dropsUnknown)
		}
		return false
	}
	s.ensureLocked(sc, stmt, m.start)
	delete(s.statements, name)
	sc.statements.remove(stmt)
	// Dropped when the unnamed statement is executed, which may never
	// be: what sc holds is certain again only after a reset.
	sc.statements.unknown = true
	s.replace(m.start, m.end)
	s.editBytes = wire.AppendParse(s.editBytes, nil, append([]byte("DEALLOCATE "), stmt.name...), m.parse.ParamTypes)
	s.endEdit()
	s.link.clientMessage(wire.MsgParse)
	s.link.attach(&statementOp{kind: opForget, name: name, prev: stmt, stmt: stmt, server: sc, unnamed: true})
	// The unnamed statement is now the client's, this text, which cannot
	// be prepared again elsewhere.
	s.unnamedGeneration++
	s.unnamedParse = s.unnamedParse[:0]
	sc.unnamedOwner, sc.unnamedGeneration = s.serial, s.unnamedGeneration
	return true
}

// planDeallocateLocked plans a Query that is nothing but DEALLOCATE name
// of one of the client's renamed statements: pgtender answers it (the
// server knows the statement by another name). DEALLOCATE of another name
// (SQL PREPARE's, or none) goes to Postgres.
func (s *session) planDeallocateLocked(sc *ServerConn, m *clientMessage) bool {
	name := string(statementName(m.deallocate))
	stmt, held := s.statements[name]
	if !held || s.link.uncertain {
		if !held && bytes.HasPrefix(m.deallocate, []byte(serverStatementPrefix)) {
			// One of pgtender's names, by another client: Postgres may
			// drop it.
			s.dropStatementsLocked(sc, dropsUnknown)
		}
		return false
	}
	delete(s.statements, name)
	s.replace(m.start, m.end)
	s.endEdit()
	s.link.synthesize(expectQuery, &statementOp{kind: opForget, name: name, prev: stmt})
	return true
}

// dropStatementsLocked takes in, at its place in the client's stream to
// sc, a text that drops prepared statements: DEALLOCATE ALL or DISCARD
// ALL drop all of the client's names and everything sc holds once it
// runs; a DEALLOCATE pgtender does not follow (among other statements,
// run by a named statement, of one of pgtender's names) may drop any of
// sc's. Whether it ran is not followed: sc is reset before another
// client uses it (serverStatements.unknown), and meanwhile a statement is
// prepared again when needed. s.mu must be held.
func (s *session) dropStatementsLocked(sc *ServerConn, drops statementDrops) {
	if drops == dropsAll {
		clear(s.statements)
	}
	sc.statements.clear()
	sc.statements.unknown = true
}

// appendSyntheticReply appends pgtender's answer to a request it took out
// of the stream (link.takeSynthetic), given the transaction status the
// server's last ReadyForQuery reported, and reports whether the request
// succeeded (as Postgres would have answered it).
func appendSyntheticReply(dst []byte, e expectation, txStatus byte) ([]byte, bool) {
	switch e.kind {
	case expectParse:
		return wire.AppendParseComplete(dst), true
	case expectQuery: // DEALLOCATE name
		if txStatus == wire.TxFailed {
			dst = wire.AppendErrorResponse(dst, wire.SeverityError, sqlstateInFailedTransaction,
				"current transaction is aborted, commands ignored until end of transaction block")
			return wire.AppendReadyForQuery(dst, txStatus), false
		}
		dst = wire.AppendCommandComplete(dst, "DEALLOCATE")
		return wire.AppendReadyForQuery(dst, txStatus), true
	}
	panic("BUG: no synthetic reply for " + e.kind.String())
}

// appendReplacedError appends the error that replaces the server's for
// pgtender's failing Parse (opRefuse).
func appendReplacedError(dst []byte, op *statementOp) []byte {
	return wire.AppendErrorResponse(dst, wire.SeverityError, op.code, op.message)
}

// cachedPlanChanged is Postgres's message for 0A000 when a prepared
// statement's result type changed (utils/cache/plancache.c).
const cachedPlanChanged = "cached plan must not change result type"

// refuseLocked replaces the whole message m by a request that fails on the
// server, whose error is replaced by code and message: Postgres would
// have refused m, and after an error in the extended protocol the server
// must skip to Sync as it would have.
func (s *session) refuseLocked(m *clientMessage, code, message string) {
	s.replace(m.start, m.end)
	s.editBytes = append(s.editBytes, failingParse...)
	s.endEdit()
	s.link.inject(wire.MsgParse, &statementOp{kind: opRefuse, code: code, message: message}, true)
}

// failingParse is a Parse that Postgres refuses at once (a syntax error)
// without touching any statement: it stands in for a client's Parse that
// Postgres would refuse, so that the server skips to Sync as it would
// have.
var failingParse = wire.AppendParse(nil, []byte(serverStatementPrefix), []byte("pgtender: refused"), nil)

// resetUnknownStatements drops every statement on sc when what it holds
// is unknown (serverStatements.unknown), before sc serves another client.
// sc must be at rest and owned by the caller.
func (sc *ServerConn) resetUnknownStatements(timeout time.Duration) error {
	if !sc.statements.unknown {
		return nil
	}
	if err := sc.exec("DEALLOCATE ALL", timeout); err != nil {
		return err
	}
	sc.statements.clear()
	return nil
}

// maxKeptScratch bounds the scratch buffers a session keeps between uses:
// one that grew past it for a long message is let go.
const maxKeptScratch = 64 << 10

// keptScratch returns b emptied, or nil when it grew past maxKeptScratch.
func keptScratch(b []byte) []byte {
	if cap(b) > maxKeptScratch {
		return nil
	}
	return b[:0]
}

// replace starts an edit replacing chunk[start:end]; the replacement is
// what is appended to s.editBytes until endEdit.
func (s *session) replace(start, end int) {
	s.edits = append(s.edits, edit{start: start, end: end, from: len(s.editBytes)})
}

// endEdit ends the edit replace started.
func (s *session) endEdit() {
	s.edits[len(s.edits)-1].to = len(s.editBytes)
}

// insert plans p inserted at offset at.
func (s *session) insert(at int, p []byte) {
	s.replace(at, at)
	s.editBytes = append(s.editBytes, p...)
	s.endEdit()
}

// insertClose plans a Close of the statement name inserted at offset at.
func (s *session) insertClose(at int, name []byte) {
	s.replace(at, at)
	s.editBytes = wire.AppendClose(s.editBytes, wire.TargetStatement, name)
	s.endEdit()
}

// defineStatement records the client's statement name as stmt. The map is
// made at the first one: most clients of a transaction pool prepare none,
// and an idle session should cost little (docs/pooling.md, "What an idle
// client holds").
func (s *session) defineStatement(name string, stmt *preparedStatement) {
	if s.statements == nil {
		s.statements = make(map[string]*preparedStatement)
	}
	s.statements[name] = stmt
}
