package pooler

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap/zapcore"

	"github.com/pgtender/pgtender/config"
)

// TestCancelKeysOfLiveClients registers 10,000 sessions and checks every
// process id is above any Linux pid, positive as an int32, and unique.
func TestCancelKeysOfLiveClients(t *testing.T) {
	const clients = 10_000
	p := &Pooler{sessions: make(map[uint32]*session)}
	secrets := make(map[uint32]bool, clients)
	for range clients {
		s := &session{}
		p.registerSession(s)
		if s.processID <= maxLinuxPID || s.processID > math.MaxInt32 {
			t.Fatalf("process id %d outside (%d, %d]", s.processID, maxLinuxPID, math.MaxInt32)
		}
		secrets[s.secret] = true
	}
	if n := len(p.sessions); n != clients {
		t.Fatalf("%d distinct process ids among %d live sessions", n, clients)
	}
	// 10,000 draws of 32 random bits all but never repeat; a constant
	// secret would. (That the bits come from crypto/rand is
	// TestCancelKeysRedrawn's: it scripts keySource.)
	if len(secrets) < clients-5 {
		t.Errorf("%d distinct secrets among %d sessions: not random", len(secrets), clients)
	}
}

// TestCancelKeysRedrawn scripts the random bytes: draws at or below
// maxLinuxPID (the top bit aside) and an id a live session holds are
// drawn again, and the largest id is taken.
func TestCancelKeysRedrawn(t *testing.T) {
	words := []uint32{
		1,               // below the bound
		0x8000_1000,     // below once the sign bit is dropped
		maxLinuxPID,     // the bound itself
		maxLinuxPID + 1, // the first session's id
		0xaa,            // and its secret
		maxLinuxPID + 1, // taken: drawn again
		0xffff_ffff,     // the second session's id, math.MaxInt32 without the sign bit
		0xbb,            // and its secret
	}
	p := &Pooler{sessions: make(map[uint32]*session)}
	fills := 0
	p.keys.fill = func(b []byte) {
		if fills++; fills > 1 {
			t.Fatal("random bytes read again: every draw here is scripted")
		}
		clear(b)
		for i, w := range words {
			binary.BigEndian.PutUint32(b[4*i:], w)
		}
	}
	first, second := &session{}, &session{}
	p.registerSession(first)
	p.registerSession(second)
	if first.processID != maxLinuxPID+1 || first.secret != 0xaa {
		t.Errorf("first session got (%d, %#x), want (%d, 0xaa)", first.processID, first.secret, maxLinuxPID+1)
	}
	if second.processID != math.MaxInt32 || second.secret != 0xbb {
		t.Errorf("second session got (%d, %#x), want (%d, 0xbb)", second.processID, second.secret, math.MaxInt32)
	}
}

