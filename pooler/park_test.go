package pooler

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap/zaptest"

	"github.com/pgtender/pgtender/config"
)

// newParkingHarness is a harness whose parker sweeps every sweep.
func newParkingHarness(t *testing.T, mutate func(*config.Config), sweep time.Duration) *harness {
	t.Helper()
	return newParkingHarnessTuned(t, mutate, parkTuning{sweep: sweep})
}

func newParkingHarnessTuned(t *testing.T, mutate func(*config.Config), tuning parkTuning) *harness {
	t.Helper()
	return newHarnessSetup(t, mutate, nil, zaptest.NewLogger(t), func(p *Pooler) { p.parkTuning = tuning })
}

func (h *harness) parkedNow() int64 { return h.p.parker.Load().parked.Load() }

func (h *harness) waitParked(n int64) {
	h.t.Helper()
	waitFor(h.t, fmt.Sprintf("%d parked client(s)", n), func() bool { return h.parkedNow() == n })
}

// TestParkedClientResumes: an idle client is parked, without a goroutine,
// and its next requests, simple and extended, are answered as before; it
// parks again once idle again.
func TestParkedClientResumes(t *testing.T) {
	h := newParkingHarness(t, nil, 20*time.Millisecond)
	first := h.connect()
	mustExec(t, first, "SELECT 1")
	h.waitParked(1)
	before := runtime.NumGoroutine()
	const more = 40
	conns := []*pgconn.PgConn{first}
	for range more {
		conn := h.connect()
		mustExec(t, conn, "SELECT 1")
		conns = append(conns, conn)
	}
	h.waitParked(1 + more)
	// Each parked session gave its goroutine up: without parking there
	// would be one more per client. Other goroutines come and go (the
	// test's clients', the pool's), hence the margin.
	added := runtime.NumGoroutine() - before
	t.Logf("%d clients parked: %d goroutines added", more, added)
	if added > more/4 {
		t.Errorf("%d goroutines added by %d clients, all parked; want at most %d", added, more, more/4)
	}
	for round := range 3 {
		for i, conn := range conns {
			want := fmt.Sprint(round*len(conns) + i)
			if got := string(mustExec(t, conn, "SELECT "+want)[0].Rows[0][0]); got != want {
				t.Fatalf("round %d: client %d got %q, want %q", round, i, got, want)
			}
			result := conn.ExecParams(context.Background(), "SELECT "+want, nil, nil, nil, nil).Read()
			if result.Err != nil || len(result.Rows) != 1 || string(result.Rows[0][0]) != want {
				t.Fatalf("round %d: client %d, extended protocol: %v %q", round, i, result.Err, result.Rows)
			}
		}
		h.waitParked(int64(len(conns)))
	}
}

// TestParkedClientLeaves: a client that closes its connection, or sends
// Terminate, while parked ends its session, and nothing is left behind.
func TestParkedClientLeaves(t *testing.T) {
	h := newParkingHarness(t, nil, 20*time.Millisecond)
	closing, terminating := h.connect(), h.connect()
	mustExec(t, closing, "SELECT 1")
	mustExec(t, terminating, "SELECT 1")
	h.waitParked(2)
	_ = closing.Conn().Close() // no Terminate: the socket just closes
	_ = terminating.Close(context.Background())
	waitFor(t, "both sessions to end", func() bool { return h.p.ClientCount() == 0 && h.p.sessionCount() == 0 })
	if n := h.parkedNow(); n != 0 {
		t.Errorf("%d sessions parked after their clients left", n)
	}
	h.waitIdle(1) // the server connection went back to the pool
}

