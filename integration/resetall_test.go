package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// TestResetAllKeepsStartupSettings: RESET ALL and DISCARD ALL put every
// setting back to its session-start value, which for a client is what its
// startup packet said. A client that sends its next statement in the same
// write (a pipeline), so that it runs on the same server connection before
// pgtender could look, must see its startup search_path, not the server
// connection's own: as simple queries, as psycopg 3 sends them (Parse,
// Bind, Execute, Sync of the unnamed statement), and with the reset a
// named prepared statement prepared earlier (pgx's statement cache). Run
// straight to Postgres and through pgtender; the answers must agree.
func TestResetAllKeepsStartupSettings(t *testing.T) {
	tp := startPooler(t, poolerOptions{
		general: `passthrough_auth = "enabled_plain"
pooler_mode = "transaction"`,
		pool: "pool_size = 1",
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := func(t *testing.T, dsn string, mode, reset string) string {
		cfg, err := pgconn.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["options"] = "-c search_path=startup_path"
		conn, err := pgconn.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		// A SET first, so that the RESET has something to undo.
		if _, err := conn.Exec(ctx, "SET search_path = elsewhere").ReadAll(); err != nil {
			t.Fatal(err)
		}
		hijacked, err := conn.Hijack()
		if err != nil {
			t.Fatal(err)
		}
		defer hijacked.Conn.Close()
		fe := hijacked.Frontend
		_ = hijacked.Conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		switch mode {
		case "simple":
			fe.Send(&pgproto3.Query{String: reset})
			fe.Send(&pgproto3.Query{String: "SHOW search_path"})
		case "unnamed":
			for _, sql := range []string{reset, "SHOW search_path"} {
				fe.Send(&pgproto3.Parse{Query: sql})
				fe.Send(&pgproto3.Bind{})
				fe.Send(&pgproto3.Describe{ObjectType: 'P'})
				fe.Send(&pgproto3.Execute{})
				fe.Send(&pgproto3.Sync{})
			}
		case "named":
			fe.Send(&pgproto3.Parse{Name: "reset", Query: reset})
			fe.Send(&pgproto3.Sync{})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			for {
				msg, err := fe.Receive()
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
					break
				}
			}
			fe.Send(&pgproto3.Bind{PreparedStatement: "reset"})
			fe.Send(&pgproto3.Execute{})
			fe.Send(&pgproto3.Sync{})
			fe.Send(&pgproto3.Parse{Query: "SHOW search_path"})
			fe.Send(&pgproto3.Bind{})
			fe.Send(&pgproto3.Describe{ObjectType: 'P'})
			fe.Send(&pgproto3.Execute{})
			fe.Send(&pgproto3.Sync{})
		}
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		var shown string
		for readies := 0; readies < 2; {
			msg, err := fe.Receive()
			if err != nil {
				t.Fatal(err)
			}
			switch msg := msg.(type) {
			case *pgproto3.DataRow:
				shown = string(msg.Values[0])
			case *pgproto3.ErrorResponse:
				t.Fatalf("error: %s %s", msg.Code, msg.Message)
			case *pgproto3.ReadyForQuery:
				readies++
			}
		}
		return shown
	}
	for _, mode := range []string{"simple", "unnamed", "named"} {
		for _, reset := range []string{"RESET ALL", "DISCARD ALL"} {
			if mode == "named" && reset == "DISCARD ALL" {
				continue // it would drop the statement itself
			}
			t.Run(fmt.Sprintf("%s/%s", reset, mode), func(t *testing.T) {
				direct := run(t, pg.ConnString(appUser, appPassword, appDB), mode, reset)
				if direct != "startup_path" {
					t.Fatalf("direct: search_path %q after %s, want startup_path (the test is wrong)", direct, reset)
				}
				if pooled := run(t, tp.connString(appUser, appPassword, appDB), mode, reset); pooled != direct {
					t.Errorf("through pgtender: search_path %q after %s, straight to Postgres %q", pooled, reset, direct)
				}
			})
		}
	}
}