// TestLogSampler: one line per interval, and the line after a quiet
// stretch counts the events held back, itself included.
func TestLogSampler(t *testing.T) {
	l := logSampler{interval: time.Second}
	start := time.Unix(1_000_000, 0)
	for _, step := range []struct {
		at     time.Duration
		due    bool
		events uint64
	}{
		{0, true, 1},
		{100 * time.Millisecond, false, 0},
		{999 * time.Millisecond, false, 0},
		{time.Second, true, 3},
		{1500 * time.Millisecond, false, 0},
		{5 * time.Second, true, 2},
	} {
		events, due := l.take(start.Add(step.at))
		if due != step.due || events != step.events {
			t.Errorf("at %v: take = (%d, %v), want (%d, %v)", step.at, events, due, step.events, step.due)
		}
	}

	// Many goroutines at one instant: one line among them.
	l = logSampler{interval: time.Second}
	var wg sync.WaitGroup
	var mu sync.Mutex
	lines := 0
	for range 50 {
		wg.Go(func() {
			if _, due := l.take(start); due {
				mu.Lock()
				lines++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if lines != 1 {
		t.Errorf("%d lines for 50 events in one instant, want 1", lines)
	}
}

// TestCancelWithUnknownKeyCancelsNothing: CancelRequests with the running
// client's process id and a wrong secret, with its secret and another id,
// and with a secret of another length (protocol 3.2) are dropped: the
// query goes on, nothing reaches Postgres, and each is counted.
func TestCancelWithUnknownKeyCancelsNothing(t *testing.T) {
	h := newHarness(t, nil)
	a := h.connect()
	sleepErr := goExec(t, a, "SLEEP")
	waitFor(t, "SLEEP to start", func() bool { return h.fake.sleeper() != nil })

	pid := a.PID()
	secret := binary.BigEndian.Uint32(a.SecretKey())
	var wrong [4]byte
	binary.BigEndian.PutUint32(wrong[:], secret+1)
	for i, req := range []*pgproto3.CancelRequest{
		{ProcessID: pid, SecretKey: wrong[:]},
		{ProcessID: pid + 1, SecretKey: a.SecretKey()},
		{ProcessID: pid, SecretKey: append(a.SecretKey(), make([]byte, 28)...)},
	} {
		conn := h.dial()
		writeRaw(t, conn, encodeMsgs(t, req))
		expectEOF(t, conn) // the request is read whole before the close
		conn.Close()
		if got := h.p.CancelRequests(); got != (CancelRequests{UnknownKey: uint64(i + 1)}) {
			t.Fatalf("after request %d: counters %+v, want UnknownKey %d only", i+1, got, i+1)
		}
	}
	if n := h.fake.cancelArrivalCount(); n != 0 {
		t.Fatalf("%d cancel requests reached Postgres, want none", n)
	}
	if !notYet(sleepErr) {
		t.Fatalf("the query ended: %v", <-sleepErr)
	}

	// The right key still works, so the query was running all along.
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := a.CancelRequest(ctx); err != nil {
		t.Fatalf("CancelRequest: %v", err)
	}
	if err := recvWithin(t, sleepErr, "the canceled query"); pgErrorCode(err) != "57014" {
		t.Fatalf("canceled query: %v, want SQLSTATE 57014", err)
	}
	if got := h.p.CancelRequests(); got != (CancelRequests{Forwarded: 1, UnknownKey: 3}) {
		t.Errorf("counters %+v, want Forwarded 1, UnknownKey 3", got)
	}
}

// TestCancelForClosingSessionIsNotForwarded: a CancelRequest for a client
// that is leaving, whose server connection is still linked while finish
// takes it over, is counted as NoServer and sent nowhere: finish makes the
// connection clean for the next client and cancels what still runs itself
// (returnServer), and the client's cancel could land on that clean-up
// instead. The test holds the session's write lock so that readServer,
// with the last reply in hand, keeps the connection linked meanwhile.
func TestCancelForClosingSessionIsNotForwarded(t *testing.T) {
	h := newHarnessReaderGoroutines(t, nil)
	conn, _ := h.rawConnect()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Query{String: "GATE slow"}))
	var server *fakeConn
	waitFor(t, "the query to run", func() bool { server = h.fake.atGate("slow"); return server != nil })
	s := h.sessionServing(server.pid)
	if s == nil {
		t.Fatalf("no session linked to backend %d", server.pid)
	}
	s.wmu.Lock()
	locked := true
	defer func() {
		if locked {
			s.wmu.Unlock()
		}
	}()
	h.fake.openGate("slow")
	waitFor(t, "readServer to take the reply", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.link.readiesOwed() == 0
	})
	conn.Close()
	waitFor(t, "the session to be closing", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closingLocked()
	})
	s.mu.Lock()
	linked := s.server != nil
	s.mu.Unlock()
	if !linked {
		t.Fatal("the closing session's server connection is no longer linked")
	}

	var secret [4]byte
	binary.BigEndian.PutUint32(secret[:], s.secret)
	cancelConn := h.dial()
	writeRaw(t, cancelConn, encodeMsgs(t, &pgproto3.CancelRequest{ProcessID: s.processID, SecretKey: secret[:]}))
	expectEOF(t, cancelConn)
	if got := h.p.CancelRequests(); got != (CancelRequests{NoServer: 1}) {
		t.Errorf("counters %+v, want NoServer 1 only", got)
	}
	s.wmu.Unlock()
	locked = false

	waitFor(t, "the session to end", func() bool { return h.p.sessionCount() == 0 })
	h.waitIdle(1)
	if n := h.fake.cancelArrivalCount(); n != 0 {
		t.Errorf("%d cancel requests reached Postgres, want none", n)
	}
	if server.Ended() {
		t.Error("the departed client's clean server connection was closed")
	}
}

