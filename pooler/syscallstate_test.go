package pooler

import (
	"bytes"
	"fmt"
	"io"
	"runtime/trace"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	exptrace "golang.org/x/exp/trace"
)

// TestRelayEntersNoSyscallState: once a client is logged in and its
// statements are prepared, its round trips (a simple query, an unnamed
// Parse/Bind/Execute, a Bind of a renamed prepared statement, a
// transaction of three queries) make no
// system call that enters the scheduler's syscall state (rawsocket.go says
// why one per transaction costs so much). The rule is checked on what ran:
// an execution trace of the round trips, in which every goroutine's entry
// into a system call is an event with its stack; pgtender's own (a stack
// with a session or server connection frame) fail the test, the fake
// server's and the test client's are left alone. TestDirectSyscallsAreRaw
// catches a call the package writes; this catches one the standard
// library makes for it (net.Buffers' writev did).
func TestRelayEntersNoSyscallState(t *testing.T) {
	if trace.IsEnabled() {
		t.Skip("an execution trace is already running (go test -trace)")
	}
	h := newHarness(t, nil)
	conn, fe := h.rawConnect()
	roundTrips := [][]byte{
		encodeMsgs(t, &pgproto3.Query{String: "SELECT 1"}),
		encodeMsgs(t, &pgproto3.Parse{Query: "SELECT 2"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}),
		encodeMsgs(t, &pgproto3.Bind{PreparedStatement: "named"}, &pgproto3.Execute{}, &pgproto3.Sync{}),
		// A transaction: its replies are read by a reader goroutine.
		encodeMsgs(t, &pgproto3.Query{String: "BEGIN"}),
		encodeMsgs(t, &pgproto3.Query{String: "SELECT 4"}),
		encodeMsgs(t, &pgproto3.Query{String: "COMMIT"}),
	}
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Parse{Name: "named", Query: "SELECT 3"}, &pgproto3.Sync{}))
	readUntilReady(t, conn, fe)
	for _, b := range roundTrips { // warm: the statement is prepared on the server connection
		writeRaw(t, conn, b)
		readUntilReady(t, conn, fe)
	}

	var out bytes.Buffer
	if err := trace.Start(&out); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		for _, b := range roundTrips {
			writeRaw(t, conn, b)
			if got := readUntilReady(t, conn, fe); len(got) < 2 || strings.HasPrefix(got[0], "ErrorResponse") {
				trace.Stop()
				t.Fatalf("round trip answered %q", got)
			}
		}
	}
	trace.Stop()

	reader, err := exptrace.NewReader(&out)
	if err != nil {
		t.Fatal(err)
	}
	// seen counts pgtender's goroutines' transitions of any kind (they
	// block on their sockets at every round trip), and readerSeen a reader
	// goroutine's: both prove that the stacks are pgtender's as the
	// filter names them, and that the transaction's replies took the
	// reader goroutine's path.
	syscalls, ours, seen, readerSeen := 0, 0, 0, 0
	for {
		ev, err := reader.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the trace: %v", err)
		}
		if ev.Kind() != exptrace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != exptrace.ResourceGoroutine {
			continue
		}
		stack, reader := pgtenderFrames(st.Stack)
		if stack != "" {
			seen++
		}
		if reader {
			readerSeen++
		}
		if _, to := st.Goroutine(); to != exptrace.GoSyscall {
			continue
		}
		syscalls++
		if stack != "" {
			ours++
			if ours <= 3 {
				t.Errorf("pgtender entered the syscall state during a round trip:\n%s", stack)
			}
		}
	}
	if ours > 3 {
		t.Errorf("%d entries into the syscall state by pgtender in all", ours)
	}
	if syscalls == 0 {
		t.Fatal("the trace shows no system call at all, though the test client's writes make some")
	}
	if seen == 0 || readerSeen == 0 {
		t.Fatalf("the trace shows %d transitions of pgtender's goroutines, %d of a reader goroutine's: "+
			"the filter names no goroutine of pgtender's, or the transaction's replies took no reader goroutine", seen, readerSeen)
	}
}

// pgtenderFrames is stack written out when one of its frames is a method
// of the relay's (a session's or a server connection's), or ""; reader
// tells whether it is a reader goroutine's (readServer at its root).
func pgtenderFrames(stack exptrace.Stack) (text string, reader bool) {
	var b strings.Builder
	ours := false
	for frame := range stack.Frames() {
		if strings.Contains(frame.Func, "pooler.(*session)") || strings.Contains(frame.Func, "pooler.(*ServerConn)") {
			ours = true
		}
		reader = reader || strings.HasSuffix(frame.Func, "pooler.(*session).readServer")
		fmt.Fprintf(&b, "\t%s %s:%d\n", frame.Func, frame.File, frame.Line)
	}
	if !ours {
		return "", false
	}
	return b.String(), reader
}
