package pooler

import (
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Protocol tests of the probe (probeAtRest, ServerConn.probe) that runs at
// the end of a transaction that may have changed the session, against the
// fake Postgres of fakepg_test.go, which answers the probe with the
// settings its SETs recorded.

// sessionSetting returns the value of the setting name a session carries
// for its client, or "" when it has none.
func sessionSetting(s *session, name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settings[settingKey(name)].value
}

// onlySession returns the pooler's one client session.
func (h *harness) onlySession() *session {
	h.t.Helper()
	sessions := h.p.sessionList()
	if len(sessions) != 1 {
		h.t.Fatalf("%d client sessions, want 1", len(sessions))
	}
	return sessions[0]
}

// receivedOwnQuery reports whether c received one of pgtender's own
// queries (ownQueryPrefix) containing part: how a server connection is
// brought in line with a client's settings.
func (c *fakeConn) receivedOwnQuery(part string) bool {
	return slices.ContainsFunc(c.Queries(), func(q string) bool {
		return strings.HasPrefix(q, ownQueryPrefix) && strings.Contains(q, part)
	})
}

// TestProbeCanceledOnceIsRunAgain: a probe whose first statement is
// canceled (57014, the client's own tiny statement_timeout) is run again,
// once; the client sees no error, the settings the second run found are
// the client's, and the server connection goes back to the pool carrying
// them: the next client on it has them reset, and the first client has
// them set again when it comes back.
func TestProbeCanceledOnceIsRunAgain(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.cancelProbes(1)
	a := h.connect()
	mustExec(t, a, "SET search_path = tenant_1")
	waitFor(t, "the probe to end", func() bool { return h.stat().Idle == 1 || h.p.sessionCount() == 0 })
	if h.p.sessionCount() == 0 {
		t.Fatal("the client's session ended after the canceled probe")
	}
	server := h.fake.connList()[0]
	if n := server.probes(); n != 2 {
		t.Fatalf("the server connection got %d probes, want the canceled one and its retry", n)
	}
	if got := sessionSetting(h.onlySession(), "search_path"); got != "tenant_1" {
		t.Fatalf("the client's search_path after the retried probe is %q, want tenant_1", got)
	}

	b := h.connect()
	if pid := mustWhoami(t, b); pid != server.pid {
		t.Fatalf("the next client ran on backend %d, want the probed %d back from the pool", pid, server.pid)
	}
	if !server.receivedOwnQuery("RESET search_path") {
		t.Errorf("the next client's link did not reset the search_path the probe found; server got %q", server.Queries())
	}
	if pid := mustWhoami(t, a); pid != server.pid {
		t.Fatalf("the first client came back on backend %d, want %d", pid, server.pid)
	}
	if !server.receivedOwnQuery("set_config('search_path', 'tenant_1', false)") {
		t.Errorf("the first client's search_path was not set again when it came back; server got %q", server.Queries())
	}
}

// TestProbeCanceledTwiceEndsTheSession: when the retry is canceled too, the
// client's settings are unknown: its session cannot go on as if they were
// kept. The client, which already had its reply, is told FATAL 08006 and
// disconnected; the probe is not run a third time, the server connection
// is closed, and the next client gets a new one.
func TestProbeCanceledTwiceEndsTheSession(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.cancelProbes(2)
	conn, fe := h.rawConnect()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Query{String: "SET search_path = tenant_1"}))
	if got, want := readUntilReady(t, conn, fe), []string{"CommandComplete SET", "ReadyForQuery I"}; !slices.Equal(got, want) {
		t.Fatalf("client got %q, want %q", got, want)
	}
	var messages []string
	_ = conn.SetReadDeadline(time.Now().Add(waitTimeout))
	for range 10 {
		msg, err := fe.Receive()
		if err != nil {
			break
		}
		messages = append(messages, describeMsg(msg))
	}
	if !slices.Equal(messages, []string{"ErrorResponse " + sqlstateConnectionFailure}) {
		t.Fatalf("after its reply the client got %q, want ErrorResponse 08006 and the end of the connection", messages)
	}

	server := h.fake.connList()[0]
	waitFor(t, "the server connection to be closed", server.Ended)
	if n := server.probes(); n != 2 {
		t.Errorf("the server connection got %d probes, want 2: the probe is run again once", n)
	}
	waitFor(t, "the session to end", func() bool { return h.p.sessionCount() == 0 })
	b := h.connect()
	if pid := mustWhoami(t, b); pid == server.pid {
		t.Errorf("the next client ran on the closed backend %d", pid)
	}
}

// deadlineHookConn is a server connection whose next SetDeadline to a
// time, pgtender's own query starting, runs hook first: the moment a
// wake-up of readServer (a read deadline in the past) that lands now is
// replaced by the query's own deadline.
type deadlineHookConn struct {
	net.Conn
	mu   sync.Mutex
	hook func()
}

func (c *deadlineHookConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	hook := c.hook
	if !t.IsZero() {
		c.hook = nil
	} else {
		hook = nil
	}
	c.mu.Unlock()
	if hook != nil {
		hook()
	}
	return c.Conn.SetDeadline(t)
}

// TestWakeUpDuringProbeIsGivenAgain: a client that leaves just as the
// probe begins wakes readServer (finish) with a read deadline in the past,
// which the probe's own deadline then replaces. After the probe readServer
// must be woken again; else it reads the idle server connection forever,
// finish waits for it, and neither the session nor the connection is ever
// let go. The hook on the server connection holds the probe at that moment
// until finish has woken readServer.
func TestWakeUpDuringProbeIsGivenAgain(t *testing.T) {
	h := newHarnessReaderGoroutines(t, nil)
	conn, fe := h.rawConnect()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Query{String: "WHOAMI"}))
	readUntilReady(t, conn, fe)
	h.waitIdle(1)
	s := h.onlySession()

	hooked := make(chan struct{})
	pool := h.pool()
	pool.mu.Lock()
	sc := pool.idle[0]
	sc.conn = &deadlineHookConn{Conn: sc.conn, hook: func() {
		defer close(hooked)
		s.mu.Lock()
		probing := s.probing
		s.mu.Unlock()
		if !probing {
			t.Error("the first query of pgtender's own on the connection is not the probe")
			return
		}
		conn.Close()
		woken := func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.woken
		}
		for deadline := time.Now().Add(waitTimeout); !woken(); time.Sleep(2 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Error("the departing client's finish did not wake readServer")
				return
			}
		}
	}}
	pool.mu.Unlock()

	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Query{String: "SET search_path = tenant_1"}))
	recvWithin(t, hooked, "the probe to start")
	waitFor(t, "the session to end", func() bool { return h.p.sessionCount() == 0 })
	h.waitIdle(1)
	if server := h.fake.connList()[0]; server.probes() != 1 || server.Ended() {
		t.Errorf("server connection: %d probes, ended %v; want the one probe and the connection kept", server.probes(), server.Ended())
	}
}
