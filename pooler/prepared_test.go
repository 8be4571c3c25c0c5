package pooler

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/pooler/wire"
)

// statementsFixture is a pool with one server connection and sessions on
// it, for planning chunks without sockets.
type statementsFixture struct {
	pool   *Pool
	server *ServerConn
}

func newStatementsFixture(limit int) *statementsFixture {
	pool := newPool(poolKey{user: "app", database: "db"}, poolSettings{
		size: 1, mode: config.PoolerModeTransaction, preparedStatements: true, preparedStatementsLimit: limit,
	}, func(context.Context) (*ServerConn, error) { return nil, fmt.Errorf("no connects here") })
	sc := &ServerConn{pool: pool}
	sc.unnamedOp = statementOp{server: sc, unnamed: true}
	return &statementsFixture{pool: pool, server: sc}
}

func (f *statementsFixture) session() *session {
	s := &session{pool: f.pool, mode: config.PoolerModeTransaction, renaming: true,
		statements: make(map[string]*preparedStatement), serial: sessionSerials.Add(1)}
	s.link.reset()
	s.takeScanner()
	return s
}

// plan scans chunk as the relay does and plans it onto the fixture's
// server connection, returning what would be written and the link's
// expectations, one letter each ("s" swallowed, "*" answered by
// pgtender, "r" replaced error).
func (f *statementsFixture) plan(t *testing.T, s *session, chunk []byte) (written []byte, expected string) {
	t.Helper()
	forward, terminate, err := s.scanClientChunk(chunk)
	if err != nil || terminate || forward != len(chunk) {
		t.Fatalf("scan: forward %d of %d, terminate %v, err %v", forward, len(chunk), terminate, err)
	}
	s.link.reset()
	edits := s.planChunkLocked(f.server, &s.chunk, chunk)
	for _, b := range s.editedBuffers(chunk, edits) {
		written = append(written, b...)
	}
	for _, e := range s.link.expected[s.link.head:] {
		expected += e.kind.String()
		switch {
		case e.replaceError:
			expected += "(r)"
		case e.synthetic:
			expected += "(*)"
		case e.swallow:
			expected += "(s)"
		}
		expected += " "
	}
	return written, strings.TrimSpace(expected)
}

// answerAll settles every request s's link expects as answered, as the
// server's replies would, so that the next chunk starts at rest.
func answerAll(s *session) {
	for _, e := range s.link.expected[s.link.head:] {
		s.link.settle(&e, true)
	}
	s.applySettledLocked()
}

// messages renders a stream of frontend messages as "P(name,query) B(statement) E S ...".
func messages(t *testing.T, stream []byte) string {
	t.Helper()
	var out []string
	for off := 0; off < len(stream); {
		typ, length := stream[off], int(stream[off+1])<<24|int(stream[off+2])<<16|int(stream[off+3])<<8|int(stream[off+4])
		body := stream[off+wire.HeaderLen : off+1+length]
		off += 1 + length
		switch typ {
		case wire.MsgParse:
			p, err := wire.DecodeParse(body)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("P(%s,%s)", p.Name, p.Query))
		case wire.MsgBind:
			_, statement, _, err := wire.BindNames(body)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("B(%s)", statement))
		case wire.MsgDescribe, wire.MsgClose:
			kind, name, err := wire.DecodeTarget(body)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%c(%c%s)", typ, kind, name))
		default:
			out = append(out, string(typ))
		}
	}
	return strings.Join(out, " ")
}

func parseMsg(name, query string) []byte {
	return wire.AppendParse(nil, []byte(name), []byte(query), nil)
}

func bindMsg(statement string) []byte {
	b := wire.AppendBindPrefix(nil, len(statement)+2+6, len(statement)+2, nil, []byte(statement))
	return append(b, 0, 0, 0, 0, 0, 0) // no formats, no parameters, no result formats
}

func executeMsg() []byte { return []byte{wire.MsgExecute, 0, 0, 0, 9, 0, 0, 0, 0, 0} }

