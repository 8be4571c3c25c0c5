package loginstorm

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/xdg-go/scram"
)

// fakeServer is a small Postgres-speaking server for end-to-end tests: it
// asks for a cleartext, md5 or SCRAM-SHA-256 password, answers SELECT 1,
// and can refuse every login with 53300 or stall before authentication.
// It counts what it saw the way pgtender's login counters do.
type fakeServer struct {
	listener net.Listener
	method   string // "cleartext", "md5" or "scram"
	password string
	refuse   atomic.Bool // refuse every login with FATAL 53300
	// refuseDelay is how long a refusal waits after the StartupMessage, so
	// that tests can tell its latency from zero.
	refuseDelay atomic.Int64
	stall       atomic.Bool // after the StartupMessage, wait for the client to leave
	// stallReady waits for the client to leave after a right password, as
	// a pooler waiting for a server connection does.
	stallReady atomic.Bool

	credentialsOnce sync.Once
	credentials     scram.StoredCredentials

	mutex     sync.Mutex
	results   map[string]int64 // ok, auth_failed, shed
	abandoned map[string]int64 // startup, auth, ready
	inFlight  int64            // connections served and not yet counted
	queries   int64
	open      map[net.Conn]struct{}
	group     sync.WaitGroup
}

func startFakeServer(t *testing.T, method, password string) *fakeServer {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := &fakeServer{listener: listener, method: method, password: password,
		results: map[string]int64{}, abandoned: map[string]int64{}, open: map[net.Conn]struct{}{}}
	server.group.Go(server.acceptLoop)
	t.Cleanup(server.close)
	return server
}

func (s *fakeServer) address() string { return s.listener.Addr().String() }

func (s *fakeServer) acceptLoop() {
	for {
		conn, err := s.listener.Accept()
		if err != nil {
			return
		}
		s.mutex.Lock()
		s.open[conn] = struct{}{}
		s.mutex.Unlock()
		s.group.Go(func() {
			defer func() {
				s.mutex.Lock()
				delete(s.open, conn)
				s.mutex.Unlock()
				conn.Close()
			}()
			s.serve(conn)
		})
	}
}

func (s *fakeServer) close() {
	s.listener.Close()
	s.mutex.Lock()
	for conn := range s.open {
		conn.Close()
	}
	s.mutex.Unlock()
	s.group.Wait()
}

func (s *fakeServer) count(counters map[string]int64, key string) {
	s.mutex.Lock()
	counters[key]++
	s.inFlight--
	s.mutex.Unlock()
}

// snapshot returns copies of the counters.
func (s *fakeServer) snapshot() (results, abandoned map[string]int64, queries int64) {
	results, abandoned, queries, _ = s.snapshotInFlight()
	return results, abandoned, queries
}

func (s *fakeServer) snapshotInFlight() (results, abandoned map[string]int64, queries, inFlight int64) {
	s.mutex.Lock()
	defer s.mutex.Unlock()
	results, abandoned = map[string]int64{}, map[string]int64{}
	for key, value := range s.results {
		results[key] = value
	}
	for key, value := range s.abandoned {
		abandoned[key] = value
	}
	return results, abandoned, s.queries, s.inFlight
}

// ended is the number of logins the server has finished accounting for.
func (s *fakeServer) ended() int64 {
	results, abandoned, _ := s.snapshot()
	var total int64
	for _, value := range results {
		total += value
	}
	for _, value := range abandoned {
		total += value
	}
	return total
}

// metricsText renders the counters as pgtender would, under namespace.
func (s *fakeServer) metricsText(namespace string) string {
	results, abandoned, _, inFlight := s.snapshotInFlight()
	var text strings.Builder
	fmt.Fprintf(&text, "# TYPE %slogins_in_flight gauge\n%slogins_in_flight %d\n", namespace, namespace, inFlight)
	fmt.Fprintf(&text, "# TYPE %slogins_total counter\n", namespace)
	for _, result := range []string{"ok", "auth_failed", "rejected", "shed", "error"} {
		fmt.Fprintf(&text, "%slogins_total{result=%q} %d\n", namespace, result, results[result])
	}
	fmt.Fprintf(&text, "# TYPE %slogins_abandoned_total counter\n", namespace)
	for _, stage := range []string{"startup", "auth", "ready"} {
		fmt.Fprintf(&text, "%slogins_abandoned_total{stage=%q} %d\n", namespace, stage, abandoned[stage])
	}
	return text.String()
}

func (s *fakeServer) metricsHandler(namespace string) http.Handler {
	return http.HandlerFunc(func(writer http.ResponseWriter, _ *http.Request) {
		writer.Header().Set("Content-Type", "text/plain; version=0.0.4")
		io.WriteString(writer, s.metricsText(namespace))
	})
}