// TestCancelForwardFailure: a cancel whose forward fails (Postgres resets
// the cancel connection) is counted as Error and logged as a warning; the
// query it was for runs on, and the client's session and its server
// connection work on: the link is let go once the query ends.
func TestCancelForwardFailure(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.resetCancelRequests()
	a := h.connect()
	gateErr := goExec(t, a, "GATE slow")
	var server *fakeConn
	waitFor(t, "the query to run", func() bool { server = h.fake.atGate("slow"); return server != nil })

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := a.CancelRequest(ctx); err != nil {
		t.Fatalf("CancelRequest: %v", err)
	}
	if got := h.p.CancelRequests(); got != (CancelRequests{Error: 1}) {
		t.Errorf("counters %+v, want Error 1 only", got)
	}
	if n := h.fake.cancelArrivalCount(); n != 1 {
		t.Errorf("%d cancel requests reached Postgres, want 1", n)
	}
	warnings := h.logs.FilterMessage("could not forward a cancel request").FilterLevelExact(zapcore.WarnLevel)
	if warnings.Len() != 1 {
		t.Errorf("%d warnings of the failed forward, want 1; logged %v", warnings.Len(), h.logs.All())
	}

	h.fake.openGate("slow")
	if err := recvWithin(t, gateErr, "the query"); err != nil {
		t.Fatalf("the query the failed cancel was for: %v", err)
	}
	h.waitIdle(1)
	if pid := mustWhoami(t, a); pid != server.pid {
		t.Errorf("the client's next query ran on backend %d, want %d", pid, server.pid)
	}
	if pid := mustWhoami(t, h.connect()); pid != server.pid {
		t.Errorf("another client ran on backend %d, want %d back from the pool", pid, server.pid)
	}
}

