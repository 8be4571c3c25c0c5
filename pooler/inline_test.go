package pooler

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
)

// Replies read on the serve goroutine (readServerInline).

// newHarnessInlineBudget is newHarness with readServerInline's budget set.
func newHarnessInlineBudget(t *testing.T, budget time.Duration) *harness {
	t.Helper()
	return newHarnessSetup(t, nil, nil, zaptest.NewLogger(t, zaptest.Level(zapcore.InfoLevel)), func(p *Pooler) { p.inlineReadBudget = budget })
}

// readingInline reports whether s's serve goroutine reads its server
// connection's reply now.
func readingInline(s *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readBudget && s.server != nil
}

// TestReplyReadOnTheServeGoroutine: an autocommit query's reply is read by
// the serve goroutine itself, and the connection goes back to the pool at
// its ReadyForQuery; a query that outlasts the budget is handed to a reader
// goroutine, whose reply comes whole and in order with what the client
// sent meanwhile.
func TestReplyReadOnTheServeGoroutine(t *testing.T) {
	t.Run("within the budget", func(t *testing.T) {
		h := newHarnessInlineBudget(t, time.Minute)
		conn, fe := h.rawConnect()
		writeRaw(t, conn, encodeMsgs(t, &pgproto3.Query{String: "GATE slow"}))
		var server *fakeConn
		waitFor(t, "the query to run", func() bool { server = h.fake.atGate("slow"); return server != nil })
		s := h.onlySession()
		if !readingInline(s) {
			t.Error("the serve goroutine does not read the reply of an autocommit query")
		}
		h.fake.openGate("slow")
		if got := readUntilReady(t, conn, fe); len(got) != 4 || got[3] != "ReadyForQuery I" {
			t.Errorf("reply %q", got)
		}
		h.waitIdle(1)
		if readingInline(s) {
			t.Error("still reading inline after the release")
		}
	})
	t.Run("past the budget", func(t *testing.T) {
		h := newHarnessInlineBudget(t, 5*time.Millisecond)
		conn, fe := h.rawConnect()
		writeRaw(t, conn, encodeMsgs(t, &pgproto3.Query{String: "GATE slow"}))
		waitFor(t, "the query to run", func() bool { return h.fake.atGate("slow") != nil })
		s := h.onlySession()
		waitFor(t, "the reply to be handed to a reader goroutine", func() bool { return !readingInline(s) })
		// Read by the serve goroutine, which reads the client again, and
		// forwarded behind the query still running (the fake reads it
		// once the gate opens).
		writeRaw(t, conn, encodeMsgs(t, &pgproto3.Query{String: "SELECT after"}))
		h.fake.openGate("slow")
		first, second := readUntilReady(t, conn, fe), readUntilReady(t, conn, fe)
		if len(first) != 4 || first[1] != "DataRow gate" || len(second) != 4 || second[1] != "DataRow after" {
			t.Errorf("replies %q then %q, want the gate's then the second query's", first, second)
		}
		h.waitIdle(1)
	})
}

// TestKillDuringInlineRead: KILL_CLIENT of a client whose reply the serve
// goroutine is reading ends the session at once, not when the reply comes
// or the budget runs out: the query is canceled and its connection closed,
// as for any client killed in the middle of a request.
func TestKillDuringInlineRead(t *testing.T) {
	h := newHarnessInlineBudget(t, time.Minute)
	conn, fe := h.rawConnect()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Query{String: "SLEEP"}))
	var server *fakeConn
	waitFor(t, "SLEEP to start", func() bool { server = h.fake.sleeper(); return server != nil })
	s := h.onlySession()
	if !readingInline(s) {
		t.Fatal("the serve goroutine does not read SLEEP's reply")
	}
	s.kill()
	if got := describeMsg(receiveMessage(t, conn, fe)); got != "ErrorResponse 57P01" {
		t.Errorf("killed client got %s, want ErrorResponse 57P01", got)
	}
	waitFor(t, "the session to end", func() bool { return h.p.sessionCount() == 0 })
	waitFor(t, "the killed request's connection to be closed", server.Ended)
	if cancels := h.fake.cancelList(); len(cancels) != 1 || cancels[0].PID != server.pid {
		t.Errorf("cancel requests %+v, want one for backend %d", cancels, server.pid)
	}
}

// TestClientGoneDuringInlineRead: a client that leaves while the serve
// goroutine reads its reply is noticed once the budget runs out, and its
// query is canceled and the connection reused, as when a reader goroutine
// reads the reply (TestClientGoneMidQuery).
func TestClientGoneDuringInlineRead(t *testing.T) {
	h := newHarness(t, nil)
	conn, _ := h.rawConnect()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Query{String: "SLEEP"}))
	var server *fakeConn
	waitFor(t, "SLEEP to start", func() bool { server = h.fake.sleeper(); return server != nil })
	conn.Close()
	waitFor(t, "the session to end", func() bool { return h.p.sessionCount() == 0 })
	h.waitIdle(1)
	if cancels := h.fake.cancelList(); len(cancels) != 1 || cancels[0].PID != server.pid || !cancels[0].Matched {
		t.Errorf("cancel requests %+v, want one matching backend %d", cancels, server.pid)
	}
	b := h.connect()
	if pid := mustWhoami(t, b); pid != server.pid {
		t.Errorf("next client served by backend %d, want the reused %d", pid, server.pid)
	}
}

// TestEditedLen: the length the inline decision weighs is what is written
// (editedBuffers), injected Parses included, not the client's chunk.
func TestEditedLen(t *testing.T) {
	s := &session{editBytes: make([]byte, 10000)}
	chunk := make([]byte, 100)
	for _, edits := range [][]edit{
		nil,
		{{start: 10, end: 10, from: 0, to: 8000}},                                      // an injected Parse
		{{start: 0, end: 20, from: 0, to: 5}, {start: 50, end: 50, from: 5, to: 4005}}, // a rename, then an insert
		{{start: 0, end: 100, from: 0, to: 0}},                                         // all taken out
	} {
		written := 0
		for _, b := range s.editedBuffers(chunk, edits) {
			written += len(b)
		}
		if got := editedLen(chunk, edits); got != written {
			t.Errorf("editedLen with %+v = %d, editedBuffers writes %d", edits, got, written)
		}
	}
}
