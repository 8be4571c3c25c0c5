package pooler

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgtender/pgtender/config"
)

// TestConsoleQueryPipelinedBehindPassword: a console query sent in the
// same write as the password is answered after the login, not lost with
// the login's read buffer.
func TestConsoleQueryPipelinedBehindPassword(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) {
		cfg.General.AuthType = config.AuthPlain
		cfg.Admin.Password = "console-secret"
	})
	conn := h.dial()
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{"user": "admin", "database": "admin"}}))
	fe := pgproto3.NewFrontend(conn, conn)
	if msg := receiveMessage(t, conn, fe); describeMsg(msg) != "AuthenticationCleartextPassword" {
		t.Fatalf("got %s, want a cleartext password request", describeMsg(msg))
	}
	writeRaw(t, conn, encodeMsgs(t, &pgproto3.PasswordMessage{Password: "console-secret"}, &pgproto3.Query{String: "SHOW VERSION"}))
	var got []string
	for len(got) == 0 || got[len(got)-1] != "ReadyForQuery" || len(got) < 6 {
		msg := receiveMessage(t, conn, fe)
		switch msg.(type) {
		case *pgproto3.ParameterStatus, *pgproto3.BackendKeyData:
			continue
		}
		got = append(got, strings.TrimPrefix(fmt.Sprintf("%T", msg), "*pgproto3."))
		if len(got) > 8 {
			break
		}
	}
	want := []string{"AuthenticationOk", "ReadyForQuery", "RowDescription", "DataRow", "CommandComplete", "ReadyForQuery"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}