// TestCancelDuringProbeKeepsTheSession: a client's CancelRequest that
// arrives while the probe runs (its query had just ended when its cancel
// went out) is forwarded, and the link is let go only once the cancel is
// done. The probe is pgtender's own read of the server connection: the
// cancel's wake-up of readServer must not cut that read short, which
// would end the client's session with "server connection lost"; and a
// cancel still on its way when the probe ends must still wake readServer
// to let the link go.
func TestCancelDuringProbeKeepsTheSession(t *testing.T) {
	// probeStarted links a client whose transaction is probed and holds
	// the probe's reply until openGate("probe").
	probeStarted := func(t *testing.T) (*harness, *pgconn.PgConn, *session) {
		h := newHarness(t, nil)
		h.fake.holdProbes("probe")
		a := h.connect()
		mustExec(t, a, "SET search_path = tenant_1")
		waitFor(t, "the probe to start", func() bool { return h.fake.atGate("probe") != nil })
		return h, a, h.onlySession()
	}
	cancelClient := func(t *testing.T, a *pgconn.PgConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		return a.CancelRequest(ctx)
	}
	// probedAndReleased checks that the probe's findings are the client's
	// and the connection went back to the pool with the session alive.
	probedAndReleased := func(t *testing.T, h *harness, a *pgconn.PgConn, s *session) {
		t.Helper()
		waitFor(t, "the link to be let go", func() bool { return h.stat().Idle == 1 || h.p.sessionCount() == 0 })
		if h.p.sessionCount() == 0 {
			t.Fatal("a cancel that arrived during the probe ended the client's session")
		}
		if got := sessionSetting(s, "search_path"); got != "tenant_1" {
			t.Errorf("the client's search_path after the probe is %q, want tenant_1", got)
		}
		if pid := mustWhoami(t, a); pid != h.fake.connList()[0].pid {
			t.Errorf("the client's next query ran on backend %d, want the probed one", pid)
		}
	}

	t.Run("cancel done during the probe", func(t *testing.T) {
		h, a, s := probeStarted(t)
		if err := cancelClient(t, a); err != nil {
			t.Fatalf("CancelRequest: %v", err)
		}
		if got := h.p.CancelRequests(); got != (CancelRequests{Forwarded: 1}) {
			t.Fatalf("counters %+v, want Forwarded 1", got)
		}
		h.fake.openGate("probe")
		probedAndReleased(t, h, a, s)
	})
	t.Run("cancel done after the probe", func(t *testing.T) {
		h, a, s := probeStarted(t)
		h.fake.holdCancelRequests()
		canceled := goClient(t, a, func() error { return cancelClient(t, a) })
		waitFor(t, "the cancel to reach the server", func() bool { return h.fake.cancelArrivalCount() == 1 })
		h.fake.openGate("probe")
		waitFor(t, "the probe to end", func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return !s.probing && s.settings["search_path"].value == "tenant_1"
		})
		if idle := h.stat().Idle; idle != 0 {
			t.Fatalf("%d idle server connections while the client's cancel is on its way, want the link kept", idle)
		}
		h.fake.openGate("cancels")
		if err := recvWithin(t, canceled, "the CancelRequest"); err != nil {
			t.Fatalf("CancelRequest: %v", err)
		}
		probedAndReleased(t, h, a, s)
	})
	t.Run("client leaves with its cancel on the way", func(t *testing.T) {
		// A driver whose context ends sends a CancelRequest and closes.
		// The probe then finishes (the connection is clean), but the
		// connection waits for the cancel before it goes back to the pool.
		h, a, _ := probeStarted(t)
		h.fake.holdCancelRequests()
		canceled := goClient(t, a, func() error { return cancelClient(t, a) })
		waitFor(t, "the cancel to reach the server", func() bool { return h.fake.cancelArrivalCount() == 1 })
		a.Close(context.Background())
		time.Sleep(50 * time.Millisecond) // for the pooler to read the close
		h.fake.openGate("probe")
		// Give a wrong release the time to happen.
		time.Sleep(100 * time.Millisecond)
		if idle := h.stat().Idle; idle != 0 {
			t.Fatalf("%d idle server connections while the departed client's cancel is on its way, want none", idle)
		}
		h.fake.openGate("cancels")
		if err := recvWithin(t, canceled, "the CancelRequest"); err != nil {
			t.Fatalf("CancelRequest: %v", err)
		}
		waitFor(t, "the probed connection back in the pool", func() bool { return h.stat().Idle == 1 })
		if n := len(h.fake.connList()); n != 1 {
			t.Errorf("%d server connections made, want the probed one kept", n)
		}
	})
}

// BenchmarkRegisterSession measures what a login pays for its
// BackendKeyData: drawing a process id and a secret and registering the
// session among 10,000 live ones (and leaving again).
func BenchmarkRegisterSession(b *testing.B) {
	p := &Pooler{sessions: make(map[uint32]*session)}
	for range 10_000 {
		p.registerSession(&session{})
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		s := &session{}
		for b.Loop() {
			p.registerSession(s)
			p.unregisterSession(s)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			s := &session{}
			for pb.Next() {
				p.registerSession(s)
				p.unregisterSession(s)
			}
		})
	})
}

// cancelKeyOf returns the CancelRequest that names the session serving the
// fake backend pid.
func cancelKeyOf(t *testing.T, h *harness, pid uint32) *pgproto3.CancelRequest {
	t.Helper()
	s := h.sessionServing(pid)
	if s == nil {
		t.Fatalf("no session linked to backend %d", pid)
	}
	var secret [4]byte
	binary.BigEndian.PutUint32(secret[:], s.secret)
	return &pgproto3.CancelRequest{ProcessID: s.processID, SecretKey: secret[:]}
}

// A CancelRequest gives its login slot back before it is forwarded: with
// one login slot and a cancel held up at Postgres, a new client still
// logs in.
func TestCancelHoldsNoLoginSlot(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) {
		cfg.General.MaxLoginsInProgress = 1
		cfg.General.DefaultPoolSize = 2
	})
	a := h.connect()
	sleepErr := goExec(t, a, "SLEEP")
	var server *fakeConn
	waitFor(t, "SLEEP to start", func() bool { server = h.fake.sleeper(); return server != nil })
	h.fake.holdCancelRequests()
	cancelConn := h.dial()
	writeRaw(t, cancelConn, encodeMsgs(t, cancelKeyOf(t, h, server.pid)))
	waitFor(t, "the cancel to reach Postgres", func() bool { return h.fake.cancelArrivalCount() == 1 })

	b := h.connect() // the one login slot must be free
	mustWhoami(t, b)

	h.fake.openGate("cancels")
	if code := pgErrorCode(recvWithin(t, sleepErr, "the canceled query")); code != "57014" {
		t.Fatalf("canceled query: SQLSTATE %q, want 57014", code)
	}
	expectEOF(t, cancelConn)
}

