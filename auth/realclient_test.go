package auth

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgtender/pgtender/config"
)

// wireConn is a minimal ClientConn over a net.Conn, standing in for the
// pooler's framer: it reads whole messages into one reused buffer.
type wireConn struct {
	conn net.Conn
	out  []byte
	in   []byte
}

func (w *wireConn) Send(msg pgproto3.BackendMessage) error {
	buf, err := msg.Encode(w.out[:0])
	if err != nil {
		return err
	}
	w.out = buf
	_, err = w.conn.Write(buf)
	return err
}

func (w *wireConn) Receive() (byte, []byte, error) {
	var header [5]byte
	if _, err := io.ReadFull(w.conn, header[:]); err != nil {
		return 0, nil, err
	}
	length := binary.BigEndian.Uint32(header[1:])
	if length < 4 || length > 10_000 {
		return 0, nil, fmt.Errorf("message length %d out of bounds", length)
	}
	if cap(w.in) < int(length-4) {
		w.in = make([]byte, length-4)
	}
	w.in = w.in[:length-4]
	if _, err := io.ReadFull(w.conn, w.in); err != nil {
		return 0, nil, err
	}
	return header[0], w.in, nil
}

// testServer is a tiny Postgres front end: startup with pgproto3.Backend,
// authentication with AuthenticateClient, then AuthenticationOk and
// ReadyForQuery, and it waits for the client to leave.
type testServer struct {
	ln      net.Listener
	method  config.AuthType
	creds   *Credentials
	wg      sync.WaitGroup
	results chan error // one AuthenticateClient result per connection
}

func startTestServer(t *testing.T, method config.AuthType, creds *Credentials) *testServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &testServer{ln: ln, method: method, creds: creds, results: make(chan error, 16)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // listener closed
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.serve(t, conn)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s
}

func (s *testServer) serve(t *testing.T, conn net.Conn) {
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Error(err)
		return
	}
	backend := pgproto3.NewBackend(conn, conn)
	msg, err := backend.ReceiveStartupMessage()
	if err != nil {
		t.Errorf("startup: %v", err)
		return
	}
	startup, ok := msg.(*pgproto3.StartupMessage)
	if !ok {
		t.Errorf("startup: got %T", msg)
		return
	}
	if user := startup.Parameters["user"]; user != "alice" {
		t.Errorf("startup user = %q, want alice", user)
	}
	// The client sends nothing after the startup packet until the server
	// answers, so the backend has buffered nothing the framer would miss.
	err = AuthenticateClient(&wireConn{conn: conn}, s.method, s.creds)
	s.results <- err
	if err != nil {
		code := "28P01"
		if errors.Is(err, ErrProtocol) {
			code = "08P01"
		}
		backend.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: code, Message: "password authentication failed for user \"alice\""})
		_ = backend.Flush()
		return
	}
	backend.Send(&pgproto3.AuthenticationOk{})
	backend.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if err := backend.Flush(); err != nil {
		t.Errorf("flush: %v", err)
		return
	}
	// Wait for Terminate and the close.
	_, _ = io.Copy(io.Discard, conn)
}

func (s *testServer) connect(t *testing.T, password string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("host=127.0.0.1 port=%d user=alice dbname=app sslmode=disable",
		s.ln.Addr().(*net.TCPAddr).Port))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Password = password
	cfg.Fallbacks = nil
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// TestRealClient authenticates pgx's pgconn, a real client, against
// AuthenticateClient for each method and secret kind.
func TestRealClient(t *testing.T) {
	const user = "alice"
	tests := []struct {
		name     string
		method   config.AuthType
		kind     secretKind
		password string
	}{
		{"scram/plaintext", config.AuthSCRAM, kindPlaintext, "pencil"},
		{"scram/secret", config.AuthSCRAM, kindSCRAM, "pencil"},
		// Non-ASCII: pgx normalizes the password (SASLprep) as Postgres does.
		{"scram/plaintext-non-ascii", config.AuthSCRAM, kindPlaintext, "crayón ü\u00a0!"},
		{"md5/plaintext", config.AuthMD5, kindPlaintext, "pencil"},
		{"md5/hash", config.AuthMD5, kindMD5, "pencil"},
		{"plain/plaintext", config.AuthPlain, kindPlaintext, "pencil"},
		{"plain/md5-hash", config.AuthPlain, kindMD5, "pencil"},
		{"plain/scram-secret", config.AuthPlain, kindSCRAM, "pencil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startTestServer(t, tt.method, mustCredentials(t, user, secretFor(t, tt.kind, user, tt.password)))

			if err := s.connect(t, tt.password); err != nil {
				t.Fatalf("right password: connect: %v", err)
			}
			if err := <-s.results; err != nil {
				t.Fatalf("right password: server: %v", err)
			}

			err := s.connect(t, tt.password+"x")
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
				t.Fatalf("wrong password: connect err = %v, want a 28P01 PgError", err)
			}
			if err := <-s.results; err != ErrPasswordMismatch {
				t.Fatalf("wrong password: server err = %v, want ErrPasswordMismatch", err)
			}
		})
	}
	t.Run("trust", func(t *testing.T) {
		s := startTestServer(t, config.AuthTrust, nil)
		if err := s.connect(t, "anything"); err != nil {
			t.Fatalf("trust: %v", err)
		}
		if err := <-s.results; err != nil {
			t.Fatalf("trust: server: %v", err)
		}
	})
}
