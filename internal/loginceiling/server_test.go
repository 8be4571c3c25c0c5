package loginceiling

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func startServer(t *testing.T, password string) *Server {
	t.Helper()
	server, err := Listen("127.0.0.1:0", password)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Close() })
	return server
}

// connect logs in with pgconn (libpq's behaviour: sslmode=prefer sends an
// SSLRequest first, which the ceiling answers 'N'). The context it returns
// bounds the test's further calls.
func connect(t *testing.T, server *Server, password string) (context.Context, *pgconn.PgConn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	port := server.Addr().(*net.TCPAddr).Port
	cfg, err := pgconn.ParseConfig(fmt.Sprintf("host=127.0.0.1 port=%d user=bench database=bench sslmode=prefer password=%s", port, password))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	return ctx, conn, err
}

func TestLoginAndSelectOne(t *testing.T) {
	server := startServer(t, "secret")
	ctx, conn, err := connect(t, server, "secret")
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	if got := conn.ParameterStatus("server_encoding"); got != "UTF8" {
		t.Errorf("server_encoding %q, want UTF8", got)
	}
	results, err := conn.Exec(ctx, "SELECT 1").ReadAll()
	if err != nil {
		t.Fatalf("SELECT 1: %v", err)
	}
	if len(results) != 1 || len(results[0].Rows) != 1 || string(results[0].Rows[0][0]) != "1" ||
		results[0].CommandTag.String() != "SELECT 1" {
		t.Fatalf("SELECT 1 gave %+v", results)
	}
	// Anything else is an error, and the session goes on.
	if _, err := conn.Exec(ctx, "SELECT 2").ReadAll(); err == nil {
		t.Fatal("SELECT 2 succeeded, want an error")
	}
	if _, err := conn.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatalf("SELECT 1 after an error: %v", err)
	}
	if err := conn.Close(ctx); err != nil { // sends Terminate
		t.Fatal(err)
	}
	if server.Logins() != 1 || server.Queries() != 2 {
		t.Fatalf("server counted %d logins and %d queries, want 1 and 2", server.Logins(), server.Queries())
	}
}

func TestWrongPasswordRefused(t *testing.T) {
	server := startServer(t, "secret")
	_, _, err := connect(t, server, "wrong")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
		t.Fatalf("login with a wrong password: %v, want SQLSTATE 28P01", err)
	}
	if server.Logins() != 0 {
		t.Fatalf("server counted %d logins, want 0", server.Logins())
	}
}

func TestAnyPasswordWhenNoneSet(t *testing.T) {
	server := startServer(t, "")
	ctx, conn, err := connect(t, server, "whatever")
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	_ = conn.Close(ctx)
}
