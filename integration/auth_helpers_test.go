package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// newRole creates a login role only this test uses, so the counts of its
// lines in the Postgres log are this test's alone, and drops it at the end.
func newRole(t testing.TB, name, password string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pg.CreateRole(ctx, name, password); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// The pooler is shut down before this runs (cleanups run last in,
		// first out), so no session of the role is left but stray ones.
		_ = pg.Exec(ctx, fmt.Sprintf("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '%s'", name))
		if err := pg.Exec(ctx, `DROP ROLE IF EXISTS "`+name+`"`); err != nil {
			t.Logf("dropping role %s: %v", name, err)
		}
	})
}

// setPassword changes a role's password in Postgres, as an operator would.
func setPassword(t testing.TB, role, password string) {
	t.Helper()
	alterRole(t, role, "PASSWORD '"+password+"'")
}

// alterRole runs ALTER ROLE role change as the superuser.
func alterRole(t testing.TB, role, change string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pg.Exec(ctx, `ALTER ROLE "`+role+`" `+change); err != nil {
		t.Fatal(err)
	}
}

// failedAuthentications counts the lines of the Postgres log saying a
// password login of role failed.
func failedAuthentications(t testing.TB, role string) int {
	t.Helper()
	n, err := pg.CountLogLines(`password authentication failed for user "` + role + `"`)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// randomPassword is a password no role has.
func randomPassword() string {
	b := make([]byte, 12)
	rand.Read(b)
	return "wrong-" + hex.EncodeToString(b)
}

// loginClient logs in through a pooler and out again, as a short-lived
// client does, with pgconn.
type loginClient struct {
	pooler *testPooler
	base   *pgconn.Config
}

func newLoginClient(t testing.TB, tp *testPooler, user string) *loginClient {
	t.Helper()
	cfg, err := pgconn.ParseConfig(tp.connString(user, "unused", appDB))
	if err != nil {
		t.Fatal(err)
	}
	return &loginClient{pooler: tp, base: cfg}
}

// warmPassthrough creates role with password, starts a pooler with opts
// (a passthrough mode among them) and logs in once, so the password is
// verified and the role's pool has a server connection. It returns a
// client of the role.
func warmPassthrough(t testing.TB, role, password string, opts poolerOptions) *loginClient {
	t.Helper()
	newRole(t, role, password)
	client := newLoginClient(t, startPooler(t, opts), role)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := client.login(ctx, password); err != nil {
		t.Fatalf("first login: %v", err)
	}
	return client
}

// login logs in with password and closes the connection at once; it
// returns the login's error.
func (c *loginClient) login(ctx context.Context, password string) error {
	cfg := c.base.Copy()
	cfg.Password = password
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// attempt is one login of a storm.
type attempt struct {
	start, end time.Duration // since the storm began
	password   string        // a name for it ("A", "B", "right", "wrong"), not the password
	err        error
}

// attemptLog collects attempts from many goroutines.
type attemptLog struct {
	mu       sync.Mutex
	attempts []attempt
}

func (l *attemptLog) add(a attempt) {
	l.mu.Lock()
	l.attempts = append(l.attempts, a)
	l.mu.Unlock()
}

// sorted returns the attempts by start time.
func (l *attemptLog) sorted() []attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]attempt(nil), l.attempts...)
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out
}

// errorSummary counts errors by SQLSTATE (or text, for those without one),
// for failure messages.
func errorSummary(attempts []attempt) string {
	counts := map[string]int{}
	for _, a := range attempts {
		if a.err == nil {
			continue
		}
		key := sqlState(a.err)
		if key == "" {
			key = a.err.Error()
		}
		counts[a.password+" "+key]++
	}
	var parts []string
	for k, n := range counts {
		parts = append(parts, fmt.Sprintf("%s: %d", k, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}
