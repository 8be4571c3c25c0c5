package pooler

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/pgtender/pgtender/pooler/wire"
)

// The probe asks a server connection, at the end of a transaction that may
// have changed its session's state, what that state now is: every
// parameter set at session level, and whatever ties the session to the
// client that made it (pins). The relay decides when a probe is due from
// what the client sent (the statements' text, a ParameterStatus the server
// sent during a request); the probe itself trusts only the server.
//
// Everything in it is schema-qualified, operators included: the client
// owns the session's search_path, and a function or operator of its own
// must not be able to answer for pg_catalog's.

// sessionPins counts what a session holds that lives on its server
// connection and cannot follow the client to another: while any is held the
// server connection stays linked to the client (it is pinned), as if in
// session mode.
type sessionPins struct {
	listening     int // channels LISTENed to
	advisoryLocks int // session-level advisory locks held
	holdCursors   int // cursors declared WITH HOLD
	sqlPrepared   int // statements prepared with SQL PREPARE
	tempRelations int // temporary tables, views, sequences
}

func (p sessionPins) any() bool {
	return p.listening > 0 || p.advisoryLocks > 0 || p.holdCursors > 0 || p.sqlPrepared > 0 || p.tempRelations > 0
}

// String names what is held, for logs.
func (p sessionPins) String() string {
	var held []string
	for _, pin := range []struct {
		n    int
		what string
	}{
		{p.listening, "LISTEN"}, {p.advisoryLocks, "advisory locks"}, {p.holdCursors, "WITH HOLD cursors"},
		{p.sqlPrepared, "PREPARE"}, {p.tempRelations, "temporary tables"},
	} {
		if pin.n > 0 {
			held = append(held, pin.what)
		}
	}
	if len(held) == 0 {
		return "nothing"
	}
	return strings.Join(held, ", ")
}

// probeResult is what a probe found.
type probeResult struct {
	settings sessionSettings
	pins     sessionPins
	// The timeouts' values and session-start values (probeTimeouts).
	timeouts, timeoutDefaults map[string]string
}

// finish takes the timeouts into the settings: a timeout is the client's
// when it differs from its session-start value.
func (r *probeResult) finish() {
	for name, value := range r.timeouts {
		if def, ok := r.timeoutDefaults[name]; ok && def != value {
			if r.settings == nil {
				r.settings = make(sessionSettings)
			}
			r.settings.set(name, value)
		}
	}
}

// Row kinds of the probe query.
const (
	probeSetting = "s" // a parameter set at session level, and its value
	probePin     = "p" // a count of something that pins the session
	probeCurrent = "c" // a timeout's value before the probe overrides it
	probeDefault = "d" // that timeout's session-start value
)

// probeTimeouts are the settings that could cancel the probe itself, which
// it overrides for its own transaction (ownQueryPrefix) after reading them:
// under the override pg_settings shows the override. One is the client's
// own when its value differs from the session-start one.
var probeTimeouts = []string{"statement_timeout", "lock_timeout"}

// probeQuery returns the probe's SQL: rows of (kind, name, value). Custom
// parameters (names with a dot, "app.tenant") are invisible to pg_settings
// until an extension defines them, and so is role: customNames lists the
// custom ones to ask for by name. A custom parameter once set on a backend
// cannot be removed, only reset to the empty string, which is taken as
// unset.
//
// The timeouts are read first, in a statement of their own that runs under
// them (it takes microseconds); the rest runs with them off.
func probeQuery(customNames []string) string {
	var b strings.Builder
	for i, name := range probeTimeouts {
		if i > 0 {
			b.WriteString(" UNION ALL ")
		}
		b.WriteString(`SELECT 'c', ` + quoteLiteral(name) + `, pg_catalog.current_setting(` + quoteLiteral(name) + `)`)
	}
	b.WriteString("; ")
	b.WriteString(ownQueryPrefix)
	b.WriteString(`SELECT 's', name, pg_catalog.current_setting(name) FROM pg_catalog.pg_settings WHERE source OPERATOR(pg_catalog.=) 'session'`)
	b.WriteString(` AND name OPERATOR(pg_catalog.<>) ALL ('{statement_timeout,lock_timeout}'::pg_catalog.text[])`)
	// set_config(…, true) to the session-start value: its display form,
	// for this transaction only.
	b.WriteString(` UNION ALL SELECT 'd', name, pg_catalog.set_config(name, reset_val, true) FROM pg_catalog.pg_settings`)
	b.WriteString(` WHERE name OPERATOR(pg_catalog.=) ANY ('{statement_timeout,lock_timeout}'::pg_catalog.text[])`)
	b.WriteString(` UNION ALL SELECT 's', 'role', pg_catalog.current_setting('role') WHERE pg_catalog.current_setting('role') OPERATOR(pg_catalog.<>) 'none'`)
	if len(customNames) > 0 {
		b.WriteString(` UNION ALL SELECT 's', n, pg_catalog.current_setting(n, true) FROM (VALUES `)
		for i, name := range customNames {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(" + quoteLiteral(name) + "::pg_catalog.text)")
		}
		b.WriteString(`) AS custom(n) WHERE pg_catalog.current_setting(n, true) OPERATOR(pg_catalog.<>) ''`)
	}
	b.WriteString(` UNION ALL SELECT 'p', 'listen', pg_catalog.count(*)::pg_catalog.text FROM pg_catalog.pg_listening_channels()`)
	b.WriteString(` UNION ALL SELECT 'p', 'advisory', pg_catalog.count(*)::pg_catalog.text FROM pg_catalog.pg_locks WHERE locktype OPERATOR(pg_catalog.=) 'advisory' AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()`)
	b.WriteString(` UNION ALL SELECT 'p', 'cursor', pg_catalog.count(*)::pg_catalog.text FROM pg_catalog.pg_cursors WHERE is_holdable`)
	b.WriteString(` UNION ALL SELECT 'p', 'prepare', pg_catalog.count(*)::pg_catalog.text FROM pg_catalog.pg_prepared_statements WHERE from_sql`)
	b.WriteString(` UNION ALL SELECT 'p', 'temp', pg_catalog.count(*)::pg_catalog.text FROM pg_catalog.pg_class WHERE relnamespace OPERATOR(pg_catalog.=) pg_catalog.pg_my_temp_schema()`)
	return b.String()
}

