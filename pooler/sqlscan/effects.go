// Package sqlscan classifies SQL text by what it may do to the state of the
// server session that runs it, without buffering or parsing the text.
//
// The pooler relays a client's Query and Parse messages in whatever pieces
// its reads produce, so the text arrives split at arbitrary bytes. A Scanner
// follows PostgreSQL's own lexer (src/backend/parser/scan.l) across those
// splits with a fixed amount of state, and looks only at what decides the
// question: the leading keywords of each statement, and a handful of
// function and schema names anywhere outside strings and comments.
//
// The answer errs on one side. Flagging a harmless text costs the pooler one
// extra round trip (a settings re-probe, or a connection kept a little
// longer); missing a state change hands one client's session state to the
// next client of the same server connection. Where the lexer cannot follow
// the text, or a construct is ambiguous, the Scanner flags.
//
// What no lexer can see: a function or procedure body (SELECT f(), CALL p())
// may run any SQL, including SET and CREATE TEMP TABLE. Only the built-in
// functions named below are recognised; DO blocks are flagged as such.
//
// Besides the Effects, a Scanner captures the names of the custom
// parameters ("app.tenant") a text sets (NumCustomNames, CustomName), which
// the server lists nowhere a pooler could look them up.
package sqlscan

import (
	"strconv"
	"strings"
)

// Effects is a bit set of what the statements in a text may do to session
// state. A bit means "may": the Scanner flags on syntax, not on whether the
// statement will succeed.
type Effects uint32

const (
	// SetsSetting: SET or SET SESSION (any form, including SET ROLE, SET
	// SESSION AUTHORIZATION, SET TIME ZONE, SET NAMES, SET SCHEMA, SET XML
	// OPTION, SET SESSION CHARACTERISTICS), RESET name, a call to
	// set_config, or an UPDATE of pg_settings (whose rule calls set_config).
	// Not SET LOCAL, SET TRANSACTION or SET CONSTRAINTS, which end with the
	// transaction. The custom parameters it names are captured
	// (CustomName).
	SetsSetting Effects = 1 << iota
	// ResetsAll: RESET ALL or DISCARD ALL, which put every setting back to
	// its session-start value.
	ResetsAll
	// DiscardAll: DISCARD ALL.
	DiscardAll
	// DiscardOther: DISCARD PLANS, SEQUENCES, TEMP or TEMPORARY.
	DiscardOther
	// Prepare: the SQL-level PREPARE name AS ... (not PREPARE TRANSACTION).
	Prepare
	// Deallocate: DEALLOCATE [PREPARE] name or ALL.
	Deallocate
	// Listen: LISTEN.
	Listen
	// Unlisten: UNLISTEN.
	Unlisten
	// AdvisoryLock: a session-level advisory lock function
	// (pg_advisory_lock, pg_advisory_lock_shared, pg_try_advisory_lock,
	// pg_try_advisory_lock_shared); the _xact_ variants end with the
	// transaction and are not flagged.
	AdvisoryLock
	// AdvisoryUnlock: pg_advisory_unlock, pg_advisory_unlock_shared,
	// pg_advisory_unlock_all.
	AdvisoryUnlock
	// TempObject: CREATE [OR REPLACE] [GLOBAL | LOCAL] {TEMP | TEMPORARY},
	// SELECT ... INTO [GLOBAL | LOCAL] {TEMP | TEMPORARY}, or any mention of
	// the pg_temp schema (pg_temp, pg_temp_N).
	TempObject
	// HoldCursor: DECLARE ... WITH HOLD, a cursor that outlives its
	// transaction.
	HoldCursor
	// CloseCursor: CLOSE name or ALL.
	CloseCursor
	// DoBlock: DO, an anonymous code block whose body cannot be seen into.
	DoBlock
	// LoadLibrary: LOAD, which may define settings and run the library's
	// initialisation.
	LoadLibrary
	// Uncertain: the Scanner could not follow the text (a dollar-quote tag
	// longer than it keeps, or a Unicode-escaped U&"identifier" that may
	// spell any name). Assume any effect.
	Uncertain
	// UnknownCustomName: a statement may set a custom parameter (a name
	// with a dot, "app.tenant") whose name the Scanner could not capture
	// (CustomName): set_config with a first argument other than a lone
	// string literal and a third other than the literal TRUE, or more
	// names than the Scanner keeps.
	UnknownCustomName
)

// effectNames are in bit order, for String.
var effectNames = [...]string{
	"SetsSetting", "ResetsAll", "DiscardAll", "DiscardOther", "Prepare",
	"Deallocate", "Listen", "Unlisten", "AdvisoryLock", "AdvisoryUnlock",
	"TempObject", "HoldCursor", "CloseCursor", "DoBlock", "LoadLibrary",
	"Uncertain", "UnknownCustomName",
}

// String lists the bits set, joined by "|", or "none". It is for logs and
// tests, not the hot path: it allocates.
func (e Effects) String() string {
	if e == 0 {
		return "none"
	}
	var names []string
	for i, name := range effectNames {
		if e&(1<<i) != 0 {
			names = append(names, name)
		}
	}
	if rest := e &^ (1<<len(effectNames) - 1); rest != 0 {
		names = append(names, "0x"+strconv.FormatUint(uint64(rest), 16))
	}
	return strings.Join(names, "|")
}

// settingEffects may leave the session's settings different from what the
// pooler last saw: a DO block or a loaded library can run SET, and
// Uncertain can be anything.
const settingEffects = SetsSetting | ResetsAll | DiscardAll | DoBlock | LoadLibrary | Uncertain | UnknownCustomName

// sessionEffects may leave state on the server connection that only this
// client's later statements may use: a prepared statement, a notification
// channel, a lock, a temporary object, a holdable cursor, a loaded library,
// a custom parameter no one can name to reset it.
const sessionEffects = Prepare | Listen | AdvisoryLock | TempObject | HoldCursor | DoBlock | LoadLibrary | Uncertain | UnknownCustomName

// unknownNameEffects may set a custom parameter whose name the text does
// not show to the Scanner.
const unknownNameEffects = UnknownCustomName | Uncertain

// MayChangeSettings reports whether the pooler should re-read the server's
// session settings once the transaction ends.
func (e Effects) MayChangeSettings() bool { return e&settingEffects != 0 }

// NeedsSession reports whether the server connection should stay with this
// client: the text may have created state that lives past the transaction
// and belongs to this client alone.
func (e Effects) NeedsSession() bool { return e&sessionEffects != 0 }

// MaySetUnnamedCustom reports whether the text may set a custom parameter
// at session level that is not among the names the Scanner captured
// (CustomName): nothing but the server session itself will know it is
// set, so no probe that asks for names can find it.
func (e Effects) MaySetUnnamedCustom() bool { return e&unknownNameEffects != 0 }