func concat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// TestPlanRenamesStatements follows two clients' named statements onto one
// server connection: the first client's Parse is renamed, the second
// client's Parse of the same text is answered by pgtender, Binds are
// renamed, a connection that lacks a statement gets its Parse first, a
// client's Close is answered by pgtender and leaves the statement for the
// others, and a name the client holds already is refused as Postgres
// would refuse it.
func TestPlanRenamesStatements(t *testing.T) {
	f := newStatementsFixture(0)
	a, b := f.session(), f.session()

	written, expected := f.plan(t, a, concat(parseMsg("s1", "SELECT 1"), bindMsg("s1"), executeMsg(), wire.AppendSync(nil)))
	stmt := a.statements["s1"]
	if stmt == nil {
		t.Fatal("a's s1 not defined")
	}
	name := string(stmt.name)
	if got, want := messages(t, written), fmt.Sprintf("C(S%s) P(%s,SELECT 1) B(%s) E S", name, name, name); got != want {
		t.Errorf("a's first batch written as %s, want %s", got, want)
	}
	if want := "Close(s) Parse Bind Execute Sync"; expected != want {
		t.Errorf("expected %s, want %s", expected, want)
	}

	// Before Postgres has answered a's Parse, b's Parse of the same text
	// is sent (it may yet fail for both).
	written, _ = f.plan(t, b, concat(parseMsg("other", "SELECT 1"), wire.AppendSync(nil)))
	if got, want := messages(t, written), fmt.Sprintf("C(S%s) P(%s,SELECT 1) S", name, name); got != want {
		t.Errorf("b's parse before a's was answered written as %s, want %s", got, want)
	}
	answerAll(b)
	delete(b.statements, "other")

	written, expected = f.plan(t, b, concat(parseMsg("other", "SELECT 1"), bindMsg("other"), executeMsg(), wire.AppendSync(nil)))
	if b.statements["other"] != stmt {
		t.Fatal("b's statement of the same text is not the pool's")
	}
	if got, want := messages(t, written), fmt.Sprintf("B(%s) E S", name); got != want {
		t.Errorf("b's batch written as %s, want %s", got, want)
	}
	if want := "Parse(*) Bind Execute Sync"; expected != want {
		t.Errorf("expected %s, want %s", expected, want)
	}
	answerAll(b)

	// The connection loses the statement (evicted by another client,
	// say): b's next Bind gets the Parse first.
	f.server.statements.remove(stmt)
	written, expected = f.plan(t, b, concat(bindMsg("other"), executeMsg(), wire.AppendSync(nil)))
	if got, want := messages(t, written), fmt.Sprintf("C(S%s) P(%s,SELECT 1) B(%s) E S", name, name, name); got != want {
		t.Errorf("b's bind written as %s, want %s", got, want)
	}
	if want := "Close(s) Parse(s) Bind Execute Sync"; expected != want {
		t.Errorf("expected %s, want %s", expected, want)
	}
	answerAll(b)

	// a closes s1: a Close of a name that never exists gets it its
	// CloseComplete in turn, and the server keeps the statement.
	written, expected = f.plan(t, a, concat(wire.AppendClose(nil, wire.TargetStatement, []byte("s1")), wire.AppendSync(nil)))
	if got, want := messages(t, written), "C(S"+serverStatementPrefix+") S"; got != want {
		t.Errorf("a's close written as %s, want %s", got, want)
	}
	if want := "Close Sync"; expected != want {
		t.Errorf("expected %s, want %s", expected, want)
	}
	answerAll(a)
	if _, held := a.statements["s1"]; held || f.server.statements.get(stmt) == nil {
		t.Errorf("after a's close: a holds s1 %v, server holds it %v; want false, true", held, f.server.statements.get(stmt) != nil)
	}

	// b prepares "other" again: 42P05, as from Postgres.
	written, expected = f.plan(t, b, concat(parseMsg("other", "SELECT 2"), wire.AppendSync(nil)))
	if got, want := messages(t, written), fmt.Sprintf("P(%s,pgtender: refused) S", serverStatementPrefix); got != want {
		t.Errorf("b's duplicate written as %s, want %s", got, want)
	}
	if want := "Parse(r) Sync"; expected != want {
		t.Errorf("expected %s, want %s", expected, want)
	}

	// A name the client never prepared that looks like pgtender's.
	written, _ = f.plan(t, a, concat(bindMsg(name), executeMsg(), wire.AppendSync(nil)))
	if got, want := messages(t, written), fmt.Sprintf("B(%s) E S", serverStatementPrefix); got != want {
		t.Errorf("a's bind of another client's server-side name written as %s, want %s", got, want)
	}
}