// TestShutdownEndsParkedClients: a parked client is told 57P01, as an idle
// one always was, and Shutdown returns.
func TestShutdownEndsParkedClients(t *testing.T) {
	h := newParkingHarness(t, nil, 20*time.Millisecond)
	conn, frontend := h.rawConnect()
	frontend.Send(&pgproto3.Query{String: "SELECT 1"})
	if err := frontend.Flush(); err != nil {
		t.Fatal(err)
	}
	readUntilReady(t, conn, frontend)
	h.waitParked(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	shutdown := make(chan error, 1)
	go func() { shutdown <- h.p.Shutdown(ctx) }()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	msg, err := frontend.Receive()
	if e, ok := msg.(*pgproto3.ErrorResponse); err != nil || !ok || e.Code != sqlstateAdminShutdown {
		t.Fatalf("a parked client got %#v, %v at shutdown; want ErrorResponse 57P01", msg, err)
	}
	if err := recvWithin(t, shutdown, "Shutdown"); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// TestNotParkedWhileHoldingAServer: a client idle in a transaction, and a
// client in session mode, keep their server connection and are never
// parked.
func TestNotParkedWhileHoldingAServer(t *testing.T) {
	h := newParkingHarness(t, func(cfg *config.Config) { cfg.General.DefaultPoolSize = 2 }, 10*time.Millisecond)
	inTransaction := h.connect()
	mustExec(t, inTransaction, "BEGIN")
	parkable := h.connect()
	mustExec(t, parkable, "SELECT 1")
	h.waitParked(1) // the other one: sweeps have run
	time.Sleep(50 * time.Millisecond)
	if n := h.parkedNow(); n != 1 {
		t.Fatalf("%d parked, want only the client outside a transaction", n)
	}
	mustExec(t, inTransaction, "COMMIT")
	h.waitParked(2)

	session := newParkingHarness(t, func(cfg *config.Config) { cfg.General.PoolerMode = config.PoolerModeSession }, 10*time.Millisecond)
	conn := session.connect()
	mustExec(t, conn, "SELECT 1")
	time.Sleep(50 * time.Millisecond)
	if n := session.parkedNow(); n != 0 {
		t.Errorf("%d session-mode clients parked, want 0", n)
	}
	mustExec(t, conn, "SELECT 2")
}

// TestTLSClientNotParked: a TLS client's records are buffered inside
// crypto/tls, so its socket cannot be waited on for them: it is never
// parked, and a plain client beside it is (the sweeps ran).
func TestTLSClientNotParked(t *testing.T) {
	f := newTLSFixture(t)
	h := newParkingHarness(t, f.configure, 10*time.Millisecond)
	encrypted, _ := f.connectTLS(t, h, "require")
	mustExec(t, encrypted, "SELECT 1")
	plain := h.connect()
	mustExec(t, plain, "SELECT 1")
	h.waitParked(1)
	time.Sleep(50 * time.Millisecond) // five more sweeps
	if n := h.parkedNow(); n != 1 {
		t.Fatalf("%d parked, want only the plain client", n)
	}
	if got := string(mustExec(t, encrypted, "SELECT 2")[0].Rows[0][0]); got != "2" {
		t.Fatalf("the TLS client got %q, want 2", got)
	}
}

// TestParkingStress races parking against clients that pause for about a
// sweep between requests, pipeline, split their messages and leave, under
// -race: every answer is the right one, and every session ends.
func TestParkingStress(t *testing.T) {
	h := newParkingHarness(t, func(cfg *config.Config) { cfg.General.DefaultPoolSize = 4 }, 2*time.Millisecond)
	const clients, requests = 24, 40
	errs := make(chan error, clients)
	for c := range clients {
		go func() {
			errs <- func() error {
				conn, frontend := h.rawConnect()
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
				random := rand.New(rand.NewPCG(uint64(c), 1))
				for i := range requests {
					time.Sleep(time.Duration(random.IntN(5000)) * time.Microsecond)
					want := fmt.Sprint(c*requests + i)
					query := (&pgproto3.Query{String: "SELECT " + want})
					wire, err := query.Encode(nil)
					if err != nil {
						return err
					}
					if random.IntN(3) == 0 { // split, with a pause in the header
						cut := 1 + random.IntN(4)
						if _, err := conn.Write(wire[:cut]); err != nil {
							return err
						}
						time.Sleep(time.Duration(random.IntN(4000)) * time.Microsecond)
						wire = wire[cut:]
					}
					if _, err := conn.Write(wire); err != nil {
						return err
					}
					var got string
					for {
						msg, err := frontend.Receive()
						if err != nil {
							return fmt.Errorf("client %d request %d: %w", c, i, err)
						}
						switch m := msg.(type) {
						case *pgproto3.DataRow:
							got = string(m.Values[0])
						case *pgproto3.ErrorResponse:
							return fmt.Errorf("client %d request %d: %s %s", c, i, m.Code, m.Message)
						}
						if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
							break
						}
					}
					if got != want {
						return fmt.Errorf("client %d request %d: got %q, want %q", c, i, got, want)
					}
				}
				if c%2 == 0 {
					frontend.Send(&pgproto3.Terminate{})
					return frontend.Flush()
				}
				return nil // the socket just closes
			}()
		}()
	}
	for range clients {
		if err := recvWithin(t, errs, "a stress client"); err != nil {
			t.Error(err)
		}
	}
	waitFor(t, "every session to end", func() bool { return h.p.sessionCount() == 0 })
	parks := h.p.ClientParking().Parks
	t.Logf("%d clients, %d requests each: %d parkings", clients, requests, parks)
	if parks < clients {
		t.Errorf("%d parkings, want at least one per client: the test did not exercise parking", parks)
	}
	if n := h.parkedNow(); n != 0 {
		t.Errorf("%d sessions counted parked after every client left", n)
	}
}

// TestParkingReleasesMemory: once the parked sessions grew by the release
// threshold, the memory their goroutines freed is returned to the
// operating system, once; clients that go busy and idle again one at a
// time do not make the parked sessions grow by as many, so they cause no
// more.
func TestParkingReleasesMemory(t *testing.T) {
	const clients = 12
	// Past half the clients: the first release comes with at least 7
	// parked, whenever the sweeps see them, so the 13th client cannot
	// make 7 more.
	h := newParkingHarnessTuned(t, nil, parkTuning{sweep: 20 * time.Millisecond, releaseAfter: clients/2 + 1, releaseInterval: time.Millisecond})
	var conns []*pgconn.PgConn
	for range clients {
		conn := h.connect()
		mustExec(t, conn, "SELECT 1")
		conns = append(conns, conn)
	}
	h.waitParked(clients)
	waitFor(t, "a memory release", func() bool { return h.p.ClientParking().MemoryReleases == 1 })
	for range 3 {
		for _, conn := range conns {
			mustExec(t, conn, "SELECT 1")
			h.waitParked(clients)
		}
	}
	time.Sleep(100 * time.Millisecond) // five sweeps, each of which could release
	if got := h.p.ClientParking(); got.MemoryReleases != 1 || got.Parks < 4*clients {
		t.Errorf("after three rounds of the same clients: %+v, want 1 memory release and at least %d parks", got, 4*clients)
	}
	h.connect() // one more parks: fewer than the threshold
	h.waitParked(clients + 1)
	time.Sleep(100 * time.Millisecond)
	if got := h.p.ClientParking().MemoryReleases; got != 1 {
		t.Errorf("%d memory releases after one more client parked, want 1", got)
	}
}

// TestParkingReleasesAgainWhileAWaveGrows: a wave that goes on parking
// after a memory release (a quarter more than were parked then) is
// released again before the interval, so the stacks of the sessions
// parked after the first release do not wait for it; the same sessions
// going busy and idle again cause none.
func TestParkingReleasesAgainWhileAWaveGrows(t *testing.T) {
	h := newParkingHarnessTuned(t, nil, parkTuning{sweep: 20 * time.Millisecond, releaseAfter: 3, releaseInterval: time.Hour})
	var conns []*pgconn.PgConn
	park := func(n int) {
		for range n {
			conn := h.connect()
			mustExec(t, conn, "SELECT 1")
			conns = append(conns, conn)
		}
		h.waitParked(int64(len(conns)))
	}
	park(4)
	waitFor(t, "a memory release", func() bool { return h.p.ClientParking().MemoryReleases >= 1 })
	time.Sleep(100 * time.Millisecond) // the looks after the last parkings
	first := h.p.ClientParking().MemoryReleases
	park(4)
	waitFor(t, "a second release, an hour before the interval ends", func() bool {
		return h.p.ClientParking().MemoryReleases > first
	})
	time.Sleep(100 * time.Millisecond)
	grown := h.p.ClientParking().MemoryReleases
	for _, conn := range conns {
		mustExec(t, conn, "SELECT 1")
		h.waitParked(int64(len(conns)))
	}
	time.Sleep(100 * time.Millisecond) // five sweeps, each of which could release
	if got := h.p.ClientParking().MemoryReleases; got != grown {
		t.Errorf("%d memory releases after the same clients went busy and idle again, want %d", got, grown)
	}
}
