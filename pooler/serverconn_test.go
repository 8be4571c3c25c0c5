package pooler

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestCopyFailedByClient: only Postgres's answer to a CopyFail counts, also
// when the relay saw just the first bytes of it.
func TestCopyFailedByClient(t *testing.T) {
	body := func(code, message string) []byte {
		b, err := (&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: code, Message: message, Routine: "CopyGetData"}).Encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		return b[5:]
	}
	copyFail := body("57014", "COPY from stdin failed: client went away")
	for _, tc := range []struct {
		name string
		body []byte
		want bool
	}{
		{"CopyFail answer", copyFail, true},
		{"its first bytes", copyFail[:len(copyFail)-20], true},
		{"cut inside the prefix", copyFail[:len(copyFail)-40], false},
		{"cancel", body("57014", "canceling statement due to user request"), false},
		{"bad row", body("22P02", "invalid input syntax for type integer"), false},
		{"empty", nil, false},
	} {
		if got := copyFailedByClient(tc.body); got != tc.want {
			t.Errorf("%s: copyFailedByClient = %v, want %v", tc.name, got, tc.want)
		}
	}
}