// A CancelRequest on a connection that login admission refuses is still
// forwarded, and counted as a cancel, not a refused login: under overload
// it is what relieves Postgres.
func TestShedConnectionForwardsItsCancel(t *testing.T) {
	recorder := newCountingRecorder()
	h := newHarnessWith(t, nil, recorder)
	a := h.connect()
	sleepErr := goExec(t, a, "SLEEP")
	var server *fakeConn
	waitFor(t, "SLEEP to start", func() bool { server = h.fake.sleeper(); return server != nil })

	accepted, client := tcpPair(t) // a connection as the accept loop hands one to shed
	writeRaw(t, client, encodeMsgs(t, cancelKeyOf(t, h, server.pid)))
	h.p.wg.Add(1)
	h.p.shed(accepted, ShedNoLoginSlot, 0, false)

	if code := pgErrorCode(recvWithin(t, sleepErr, "the canceled query")); code != "57014" {
		t.Fatalf("query canceled through a shed connection: SQLSTATE %q, want 57014", code)
	}
	if got := h.p.CancelRequests(); got != (CancelRequests{Forwarded: 1}) {
		t.Errorf("cancel counters %+v, want Forwarded 1", got)
	}
	if shed, cancels := recorder.finishedCount(LoginShed), recorder.cancelCount(); shed != 0 || cancels != 1 {
		t.Errorf("recorded %d shed logins and %d cancels; want 0 and 1", shed, cancels)
	}
	expectEOF(t, client)
}

// A client that leaves while it waits for a server connection is taken out
// of the pool's queue: the connection, when one comes back, is not handed
// to it, and its query never reaches Postgres.
func TestClientThatLeavesWhileWaitingIsTakenOutOfTheQueue(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) {
		cfg.General.DefaultPoolSize = 1
		cfg.General.CheckoutTimeout = 60000 // longer than the test waits: the queue must let go by itself
	})
	holder := h.connect()
	mustExec(t, holder, "BEGIN") // holds the one server connection
	conn, _ := h.rawConnect()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.Query{String: "SELECT for nobody"}))
	h.waitWaiting(1)
	conn.Close()
	h.waitWaiting(0)
	waitFor(t, "the session to end", func() bool { return h.p.sessionCount() == 1 })
	mustExec(t, holder, "COMMIT")
	mustWhoami(t, holder)
	for _, c := range h.fake.connList() {
		for _, entry := range c.Log() {
			if strings.Contains(entry, "for nobody") {
				t.Fatalf("the query of a client that left reached Postgres: %q", entry)
			}
		}
	}
}

// A CancelRequest from a client waiting for a server connection takes it
// out of the queue: it gets 57014, as from Postgres for a canceled
// statement, and its session goes on.
func TestCancelWhileWaitingForAServerConnection(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) { cfg.General.DefaultPoolSize = 1 })
	holder := h.connect()
	mustExec(t, holder, "BEGIN")
	waiter := h.connect()
	result := goExec(t, waiter, "SELECT waiting")
	h.waitWaiting(1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := waiter.CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	err := recvWithin(t, result, "the canceled wait")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != sqlstateQueryCanceled || pgErr.Severity != "ERROR" {
		t.Fatalf("query canceled while waiting: %v; want ERROR 57014", err)
	}
	if got := h.p.CancelRequests(); got != (CancelRequests{WhileWaiting: 1}) {
		t.Errorf("cancel counters %+v, want WhileWaiting 1", got)
	}
	if n := h.fake.cancelArrivalCount(); n != 0 {
		t.Errorf("%d cancels reached Postgres, want none", n)
	}
	mustExec(t, holder, "COMMIT")
	mustWhoami(t, waiter) // the session goes on
}
