package pooler

import (
	"context"
	"crypto/tls"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/internal/testcert"
)

// Client-facing TLS against the fake Postgres; integration/tls_test.go
// covers real clients and a real Postgres with ssl on.

// countingRecorder counts login results, abandoned stages and cancel
// requests.
type countingRecorder struct {
	mu        sync.Mutex
	finished  map[LoginResult]int
	abandoned map[LoginStage]int
	cancels   int
}

func newCountingRecorder() *countingRecorder {
	return &countingRecorder{finished: map[LoginResult]int{}, abandoned: map[LoginStage]int{}}
}

func (r *countingRecorder) LoginStarted() {}
func (r *countingRecorder) LoginFinished(result LoginResult, _ LoginTimings) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.finished[result]++
}
func (r *countingRecorder) LoginAbandoned(stage LoginStage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.abandoned[stage]++
}
func (r *countingRecorder) LoginCancelRequest() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cancels++
}

func (r *countingRecorder) cancelCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cancels
}

func (r *countingRecorder) finishedCount(result LoginResult) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.finished[result]
}

func (r *countingRecorder) abandonedCount(stage LoginStage) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.abandoned[stage]
}

// tlsFixture is a test CA and the pooler's certificate files.
type tlsFixture struct {
	ca                *testcert.CA
	leaf              *testcert.Leaf
	dir               string
	certFile, keyFile string
}

func newTLSFixture(t *testing.T) *tlsFixture {
	t.Helper()
	f := &tlsFixture{ca: testcert.NewCA(t), dir: t.TempDir()}
	f.leaf = f.ca.Issue(t, "127.0.0.1", "localhost")
	f.certFile, f.keyFile = f.leaf.WriteFiles(t, f.dir)
	return f
}

// configure turns client TLS on with the fixture's files.
func (f *tlsFixture) configure(cfg *config.Config) {
	cfg.General.TLSCertificate = f.certFile
	cfg.General.TLSPrivateKey = f.keyFile
}

// connectTLS logs in with pgconn and sslmode (require or verify-full,
// trusting the fixture's CA) and returns the connection and the serial
// of the certificate it was shown.
func (f *tlsFixture) connectTLS(t *testing.T, h *harness, sslmode string) (*pgconn.PgConn, *big.Int) {
	t.Helper()
	cc, err := pgconn.ParseConfig(strings.Replace(h.connString(testDatabase), "sslmode=disable", "sslmode="+sslmode, 1))
	if err != nil {
		t.Fatal(err)
	}
	cc.TLSConfig.RootCAs = f.ca.Pool()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatalf("connect with sslmode=%s: %v", sslmode, err)
	}
	t.Cleanup(func() { closeClient(conn) })
	tlsConn, ok := conn.Conn().(*tls.Conn)
	if !ok {
		t.Fatalf("sslmode=%s: the connection is %T, not TLS", sslmode, conn.Conn())
	}
	return conn, tlsConn.ConnectionState().PeerCertificates[0].SerialNumber
}

// sslRequest sends an SSLRequest on a raw connection and returns the answer.
func sslRequest(t *testing.T, conn net.Conn) byte {
	t.Helper()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.SSLRequest{}))
	var answer [1]byte
	_ = conn.SetReadDeadline(time.Now().Add(waitTimeout))
	if _, err := io.ReadFull(conn, answer[:]); err != nil {
		t.Fatalf("reading the answer to SSLRequest: %v", err)
	}
	return answer[0]
}

func TestClientTLS(t *testing.T) {
	f := newTLSFixture(t)
	recorder := newCountingRecorder()
	h := newHarnessWith(t, f.configure, recorder)
	for _, sslmode := range []string{"require", "verify-full"} {
		conn, serial := f.connectTLS(t, h, sslmode)
		if serial.Cmp(f.leaf.Cert.SerialNumber) != 0 {
			t.Errorf("sslmode=%s: served serial %v, want %v", sslmode, serial, f.leaf.Cert.SerialNumber)
		}
		mustWhoami(t, conn)
	}
	// Not required: plaintext still works.
	mustWhoami(t, h.connect())
	if got := recorder.finishedCount(LoginOK); got != 3 {
		t.Errorf("logins ok = %d, want 3", got)
	}
}

// newRequiredTLSHarness is a harness with client TLS and
// tls_client_required, and a recorder.
func newRequiredTLSHarness(t *testing.T) (*tlsFixture, *harness, *countingRecorder) {
	t.Helper()
	f := newTLSFixture(t)
	recorder := newCountingRecorder()
	h := newHarnessWith(t, func(cfg *config.Config) {
		f.configure(cfg)
		cfg.General.TLSClientRequired = true
	}, recorder)
	return f, h, recorder
}

func TestClientTLSRequired(t *testing.T) {
	f, h, recorder := newRequiredTLSHarness(t)
	conn, _ := f.connectTLS(t, h, "require")
	mustWhoami(t, conn)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := pgconn.Connect(ctx, h.connString(testDatabase))
	if code := pgErrorCode(err); code != sqlstateInvalidAuthorization || !strings.Contains(err.Error(), "SSL required") {
		t.Fatalf("plaintext login: %v, want FATAL 28000 SSL required", err)
	}
	waitFor(t, "the refusal to be counted as rejected", func() bool { return recorder.finishedCount(LoginRejected) == 1 })
	if got := recorder.finishedCount(LoginAuthFailed); got != 0 {
		t.Errorf("auth_failed = %d, want 0: a refusal for want of TLS is not a failed password", got)
	}
}

