package pooler

import (
	"errors"
	"strings"
	"testing"

	"github.com/pgtender/pgtender/pooler/wire"
)

// linkSteps drives a link through a script of steps, each "c:" followed by
// the client's message types in order ("c:PBES" is Parse, Bind, Execute,
// Sync), or "s:" followed by the server's messages separated by spaces:
// a type byte, "ZI"/"ZT"/"ZE" for ReadyForQuery with its status, and
// "Ecopyfail" for the error Postgres answers a client's CopyFail with. It
// returns the error of the first server message the link refused, and the
// index of that step.
func linkSteps(t *testing.T, l *link, steps []string) (int, error) {
	t.Helper()
	for i, step := range steps {
		switch {
		case strings.HasPrefix(step, "c:"):
			for _, typ := range []byte(step[2:]) {
				l.clientMessage(typ)
			}
		case strings.HasPrefix(step, "s:"):
			for _, token := range strings.Fields(step[2:]) {
				var body []byte
				typ := token[0]
				switch {
				case typ == wire.MsgReadyForQuery:
					body = []byte{token[1]}
				case token == "Ecopyfail":
					body = errorBody("57014", "COPY from stdin failed: client said no")
				case typ == wire.MsgErrorResponse:
					body = errorBody("42P01", "relation does not exist")
				}
				if _, err := l.serverMessage(typ, body); err != nil {
					return i, err
				}
			}
		default:
			t.Fatalf("bad step %q", step)
		}
	}
	return -1, nil
}

func errorBody(code, message string) []byte {
	msg := wire.AppendErrorResponse(nil, wire.SeverityError, code, message)
	return msg[wire.HeaderLen:]
}