// takeProbeRow adds one row of the probe's result to r.
func (r *probeResult) takeProbeRow(values [][]byte) error {
	if len(values) != 3 || values[0] == nil || values[1] == nil || values[2] == nil {
		return errors.New("probe: unexpected row shape")
	}
	name, value := string(values[1]), string(values[2])
	switch string(values[0]) {
	case probeSetting:
		if r.settings == nil {
			r.settings = make(sessionSettings)
		}
		r.settings.set(name, value)
		return nil
	case probeCurrent, probeDefault:
		target := &r.timeouts
		if string(values[0]) == probeDefault {
			target = &r.timeoutDefaults
		}
		if *target == nil {
			*target = make(map[string]string, len(probeTimeouts))
		}
		(*target)[name] = value
		return nil
	case probePin:
		n, err := strconv.Atoi(value)
		if err != nil {
			return fmt.Errorf("probe: pin %s: %w", name, err)
		}
		switch name {
		case "listen":
			r.pins.listening = n
		case "advisory":
			r.pins.advisoryLocks = n
		case "cursor":
			r.pins.holdCursors = n
		case "prepare":
			r.pins.sqlPrepared = n
		case "temp":
			r.pins.tempRelations = n
		}
		return nil
	}
	return errors.New("probe: unexpected row kind")
}

// ownQueryPrefix starts every query pgtender runs on a server connection
// whose session carries a client's settings (the probe, bringing it in
// line, checking startup settings): the client's statement_timeout or
// lock_timeout must not cancel pgtender's own work. A simple Query with
// several statements runs them in one implicit transaction, in which SET
// LOCAL holds until its end and a session-level set_config or RESET that
// follows still persists.
const ownQueryPrefix = "SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0; "

// serverError is an ErrorResponse from Postgres to a query pgtender ran
// itself; its code and message may be shown to the client the query was
// run for (a startup parameter Postgres refused).
type serverError struct {
	code, message string
}

func (e *serverError) Error() string { return e.code + " " + e.message }

// maxQueryMessageLen bounds one message of a reply to a query of
// pgtender's own (a probe row is a parameter's name and value).
const maxQueryMessageLen = 1 << 20

// query runs one simple-protocol query of pgtender's own on sc, which must
// be at rest, within deadline, and passes the values of each DataRow to row
// (they alias a buffer reused for the next row). A NotificationResponse
// that arrives meanwhile belongs to the client that LISTENs on this session
// and is passed to notify (nil: dropped). An ErrorResponse is returned as a
// *serverError once the ReadyForQuery has come; any other error leaves the
// connection unusable. Messages the server sent after the ReadyForQuery
// (notifications, again) are left at the front of sc.buf, and their length
// returned, for the relay to pass on.
func (sc *ServerConn) query(sql string, deadline time.Time, row func(values [][]byte) error, notify func(msg []byte)) (leftover int, err error) {
	if !sc.atBoundary() {
		return 0, errors.New("server connection is in the middle of a message")
	}
	sc.unnamedOwner = 0 // a simple Query destroys the unnamed statement
	_ = sc.conn.SetDeadline(deadline)
	defer sc.conn.SetDeadline(time.Time{})
	if _, err := sc.conn.Write(wire.AppendQuery(nil, sql)); err != nil {
		return 0, err
	}
	reader := wire.NewReader(sc.conn, sc.buf, maxQueryMessageLen)
	var failure error
	var values [][]byte
	for {
		typ, body, err := reader.ReadMessage()
		if err != nil {
			return 0, err
		}
		switch typ {
		case wire.MsgDataRow:
			values, err = wire.DecodeDataRow(body, values[:0])
			if err == nil && row != nil && failure == nil {
				err = row(values)
			}
			if err != nil {
				failure = err
			}
		case wire.MsgErrorResponse:
			if failure == nil {
				code, message := wire.ErrorFields(body)
				failure = &serverError{code: string(code), message: string(message)}
			}
		case wire.MsgNotification:
			if notify != nil {
				notify(wire.AppendMessage(nil, typ, body))
			}
		case wire.MsgParameterStatus:
			// Of a setting the query changed, which the caller records;
			// or news of the server's own (serverparams.go).
			sc.noteParameterStatus(body)
		case wire.MsgCopyInResponse, wire.MsgCopyOutResponse, wire.MsgCopyBothResponse:
			return 0, errors.New("unexpected COPY in reply to pgtender's own query")
		case wire.MsgReadyForQuery:
			if len(body) != 1 {
				return 0, errors.New("malformed ReadyForQuery")
			}
			if body[0] != wire.TxIdle {
				return 0, fmt.Errorf("%q left the connection in a transaction", sql)
			}
			rest := reader.Buffered()
			leftover = copy(sc.buf, rest)
			if leftover < len(rest) {
				return 0, errors.New("too much server output after pgtender's own query")
			}
			return leftover, failure
		}
		// RowDescription, CommandComplete, NoticeResponse.
	}
}
