package pooler

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"

	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/pooler/wire"
)

// BenchmarkLoginRoundTrip is one complete login through the pooler as the
// login-storm generator makes it (TCP connect, StartupMessage, cleartext
// password under passthrough, the pool's parameters and ReadyForQuery, a
// SELECT 1, Terminate, RST close), against the fake Postgres, by a client
// that writes prebuilt bytes and reads into one buffer, so that what it
// measures and allocates is mostly the pooler's. For a profile of the
// pooler's side:
//
//	go test -run '^$' -bench LoginRoundTrip -benchmem -memprofile mem.out -cpuprofile cpu.out ./pooler
func BenchmarkLoginRoundTrip(b *testing.B) {
	h := newHarnessQuiet(b, func(cfg *config.Config) {
		cfg.General.PassthroughAuth = config.PassthroughEnabledPlain
		cfg.General.DefaultPoolSize = 4
		cfg.Users[0].PoolSize = 4
	})
	client := newRawClient(b, h.p.Addr().String())
	terminate := []byte{'X', 0, 0, 0, 4}
	login := func() {
		conn := client.loginAndQuery(b)
		defer conn.Close()
		mustWrite(b, conn, terminate)
		_ = conn.(*net.TCPConn).SetLinger(0)
	}
	login() // the first login verifies the password with the fake Postgres
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		login()
	}
}

// rawClient logs in to the pooler as the login-storm generator does, from
// prebuilt bytes read back into one buffer, so that what a benchmark
// measures and allocates is mostly the pooler's.
type rawClient struct {
	addr                     string
	startup, password, query []byte
	in                       backendReader
}

func newRawClient(t testing.TB, addr string) *rawClient {
	return &rawClient{
		addr: addr,
		startup: encodeMsgs(t, &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersionNumber,
			Parameters: map[string]string{"user": testUser, "database": testDatabase}}),
		password: wire.AppendMessage(nil, 'p', append([]byte(serverPassword), 0)),
		query:    wire.AppendQuery(nil, "SELECT 1"),
		in:       backendReader{buf: make([]byte, 4096)},
	}
}

// loginAndQuery connects, logs in with the cleartext password, runs
// SELECT 1 and returns the connection, with a 5 s deadline set on it.
func (c *rawClient) loginAndQuery(t testing.TB) net.Conn {
	c.in.have = 0
	conn, err := net.DialTimeout("tcp", c.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	mustWrite(t, conn, c.startup)
	c.in.readUntil(t, conn, 'R') // AuthenticationCleartextPassword
	mustWrite(t, conn, c.password)
	c.in.readUntil(t, conn, 'Z')
	mustWrite(t, conn, c.query)
	c.in.readUntil(t, conn, 'Z')
	return conn
}

// newHarnessQuiet is newHarness with the pooler's log discarded, so that a
// benchmark measures the pooler rather than the test logger.
func newHarnessQuiet(t testing.TB, mutate func(*config.Config)) *harness {
	t.Helper()
	return newHarnessLogger(t, mutate, nil, zap.NewNop())
}

func mustWrite(t testing.TB, conn net.Conn, b []byte) {
	if _, err := conn.Write(b); err != nil {
		t.Fatal(err)
	}
}

// backendReader reads backend messages into buf, which must hold any
// single message; have bytes of it are read and not yet consumed.
type backendReader struct {
	buf  []byte
	have int
}

// readUntil reads and consumes backend messages until one of type last,
// failing the test on an ErrorResponse.
func (r *backendReader) readUntil(t testing.TB, conn net.Conn, last byte) {
	for {
		for r.have >= 5 {
			n := int(binary.BigEndian.Uint32(r.buf[1:5])) + 1
			if r.have < n {
				break
			}
			typ := r.buf[0]
			if typ == 'E' {
				t.Fatalf("ErrorResponse: %q", r.buf[5:n])
			}
			r.have = copy(r.buf, r.buf[n:r.have])
			if typ == last {
				return
			}
		}
		m, err := conn.Read(r.buf[r.have:])
		if err != nil {
			if err == io.EOF {
				t.Fatalf("the pooler closed the connection while %q was awaited", last)
			}
			t.Fatal(err)
		}
		r.have += m
	}
}

// simpleQueryRound connects a raw client to h and returns one round trip
// of SELECT 1 on it, up to its ReadyForQuery.
func simpleQueryRound(b *testing.B, h *harness) func() {
	conn, _ := h.rawConnect()
	query := wire.AppendQuery(nil, "SELECT 1")
	in := &backendReader{buf: make([]byte, 4096)}
	return func() {
		mustWrite(b, conn, query)
		in.readUntil(b, conn, 'Z')
	}
}

// BenchmarkRelaySimpleQuery is one simple-query transaction (SELECT 1)
// through the relay of a logged-in transaction-mode session: a checkout,
// the query forwarded, the reply relayed, the server connection released.
// The fake Postgres allocates for its own replies; the pooler's share is
// in the memory profile:
//
//	go test -run '^$' -bench RelaySimpleQuery -benchmem -memprofile mem.out ./pooler
func BenchmarkRelaySimpleQuery(b *testing.B) {
	h := newHarnessQuiet(b, nil)
	round := simpleQueryRound(b, h)
	round()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		round()
	}
}