func TestLinkRules(t *testing.T) {
	tests := []struct {
		name  string
		steps []string
		// The link's state at the end.
		atRest     bool
		owed       int // ReadyForQuery messages still owed
		finishable bool
		txStatus   byte
	}{
		{name: "simple query answered",
			steps:  []string{"c:Q", "s:T D C ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "simple query pending",
			steps: []string{"c:Q", "s:T D"},
			owed:  1, finishable: true, txStatus: 'I'},
		{name: "transaction open",
			steps:      []string{"c:Q", "s:C ZT"},
			finishable: true, txStatus: 'T'},
		{name: "failed transaction",
			steps:      []string{"c:Q", "s:E ZE"},
			finishable: true, txStatus: 'E'},
		{name: "two queries in one chunk, one answered",
			steps: []string{"c:QQ", "s:C ZI"},
			owed:  1, finishable: true, txStatus: 'I'},
		{name: "pgbench extended",
			steps:  []string{"c:PBDES", "s:1 2 T D C ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "describe statement then execute in the next batch",
			steps:  []string{"c:PDS", "s:1 t T ZI", "c:BES", "s:2 D C ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "flush without sync keeps the batch open",
			steps: []string{"c:PBEH", "s:1 2 C"},
			// Nothing owed, but the batch is open: not at rest, and
			// only the client can finish it.
			txStatus: 'I'},
		{name: "error skips to sync",
			steps:  []string{"c:PBDES", "s:E ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "error in the middle of a pipeline skips only to the first sync",
			steps:  []string{"c:PBESPBES", "s:1 E ZI", "s:1 2 C ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "error before the sync was sent: what follows is skipped too",
			steps:  []string{"c:PBEH", "s:E", "c:BEH", "c:S", "s:ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "error at sync (a deferred constraint) still gets its ReadyForQuery",
			steps:  []string{"c:Q", "s:C ZT", "c:PBES", "s:1 2 C E ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "close and portal suspended",
			steps:  []string{"c:BES", "s:2 D s ZT", "c:ES", "s:D C ZT", "c:CS", "s:3 ZT", "c:Q", "s:C ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "empty query",
			steps:  []string{"c:PBES", "s:1 2 I ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "function call",
			steps:  []string{"c:F", "s:V ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "asynchronous messages answer nothing",
			steps:  []string{"s:N S A", "c:Q", "s:N S C A ZI", "s:A"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "simple COPY FROM STDIN",
			steps:  []string{"c:Q", "s:G", "c:ddc", "s:C ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "simple COPY in progress cannot be finished without the client",
			steps: []string{"c:Q", "s:G", "c:dd"},
			owed:  1, txStatus: 'I'},
		{name: "simple COPY TO STDOUT",
			steps:  []string{"c:Q", "s:H d d c C ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "extended COPY as libpq sends it: the Sync inside the COPY gets no reply",
			steps:  []string{"c:PBES", "s:1 2 G", "c:ddcS", "s:C ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "extended COPY ended by the client's CopyFail",
			steps:  []string{"c:PBES", "s:1 2 G", "c:dfS", "s:Ecopyfail ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "extended COPY failed by a bad row, as libpq sends it: the first Sync was read inside the COPY",
			steps:  []string{"c:PBES", "s:1 2 G", "c:d", "s:E", "c:dcS", "s:ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "extended COPY failed with everything sent",
			steps:  []string{"c:PBES", "s:1 2 G", "c:ddcS", "s:E ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "extended COPY failed with a Sync between rows: uncertain, held for the client's life",
			steps: []string{"c:PBES", "s:1 2 G", "c:dSdcS", "s:E", "s:ZI ZI"},
			// Whether one or two ReadyForQuery come is not known; both
			// are accepted, and the link never comes to rest.
			txStatus: 'I'},
		{name: "uncertain COPY: the next query is matched past the Sync the server did not answer",
			steps:    []string{"c:PBES", "s:1 2 G", "c:dSdcS", "s:E", "s:ZI", "c:Q", "s:C ZI"},
			txStatus: 'I'},
		{name: "CopyData outside a COPY gets no reply",
			steps:  []string{"c:Q", "c:d", "s:C ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
		{name: "extended COPY TO STDOUT",
			steps:  []string{"c:PBES", "s:1 2 H d c C ZI"},
			atRest: true, finishable: true, txStatus: 'I'},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l link
			l.reset()
			if i, err := linkSteps(t, &l, tt.steps); err != nil {
				t.Fatalf("step %d (%q): %v", i, tt.steps[i], err)
			}
			if got := l.atRest(); got != tt.atRest {
				t.Errorf("atRest = %v, want %v", got, tt.atRest)
			}
			if got := l.readiesOwed(); got != tt.owed {
				t.Errorf("readiesOwed = %d, want %d", got, tt.owed)
			}
			if got := l.finishable(); got != tt.finishable {
				t.Errorf("finishable = %v, want %v", got, tt.finishable)
			}
			if l.txStatus != tt.txStatus {
				t.Errorf("txStatus = %q, want %q", l.txStatus, tt.txStatus)
			}
		})
	}
}

// TestLinkSwallowsInjectedReplies: the reply to a message pgtender injected
// into the client's stream is swallowed, whatever comes around it, and an
// error in reply to it is forwarded (the client's batch is then skipped).
func TestLinkSwallowsInjectedReplies(t *testing.T) {
	tests := []struct {
		name    string
		server  []string // server messages, as in linkSteps
		swallow string   // which of them are swallowed: 's' or '-' each
	}{
		{"close injected before the client's bind", []string{"3", "2", "D", "C", "ZI"}, "s----"},
		{"a notice during it is forwarded", []string{"N", "3", "2", "C", "ZI"}, "-s---"},
		{"an error in reply to it is forwarded", []string{"E", "ZI"}, "--"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l link
			l.reset()
			l.inject(wire.MsgClose, nil, false)
			for _, typ := range []byte("BES") {
				l.clientMessage(typ)
			}
			var got []byte
			for _, token := range tt.server {
				var body []byte
				if token[0] == wire.MsgReadyForQuery {
					body = []byte{token[1]}
				}
				swallow, err := l.serverMessage(token[0], body)
				if err != nil {
					t.Fatalf("%s: %v", token, err)
				}
				if swallow {
					got = append(got, 's')
				} else {
					got = append(got, '-')
				}
			}
			if string(got) != tt.swallow {
				t.Errorf("swallowed %s, want %s", got, tt.swallow)
			}
			if !l.atRest() {
				t.Errorf("not at rest at the end")
			}
		})
	}
}

// TestLinkRefusesRepliesToNothing: a server that answers more than it was
// asked is out of step. The link says so instead of counting the extra
// ReadyForQuery as the end of a request still running, which would release
// a server connection that owes a reply.
func TestLinkRefusesRepliesToNothing(t *testing.T) {
	tests := []struct {
		name  string
		steps []string
	}{
		{"ReadyForQuery with nothing sent", []string{"s:ZI"}},
		{"a second ReadyForQuery for one query", []string{"c:Q", "s:C ZI ZI"}},
		{"ReadyForQuery for a batch without its Sync", []string{"c:PBE", "s:1 2 C ZI"}},
		{"BindComplete where ParseComplete is due", []string{"c:PBS", "s:2"}},
		{"rows in reply to a Parse", []string{"c:PS", "s:D"}},
		{"CommandComplete with nothing sent", []string{"s:C"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l link
			l.reset()
			_, err := linkSteps(t, &l, tt.steps)
			if !errors.Is(err, errUnexpectedServerMessage) {
				t.Fatalf("err = %v, want errUnexpectedServerMessage", err)
			}
		})
	}
}

// TestLinkFatalErrorWithNothingOwed: Postgres sends a FATAL ErrorResponse
// before it ends a session; it is forwarded, not refused.
func TestLinkFatalErrorWithNothingOwed(t *testing.T) {
	var l link
	l.reset()
	if _, err := linkSteps(t, &l, []string{"s:E"}); err != nil {
		t.Fatal(err)
	}
}

// TestLinkReset: a link taken over by a new server connection owes nothing,
// whatever the previous one was doing, and reuses its queue.
func TestLinkReset(t *testing.T) {
	var l link
	l.reset()
	if _, err := linkSteps(t, &l, []string{"c:QQPBEH", "s:C ZT G"}); err != nil {
		t.Fatal(err)
	}
	capacity := cap(l.expected)
	l.reset()
	if !l.atRest() || l.readiesOwed() != 0 || !l.finishable() {
		t.Fatalf("after reset: atRest %v, owed %d, finishable %v", l.atRest(), l.readiesOwed(), l.finishable())
	}
	if cap(l.expected) != capacity {
		t.Errorf("reset dropped the queue's storage")
	}
}

// TestLinkAllocations: a steady stream of pgbench-style batches allocates
// nothing once the queue has grown.
func TestLinkAllocations(t *testing.T) {
	var l link
	l.reset()
	client := []byte("PBDES")
	server := []struct {
		typ  byte
		body []byte
	}{{'1', nil}, {'2', nil}, {'T', nil}, {'D', nil}, {'C', nil}, {'Z', []byte{'I'}}}
	round := func() {
		for _, typ := range client {
			l.clientMessage(typ)
		}
		for _, m := range server {
			if _, err := l.serverMessage(m.typ, m.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	round()
	if allocs := testing.AllocsPerRun(100, round); allocs != 0 {
		t.Errorf("%v allocations per batch, want 0", allocs)
	}
}

func BenchmarkLinkPgbenchExtended(b *testing.B) {
	var l link
	l.reset()
	b.ReportAllocs()
	for b.Loop() {
		for _, typ := range []byte("PBDES") {
			l.clientMessage(typ)
		}
		_, _ = l.serverMessage('1', nil)
		_, _ = l.serverMessage('2', nil)
		_, _ = l.serverMessage('T', nil)
		_, _ = l.serverMessage('D', nil)
		_, _ = l.serverMessage('C', nil)
		_, _ = l.serverMessage('Z', []byte{'I'})
		_ = l.atRest()
	}
}

// TestLinkSyntheticReplies: a request pgtender answers itself waits its
// turn behind the replies the server owes, and is skipped, never answered,
// when an earlier message of its batch failed; ops settle with their
// requests, ok or not.
func TestLinkSyntheticReplies(t *testing.T) {
	define, forget, added := &statementOp{kind: opDefine}, &statementOp{kind: opForget}, &statementOp{kind: opServerAdd}
	type event struct {
		server  byte   // the server message passed, or 0: none, the session looks for due replies
		want    string // the synthetic replies due before it, by kind
		settled string // ops settled by it: d(efine), f(orget), a(dd), upper case when ok
	}
	name := func(op *statementOp) byte {
		switch op {
		case define:
			return 'd'
		case forget:
			return 'f'
		case added:
			return 'a'
		}
		return '?'
	}
	tests := []struct {
		name   string
		plan   func(l *link)
		events []event
		atRest bool
	}{
		{name: "parse answered by pgtender, then the server's bind",
			plan: func(l *link) {
				l.synthesize(expectParse, define)
				l.clientMessage(wire.MsgBind)
				l.clientMessage(wire.MsgExecute)
				l.clientMessage(wire.MsgSync)
			},
			events: []event{{server: '2', want: "Parse"}, {server: 'C'}, {server: 'Z'}},
			atRest: true},
		{name: "parse answered by pgtender after the server's replies, with nothing after (Flush)",
			plan: func(l *link) {
				l.inject(wire.MsgParse, added, false)
				l.clientMessage(wire.MsgBind)
				l.synthesize(expectParse, define)
			},
			events: []event{{server: '1', settled: "A"}, {server: '2'}, {want: "Parse"}},
		},
		{name: "an error earlier in the batch skips pgtender's answers and undoes their ops",
			plan: func(l *link) {
				l.clientMessage(wire.MsgBind)
				l.synthesize(expectParse, define)
				l.synthesize(expectQuery, forget)
				l.clientMessage(wire.MsgSync)
			},
			events: []event{{server: 'E', settled: "df"}, {server: 'Z'}},
			atRest: true},
		{name: "a failed injected parse undoes its op",
			plan: func(l *link) {
				l.inject(wire.MsgParse, added, false)
				l.clientMessage(wire.MsgBind)
				l.clientMessage(wire.MsgSync)
			},
			events: []event{{server: 'E', settled: "a"}, {server: 'Z'}},
			atRest: true},
		{name: "a synthetic query reply counts as a ReadyForQuery",
			plan: func(l *link) {
				l.clientMessage(wire.MsgQuery)
				l.synthesize(expectQuery, forget)
			},
			events: []event{{server: 'C'}, {server: 'Z'}, {want: "Query"}},
			atRest: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l link
			l.reset()
			tt.plan(&l)
			for i, ev := range tt.events {
				var due []string
				for {
					e, ok := l.takeSynthetic()
					if !ok {
						break
					}
					due = append(due, e.kind.String())
				}
				if got := strings.Join(due, ","); got != ev.want {
					t.Fatalf("event %d: due %q, want %q", i, got, ev.want)
				}
				if ev.server != 0 {
					var body []byte
					if ev.server == wire.MsgReadyForQuery {
						body = []byte{wire.TxIdle}
					}
					if ev.server == wire.MsgErrorResponse {
						body = errorBody("42P01", "relation does not exist")
					}
					if _, err := l.serverMessage(ev.server, body); err != nil {
						t.Fatalf("event %d: %v", i, err)
					}
				}
				var settled []byte
				for _, s := range l.takeSettled() {
					c := name(s.op)
					if s.ok {
						c -= 'a' - 'A'
					}
					settled = append(settled, c)
				}
				if string(settled) != ev.settled {
					t.Fatalf("event %d: settled %q, want %q", i, settled, ev.settled)
				}
			}
			if l.atRest() != tt.atRest {
				t.Errorf("atRest %v, want %v", l.atRest(), tt.atRest)
			}
		})
	}
}

// TestLinkRefusesServerReplyBeforeSyntheticOne: a server reply while
// pgtender's own is due is a bug of the session's, and the link says so
// rather than match it against the wrong request.
func TestLinkRefusesServerReplyBeforeSyntheticOne(t *testing.T) {
	var l link
	l.reset()
	l.synthesize(expectParse, nil)
	l.clientMessage(wire.MsgSync)
	if _, err := l.serverMessage(wire.MsgReadyForQuery, []byte{wire.TxIdle}); !errors.Is(err, errUnexpectedServerMessage) {
		t.Fatalf("got %v, want errUnexpectedServerMessage", err)
	}
}

// TestLinkInjectedQuery: a Query of pgtender's own after the client's is
// answered in full by the server, every reply swallowed but an error and
// the asynchronous ones; its ReadyForQuery counts as any other, so that
// the reader looks for the release point after it.
func TestLinkInjectedQuery(t *testing.T) {
	var l link
	l.reset()
	l.clientMessage(wire.MsgQuery)
	l.inject(wire.MsgQuery, nil, false)
	var got []byte
	for _, m := range []struct {
		typ  byte
		body []byte
	}{
		{'C', nil}, {'Z', []byte{'I'}}, // the client's RESET ALL
		{'S', nil}, {'T', nil}, {'D', nil}, {'C', nil}, {'Z', []byte{'I'}}, // pgtender's SELECT set_config(...)
	} {
		swallow, err := l.serverMessage(m.typ, m.body)
		if err != nil {
			t.Fatal(err)
		}
		if swallow {
			got = append(got, 's')
		} else {
			got = append(got, '-')
		}
	}
	if want := "---ssss"; string(got) != want {
		t.Errorf("swallowed %s, want %s", got, want)
	}
	if readies, _ := l.takeReadies(); readies != 2 || !l.atRest() {
		t.Errorf("readies %d, at rest %v; want 2, true", readies, l.atRest())
	}
}