func (s *fakeServer) serve(conn net.Conn) {
	s.mutex.Lock()
	s.inFlight++ // every connection ends in exactly one count
	s.mutex.Unlock()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	backend := pgproto3.NewBackend(conn, conn)
	message, err := backend.ReceiveStartupMessage()
	if err != nil {
		s.count(s.abandoned, "startup")
		return
	}
	startup, ok := message.(*pgproto3.StartupMessage)
	if !ok {
		s.count(s.abandoned, "startup")
		return
	}
	if s.refuse.Load() {
		time.Sleep(time.Duration(s.refuseDelay.Load()))
		s.count(s.results, "shed")
		s.sendError(backend, "53300", "pooler overloaded, retry")
		return
	}
	if s.stall.Load() {
		_, _ = io.Copy(io.Discard, conn) // until the client leaves
		s.count(s.abandoned, "auth")
		return
	}
	user := startup.Parameters["user"]
	verified, err := s.authenticate(backend, user)
	if err != nil {
		s.count(s.abandoned, "auth")
		return
	}
	if !verified {
		s.count(s.results, "auth_failed")
		s.sendError(backend, "28P01", fmt.Sprintf("password authentication failed for user %q", user))
		return
	}
	if s.stallReady.Load() {
		_, _ = io.Copy(io.Discard, conn)
		s.count(s.abandoned, "ready")
		return
	}
	backend.Send(&pgproto3.AuthenticationOk{})
	backend.Send(&pgproto3.ParameterStatus{Name: "server_version", Value: "16.0"})
	backend.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 2}})
	backend.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if err := backend.Flush(); err != nil {
		s.count(s.abandoned, "ready")
		return
	}
	s.count(s.results, "ok")
	_ = conn.SetDeadline(time.Time{})
	for {
		message, err := backend.Receive()
		if err != nil {
			return
		}
		switch message := message.(type) {
		case *pgproto3.Query:
			s.mutex.Lock()
			s.queries++
			s.mutex.Unlock()
			if message.String != "SELECT 1" {
				backend.Send(&pgproto3.ErrorResponse{Severity: "ERROR", Code: "42601", Message: "syntax error"})
			} else {
				backend.Send(&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("?column?"), DataTypeOID: 23, DataTypeSize: 4, TypeModifier: -1}}})
				backend.Send(&pgproto3.DataRow{Values: [][]byte{[]byte("1")}})
				backend.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")})
			}
			backend.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
			if err := backend.Flush(); err != nil {
				return
			}
		case *pgproto3.Terminate:
			return
		}
	}
}

func (s *fakeServer) sendError(backend *pgproto3.Backend, code, message string) {
	backend.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: code, Message: message})
	_ = backend.Flush()
}

// authenticate asks for a password and verifies it. An error means the
// client went away or misbehaved.
func (s *fakeServer) authenticate(backend *pgproto3.Backend, user string) (bool, error) {
	switch s.method {
	case "cleartext", "md5":
		var salt [4]byte
		if s.method == "md5" {
			_, _ = rand.Read(salt[:])
			backend.Send(&pgproto3.AuthenticationMD5Password{Salt: salt})
			_ = backend.SetAuthType(pgproto3.AuthTypeMD5Password)
		} else {
			backend.Send(&pgproto3.AuthenticationCleartextPassword{})
			_ = backend.SetAuthType(pgproto3.AuthTypeCleartextPassword)
		}
		if err := backend.Flush(); err != nil {
			return false, err
		}
		message, err := backend.Receive()
		if err != nil {
			return false, err
		}
		password, ok := message.(*pgproto3.PasswordMessage)
		if !ok {
			return false, fmt.Errorf("got %T, want PasswordMessage", message)
		}
		if s.method == "md5" {
			return password.Password == md5Password(user, s.password, salt), nil
		}
		return password.Password == s.password, nil
	case "scram":
		return s.authenticateSCRAM(backend)
	}
	return false, fmt.Errorf("unknown method %q", s.method)
}

func (s *fakeServer) authenticateSCRAM(backend *pgproto3.Backend) (bool, error) {
	s.credentialsOnce.Do(func() {
		client, err := scram.SHA256.NewClient("", s.password, "")
		if err == nil {
			s.credentials = client.GetStoredCredentials(scram.KeyFactors{Salt: "fake-server-salt", Iters: 4096})
		}
	})
	credentials := s.credentials
	server, err := scram.SHA256.NewServer(func(string) (scram.StoredCredentials, error) { return credentials, nil })
	if err != nil {
		return false, err
	}
	conversation := server.NewConversation()
	backend.Send(&pgproto3.AuthenticationSASL{AuthMechanisms: []string{"SCRAM-SHA-256"}})
	_ = backend.SetAuthType(pgproto3.AuthTypeSASL)
	if err := backend.Flush(); err != nil {
		return false, err
	}
	message, err := backend.Receive()
	if err != nil {
		return false, err
	}
	initial, ok := message.(*pgproto3.SASLInitialResponse)
	if !ok {
		return false, fmt.Errorf("got %T, want SASLInitialResponse", message)
	}
	serverFirst, err := conversation.Step(string(initial.Data))
	if err != nil {
		return false, err
	}
	backend.Send(&pgproto3.AuthenticationSASLContinue{Data: []byte(serverFirst)})
	_ = backend.SetAuthType(pgproto3.AuthTypeSASLContinue)
	if err := backend.Flush(); err != nil {
		return false, err
	}
	message, err = backend.Receive()
	if err != nil {
		return false, err
	}
	response, ok := message.(*pgproto3.SASLResponse)
	if !ok {
		return false, fmt.Errorf("got %T, want SASLResponse", message)
	}
	serverFinal, err := conversation.Step(string(response.Data))
	if err != nil || !conversation.Valid() {
		return false, nil // wrong proof: a wrong password
	}
	backend.Send(&pgproto3.AuthenticationSASLFinal{Data: []byte(serverFinal)})
	return true, nil
}

// waitFor polls condition until it holds or the test's time runs out.
func waitFor(t *testing.T, what string, condition func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for !condition() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func startMetrics(t *testing.T, server *fakeServer, namespace string) string {
	t.Helper()
	metrics := httptest.NewServer(server.metricsHandler(namespace))
	t.Cleanup(metrics.Close)
	return metrics.URL + "/metrics"
}