// TestPlanDeallocate: DEALLOCATE of a renamed statement, as a Query or as
// the text of the unnamed statement (psycopg 3), becomes a DEALLOCATE of
// the server-side name or is answered by pgtender; of a name the client
// does not hold it goes to Postgres unchanged (and defines nothing); and
// DEALLOCATE ALL drops names only from where it stands in the stream.
func TestPlanDeallocate(t *testing.T) {
	f := newStatementsFixture(0)
	s := f.session()
	f.plan(t, s, concat(parseMsg("s1", "SELECT 1"), wire.AppendSync(nil)))
	answerAll(s)
	name := string(s.statements["s1"].name)

	written, expected := f.plan(t, s, concat(parseMsg("", "DEALLOCATE s1"), bindMsg(""), executeMsg(), wire.AppendSync(nil)))
	if got, want := messages(t, written), fmt.Sprintf("P(,DEALLOCATE %s) B() E S", name); got != want {
		t.Errorf("unnamed DEALLOCATE written as %s, want %s", got, want)
	}
	if want := "Parse Bind Execute Sync"; expected != want {
		t.Errorf("expected %s, want %s", expected, want)
	}
	if _, held := s.statements["s1"]; held {
		t.Error("s1 still held after its DEALLOCATE")
	}
	answerAll(s)

	written, _ = f.plan(t, s, concat(parseMsg("", "DEALLOCATE foo"), bindMsg(""), executeMsg(), wire.AppendSync(nil)))
	if got, want := messages(t, written), "P(,DEALLOCATE foo) B() E S"; got != want {
		t.Errorf("DEALLOCATE of a name not held written as %s, want %s", got, want)
	}
	if len(s.statements) != 0 {
		t.Errorf("names defined: %v", s.statements)
	}
	answerAll(s)

	f.plan(t, s, concat(parseMsg("s2", "SELECT 2"), wire.AppendSync(nil)))
	answerAll(s)
	written, expected = f.plan(t, s, concat(wire.AppendQuery(nil, "DEALLOCATE s2"), wire.AppendQuery(nil, "SELECT 1")))
	if got := messages(t, written); got != "Q" {
		t.Errorf("DEALLOCATE query written as %s, want the SELECT alone", got)
	}
	if want := "Query(*) Query"; expected != want {
		t.Errorf("expected %s, want %s", expected, want)
	}
	if _, held := s.statements["s2"]; held {
		t.Error("s2 still held after its DEALLOCATE")
	}
	answerAll(s)

	f.plan(t, s, concat(parseMsg("s3", "SELECT 3"), wire.AppendSync(nil)))
	answerAll(s)
	third := string(s.statements["s3"].name)
	written, _ = f.plan(t, s, concat(bindMsg("s3"), executeMsg(), wire.AppendSync(nil), wire.AppendQuery(nil, "DEALLOCATE ALL")))
	if got, want := messages(t, written), fmt.Sprintf("B(%s) E S Q", third); got != want {
		t.Errorf("bind before DEALLOCATE ALL written as %s, want %s", got, want)
	}
	if len(s.statements) != 0 || !f.server.statements.unknown {
		t.Errorf("after DEALLOCATE ALL: %d names, server unknown %v; want 0, true", len(s.statements), f.server.statements.unknown)
	}
}

// TestPlanUnnamedSkipped: a client's Parse of the unnamed statement that
// the server skips (an error earlier in its batch) leaves whose the
// connection's unnamed statement is unknown, so the client's next Bind of
// it prepares its own again rather than run another client's.
func TestPlanUnnamedSkipped(t *testing.T) {
	f := newStatementsFixture(0)
	a, b := f.session(), f.session()
	f.plan(t, b, concat(parseMsg("", "SELECT 'b'"), wire.AppendSync(nil)))
	answerAll(b)

	f.plan(t, a, concat(bindMsg("nosuch"), executeMsg(), parseMsg("", "SELECT 'a'"), wire.AppendSync(nil)))
	// Postgres refuses the Bind and skips to Sync, the Parse with it.
	if _, err := a.link.serverMessage(wire.MsgErrorResponse, errorBody("26000", "prepared statement \"nosuch\" does not exist")); err != nil {
		t.Fatal(err)
	}
	a.applySettledLocked()
	if f.server.unnamedOwner != unnamedUnknown {
		t.Fatalf("owner %d after the skipped Parse, want unknown", f.server.unnamedOwner)
	}
	written, _ := f.plan(t, a, concat(bindMsg(""), executeMsg(), wire.AppendSync(nil)))
	if got, want := messages(t, written), "P(,SELECT 'a') B() E S"; got != want {
		t.Errorf("a's bind written as %s, want %s", got, want)
	}
}

