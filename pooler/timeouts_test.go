package pooler

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtender/pgtender/config"
)

// A request Postgres does not answer within query_timeout ends the
// client's session with 57014, and the request is canceled. A server that
// honours the cancel (SLEEP) answers, and its connection, drained and
// clean, goes to the next client; one that does not (GATE, a server that
// stopped answering) is closed after rollback_timeout.
func TestQueryTimeoutEndsTheSessionAndCancelsTheRequest(t *testing.T) {
	for _, tc := range []struct {
		request string
		reused  bool
	}{
		{"SLEEP", true},
		{"GATE never", false},
	} {
		t.Run(tc.request, func(t *testing.T) {
			h := newHarness(t, func(cfg *config.Config) {
				cfg.General.DefaultPoolSize = 1
				cfg.General.QueryTimeout = 100
				cfg.General.RollbackTimeout = 200
			})
			client := h.connect()
			pid := mustWhoami(t, client)
			_, err := execSQL(client, tc.request)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != sqlstateQueryCanceled || pgErr.Severity != "FATAL" ||
				!strings.Contains(pgErr.Message, "query_timeout") {
				t.Fatalf("%s past query_timeout: %v; want FATAL 57014 naming query_timeout", tc.request, err)
			}
			if got := h.p.ClientTimeouts(); got != (ClientTimeouts{Query: 1}) {
				t.Errorf("client timeouts %+v, want Query 1", got)
			}
			waitFor(t, "the request to be canceled", func() bool { return len(h.fake.cancelList()) == 1 })
			if cancel := h.fake.cancelList()[0]; cancel.PID != pid || !cancel.Matched {
				t.Errorf("cancel %+v, want one for backend %d with its secret", cancel, pid)
			}
			next := h.connect()
			if got := mustWhoami(t, next); (got == pid) != tc.reused {
				t.Errorf("next client on backend %d (the timed-out one was %d); reused = %v, want %v", got, pid, got == pid, tc.reused)
			}
		})
	}
}

// Requests that each end within query_timeout are never cut, however long
// the transaction or pipeline they make up, and neither is a client that
// is idle for longer.
func TestQueryTimeoutTimesEachRequest(t *testing.T) {
	h := newHarness(t, func(cfg *config.Config) {
		cfg.General.DefaultPoolSize = 1
		cfg.General.QueryTimeout = 200
	})
	client := h.connect()
	mustExec(t, client, "BEGIN")
	for i := range 5 {
		name := "step" + strconv.Itoa(i)
		gate := goExec(t, client, "GATE "+name)
		waitFor(t, "the request to reach the gate", func() bool { return h.fake.atGate(name) != nil })
		// About half the timeout each, so that the five together take
		// several timeouts.
		time.Sleep(100 * time.Millisecond)
		h.fake.openGate(name)
		if err := recvWithin(t, gate, "the gated request"); err != nil {
			t.Fatalf("a request shorter than query_timeout: %v", err)
		}
	}
	mustExec(t, client, "COMMIT")
	time.Sleep(400 * time.Millisecond) // idle, longer than the timeout
	mustWhoami(t, client)
	if got := h.p.ClientTimeouts(); got != (ClientTimeouts{}) {
		t.Errorf("client timeouts %+v, want none", got)
	}
}

// A reload that turns query_timeout off lets a request already being timed
// run to its end.
func TestQueryTimeoutTurnedOffByAReload(t *testing.T) {
	var cfg config.Config
	h := newHarness(t, func(c *config.Config) {
		c.General.DefaultPoolSize = 1
		c.General.QueryTimeout = 150
		cfg = *c
	})
	client := h.connect()
	gate := goExec(t, client, "GATE reloaded")
	waitFor(t, "the request to reach the gate", func() bool { return h.fake.atGate("reloaded") != nil })
	cfg.General.QueryTimeout = 0
	if err := h.p.Reload(&cfg); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	time.Sleep(300 * time.Millisecond) // past the old timeout
	h.fake.openGate("reloaded")
	if err := recvWithin(t, gate, "the gated request"); err != nil {
		t.Fatalf("a request timed before query_timeout was turned off: %v", err)
	}
	if got := h.p.ClientTimeouts(); got != (ClientTimeouts{}) {
		t.Errorf("client timeouts %+v, want none", got)
	}
}