// TestClientTLSMalformedHandshake: garbage after 'S' closes that connection
// without a word (no plaintext error inside what should be TLS), counts an
// error, and a client logged in meanwhile does not notice.
func TestClientTLSMalformedHandshake(t *testing.T) {
	f := newTLSFixture(t)
	recorder := newCountingRecorder()
	h := newHarnessWith(t, f.configure, recorder)
	bystander, _ := f.connectTLS(t, h, "verify-full")
	mustWhoami(t, bystander)

	conn := h.dial()
	if answer := sslRequest(t, conn); answer != 'S' {
		t.Fatalf("SSLRequest answered %q, want 'S'", answer)
	}
	// One whole TLS record (nothing left unread to turn the close into a
	// reset): a handshake message of a type that does not exist.
	writeRaw(t, conn, []byte{0x16, 0x03, 0x01, 0x00, 0x04, 0xff, 0x00, 0x00, 0x00})
	_ = conn.SetReadDeadline(time.Now().Add(waitTimeout))
	rest, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("the connection was not closed: %v", err)
	}
	if len(rest) > 0 && rest[0] == 'E' {
		t.Errorf("a plaintext ErrorResponse was sent after 'S': %q", rest)
	}
	waitFor(t, "the failed handshake to be counted as an error", func() bool { return recorder.finishedCount(LoginError) == 1 })
	mustWhoami(t, bystander)
	mustWhoami(t, h.connect())
}

// TestClientTLSHandshakeStalls: a client that gets 'S' and sends nothing
// is closed at client_login_timeout and counted as abandoned at startup.
func TestClientTLSHandshakeStalls(t *testing.T) {
	f := newTLSFixture(t)
	recorder := newCountingRecorder()
	h := newHarnessWith(t, func(cfg *config.Config) {
		f.configure(cfg)
		cfg.General.ClientLoginTimeout = 200
	}, recorder)
	conn := h.dial()
	if answer := sslRequest(t, conn); answer != 'S' {
		t.Fatalf("SSLRequest answered %q, want 'S'", answer)
	}
	expectEOF(t, conn)
	waitFor(t, "the stalled handshake to be counted as abandoned", func() bool { return recorder.abandonedCount(StageStartup) == 1 })
}

// TestClientTLSPlaintextAfterSSLRequest: bytes sent with the SSLRequest,
// before the answer, are refused (CVE-2021-23214), not taken into TLS.
func TestClientTLSPlaintextAfterSSLRequest(t *testing.T) {
	f := newTLSFixture(t)
	h := newHarness(t, f.configure)
	conn := h.dial()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.SSLRequest{}, testStartup(pgproto3.ProtocolVersion30, nil)))
	er := expectFatal(t, conn, sqlstateProtocolViolation)
	if !strings.Contains(er.Message, "unencrypted data after SSL request") {
		t.Errorf("message %q", er.Message)
	}
}

// TestClientTLSReload: a reload with new files serves the new certificate
// to the next client; a session already encrypted goes on; files that do
// not load fail the reload and keep the certificate in use.
func TestClientTLSReload(t *testing.T) {
	f := newTLSFixture(t)
	var cfg config.Config
	h := newHarness(t, func(c *config.Config) {
		f.configure(c)
		cfg = *c
	})
	before, serial := f.connectTLS(t, h, "verify-full")
	if serial.Cmp(f.leaf.Cert.SerialNumber) != 0 {
		t.Fatalf("served serial %v, want %v", serial, f.leaf.Cert.SerialNumber)
	}

	renewed := f.ca.Issue(t, "127.0.0.1")
	renewed.WriteFiles(t, f.dir)
	if err := h.p.Reload(&cfg); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	_, serial = f.connectTLS(t, h, "verify-full")
	if serial.Cmp(renewed.Cert.SerialNumber) != 0 {
		t.Errorf("after reload: served serial %v, want the renewed %v", serial, renewed.Cert.SerialNumber)
	}
	mustWhoami(t, before)

	if err := os.WriteFile(filepath.Join(f.dir, "server.key"), []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := h.p.Reload(&cfg); err == nil || !strings.Contains(err.Error(), "tls_private_key") {
		t.Fatalf("Reload with a broken key: %v, want an error naming tls_private_key", err)
	}
	_, serial = f.connectTLS(t, h, "verify-full")
	if serial.Cmp(renewed.Cert.SerialNumber) != 0 {
		t.Errorf("after a failed reload: served serial %v, want %v still", serial, renewed.Cert.SerialNumber)
	}
}

// TestClientTLSOffAnswersN: without a certificate an SSLRequest is
// answered 'N'; a client that requires TLS gives up.
func TestClientTLSOffAnswersN(t *testing.T) {
	h := newHarness(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := pgconn.Connect(ctx, strings.Replace(h.connString(testDatabase), "sslmode=disable", "sslmode=require", 1))
	if err == nil || !strings.Contains(err.Error(), "server refused TLS connection") {
		t.Fatalf("sslmode=require without client TLS: %v, want pgconn's refusal", err)
	}
}

// TestClientTLSRequiredAcceptsPlaintextCancel: tls_client_required does
// not refuse a plaintext CancelRequest (libpq before 17 sends them so).
func TestClientTLSRequiredAcceptsPlaintextCancel(t *testing.T) {
	_, h, recorder := newRequiredTLSHarness(t)
	conn := h.dial()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.CancelRequest{ProcessID: 1, SecretKey: []byte{1, 2, 3, 4}}))
	expectEOF(t, conn) // no FATAL: the request was taken, and matched nothing
	if got := recorder.finishedCount(LoginRejected); got != 0 {
		t.Errorf("rejected = %d, want 0", got)
	}
}