// TestPlanEvictsLeastRecentlyUsed: a connection holding
// prepared_statements_limit statements gets a Close of the least recently
// used before another Parse.
func TestPlanEvictsLeastRecentlyUsed(t *testing.T) {
	f := newStatementsFixture(2)
	s := f.session()
	for i, query := range []string{"SELECT 1", "SELECT 2"} {
		f.plan(t, s, concat(parseMsg(fmt.Sprint("s", i), query), wire.AppendSync(nil)))
	}
	first := s.statements["s0"]
	f.plan(t, s, concat(bindMsg("s0"), executeMsg(), wire.AppendSync(nil))) // s0 used last
	second := s.statements["s1"]
	written, expected := f.plan(t, s, concat(parseMsg("s2", "SELECT 3"), wire.AppendSync(nil)))
	third := s.statements["s2"]
	want := fmt.Sprintf("C(S%s) C(S%s) P(%s,SELECT 3) S", second.name, third.name, third.name)
	if got := messages(t, written); got != want {
		t.Errorf("written %s, want %s", got, want)
	}
	if want := "Close(s) Close(s) Parse Sync"; expected != want {
		t.Errorf("expected %s, want %s", expected, want)
	}
	if f.server.statements.get(second) != nil || f.server.statements.get(first) == nil || f.server.statements.len() != 2 {
		t.Errorf("server holds the wrong statements after eviction")
	}
	if got := f.pool.stats.statementsEvicted.Load(); got != 1 {
		t.Errorf("statementsEvicted %d, want 1", got)
	}
}

// TestServerOutput: what a chunk of server output becomes, with replies
// cut out and pgtender's inserted, in place when nothing is inserted.
func TestServerOutput(t *testing.T) {
	chunk := []byte("aaaBBBcccDDDeee")
	tests := []struct {
		name string
		do   func(o *serverOutput)
		want string
	}{
		{"nothing", func(o *serverOutput) {}, "aaaBBBcccDDDeee"},
		{"cuts", func(o *serverOutput) { o.cut(3, 6); o.cut(9, 12) }, "aaaccceee"},
		{"insert at the front", func(o *serverOutput) { o.insert(0, []byte("xy")) }, "xyaaaBBBcccDDDeee"},
		{"cut and insert in its place", func(o *serverOutput) { o.insert(3, []byte("xy")); o.cut(3, 6) }, "aaaxycccDDDeee"},
		{"inserts around cuts", func(o *serverOutput) {
			o.cut(3, 6)
			o.insert(9, []byte("1"))
			o.insert(9, []byte("2"))
			o.cut(9, 12)
			o.insert(15, []byte("!"))
		}, "aaaccc12eee!"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := serverOutput{chunk: bytes.Clone(chunk)}
			tt.do(&o)
			if got := string(o.result(len(chunk))); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
	// The end of a chunk held back (a partial header) is never output.
	o := serverOutput{chunk: bytes.Clone(chunk)}
	o.cut(3, 6)
	if got := string(o.result(len(chunk) - 2)); got != "aaacccDDDe" {
		t.Errorf("held back: got %q", got)
	}
}

// FuzzPlanChunk drives two sessions' chunks, built from the fuzzer's bytes
// out of the messages drivers send (Parse, Bind, Describe, Close of named
// and unnamed statements, Execute, Sync, Flush, Query with DEALLOCATE),
// through scanning and planning onto one server connection, and checks
// what must always hold: no panic; what is written is a well-formed
// message stream with no client name of a renamed statement left in it;
// every message the link expects a reply to was written or is answered by
// pgtender; and the server connection never holds more than its limit.
func FuzzPlanChunk(f *testing.F) {
	f.Add([]byte{0, 1, 2, 6, 0x10, 3, 6, 4, 6})
	f.Add([]byte{0, 0, 1, 7, 5, 6, 2, 2, 6, 8, 6})
	f.Add([]byte{0, 9, 1, 6, 0x11, 2, 6, 0x12, 6})
	f.Fuzz(func(t *testing.T, script []byte) {
		fx := newStatementsFixture(2)
		sessions := []*session{fx.session(), fx.session()}
		names := []string{"s0", "s1", "pgtender_1", ""}
		queries := []string{"SELECT 1", "SELECT 2", "SELECT $1::int"}
		var chunk []byte
		who := 0
		flush := func() {
			if len(chunk) == 0 {
				return
			}
			s := sessions[who]
			written, _ := fx.plan(t, s, chunk)
			checkWritten(t, written)
			if n := fx.server.statements.len(); n > 2 {
				t.Fatalf("server holds %d statements, limit 2", n)
			}
			answerAll(s)
			chunk = chunk[:0]
		}
		for i, op := range script {
			arg := int(op >> 4)
			name := names[arg%len(names)]
			switch op & 0x0f {
			case 0:
				chunk = append(chunk, parseMsg(name, queries[(arg+i)%len(queries)])...)
			case 1:
				chunk = append(chunk, bindMsg(name)...)
			case 2:
				chunk = append(chunk, wire.AppendDescribe(nil, wire.TargetStatement, []byte(name))...)
			case 3:
				chunk = append(chunk, wire.AppendClose(nil, wire.TargetStatement, []byte(name))...)
			case 4:
				chunk = append(chunk, executeMsg()...)
			case 5:
				chunk = append(chunk, wire.AppendFlush(nil)...)
			case 6:
				chunk = wire.AppendSync(chunk)
				flush()
			case 7:
				chunk = wire.AppendQuery(chunk, "DEALLOCATE "+name)
			case 8:
				chunk = wire.AppendQuery(chunk, "DEALLOCATE ALL")
			case 9:
				flush()
				who = 1 - who
			}
		}
		flush()
	})
}

// checkWritten fails t unless written is whole messages in which no Parse
// or Close names a statement by a client's name: when renaming, pgtender
// renames every named Parse and answers every Close of a statement itself.
// (A Bind or Describe keeps a name the client never prepared, for Postgres
// to refuse.)
func checkWritten(t *testing.T, written []byte) {
	t.Helper()
	for off := 0; off < len(written); {
		if len(written)-off < wire.HeaderLen {
			t.Fatalf("written stream ends inside a header: %q", written[off:])
		}
		length := int(written[off+1])<<24 | int(written[off+2])<<16 | int(written[off+3])<<8 | int(written[off+4])
		if length < 4 || off+1+length > len(written) {
			t.Fatalf("bad length %d at %d of %d", length, off, len(written))
		}
		typ, body := written[off], written[off+wire.HeaderLen:off+1+length]
		off += 1 + length
		var name []byte
		switch typ {
		case wire.MsgParse:
			p, err := wire.DecodeParse(body)
			if err != nil {
				t.Fatalf("written Parse: %v", err)
			}
			name = p.Name
		case wire.MsgBind:
			if _, _, _, err := wire.BindNames(body); err != nil {
				t.Fatalf("written Bind: %v", err)
			}
		case wire.MsgDescribe, wire.MsgClose:
			kind, target, err := wire.DecodeTarget(body)
			if err != nil {
				t.Fatalf("written %c: %v", typ, err)
			}
			if typ == wire.MsgClose && kind == wire.TargetStatement {
				name = target
			}
		}
		if len(name) > 0 && !bytes.HasPrefix(name, []byte(serverStatementPrefix)) {
			t.Fatalf("written %c names %q, a client's name", typ, name)
		}
	}
}

// TestSplitStatementKey: SHOW PREPARED_STATEMENTS reads a statement's key
// back into what statementKey made it of, parameter OIDs with zero bytes
// included.
func TestSplitStatementKey(t *testing.T) {
	paramTypes := []byte{0, 2, 0, 0, 0, 23, 0, 0, 0, 25}
	key := statementKey(nil, `"$user", public`, wire.Parse{Query: []byte("SELECT $1::int, $2::text"), ParamTypes: paramTypes})
	searchPath, query, params := splitStatementKey(string(key))
	if searchPath != `"$user", public` || query != "SELECT $1::int, $2::text" || params != string(paramTypes) {
		t.Errorf("splitStatementKey = %q, %q, %q", searchPath, query, params)
	}
}
