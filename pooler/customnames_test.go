package pooler

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/pooler/sqlscan"
)

// scannedSession is a transaction-mode session of pool that has just
// relayed text (the part of feedText that takes in custom names).
func scannedSession(pool *Pool) *session {
	return &session{pool: pool, mode: config.PoolerModeTransaction}
}

func (s *session) scanText(text string) { s.scanBytes([]byte(text)) }

func (s *session) scanBytes(text []byte) {
	if s.sql == nil {
		s.sql = new(sqlscan.Scanner)
	}
	s.sql.Reset()
	s.sql.Write(text)
	s.noteCustomSettings(s.sql.Effects())
}

func TestNoteCustomSettings(t *testing.T) {
	pool := newPool(poolKey{user: "u", database: "d"}, poolSettings{mode: config.PoolerModeTransaction}, nil)
	s := scannedSession(pool)
	s.scanText(`SET "App".Tenant = 7; SELECT set_config('app.user', $1, false); SET LOCAL app.local = 1`)
	if got := strings.Join(s.ownCustomNames, ","); got != "app.tenant,app.user" {
		t.Errorf("own names %s", got)
	}
	if got := strings.Join(pool.customNames.list(), ","); got != "app.tenant,app.user" {
		t.Errorf("pool names %s", got)
	}
	if s.untrackedSettings {
		t.Error("untracked after names it could see")
	}

	// The names a client sets again are known: nothing is added, and
	// nothing allocated.
	again := []byte("SET app.tenant = 8; SET APP.USER = 'x'")
	allocs := testing.AllocsPerRun(100, func() { s.scanBytes(again) })
	if allocs != 0 || len(s.ownCustomNames) != 2 {
		t.Errorf("setting known names again: %v allocations, own names %v", allocs, s.ownCustomNames)
	}

	// Another client's probe asks for the names this one set.
	other := scannedSession(pool)
	sc := &ServerConn{pool: pool}
	if got := other.customNamesToProbe(sc); !slices.Contains(got, "app.tenant") {
		t.Errorf("another client's probe asks for %v", got)
	}
}

func TestNoteCustomSettingsPastThePoolsBound(t *testing.T) {
	pool := newPool(poolKey{user: "u", database: "d"}, poolSettings{mode: config.PoolerModeTransaction}, nil)
	for i := range maxCustomSettings {
		pool.customNames.learn(fmt.Sprintf("full.n%d", i))
	}
	s := scannedSession(pool)
	s.scanText("SET late.name = 1")
	if slices.Contains(pool.customNames.list(), "late.name") {
		t.Fatal("the pool learned past maxCustomSettings")
	}
	sc := &ServerConn{pool: pool}
	if got := s.customNamesToProbe(sc); !slices.Contains(got, "late.name") {
		t.Errorf("the client's own probe does not ask for its name: %v", got)
	}
	if other := scannedSession(pool).customNamesToProbe(sc); slices.Contains(other, "late.name") {
		t.Errorf("another client's probe asks for a name it never set: %v", other)
	}
	if s.untrackedSettings {
		t.Error("untracked while its names fit")
	}
}

func TestNoteCustomSettingsUntracked(t *testing.T) {
	pool := newPool(poolKey{user: "u", database: "d"}, poolSettings{mode: config.PoolerModeTransaction}, nil)

	s := scannedSession(pool)
	s.scanText("SELECT set_config($1, $2, false)")
	if !s.untrackedSettings {
		t.Error("set_config of a name the text does not show did not mark the client")
	}

	local := scannedSession(pool)
	local.scanText("SELECT set_config($1, $2, true)")
	if local.untrackedSettings {
		t.Error("a transaction-local set_config marked the client")
	}

	many := scannedSession(pool)
	for i := range maxCustomSettings {
		many.scanText(fmt.Sprintf("SET own.n%d = 1", i))
	}
	if many.untrackedSettings {
		t.Fatalf("untracked at %d names", maxCustomSettings)
	}
	many.scanText("SET own.one_more = 1")
	if !many.untrackedSettings || len(many.ownCustomNames) != maxCustomSettings {
		t.Errorf("past %d own names: untracked %v, %d names", maxCustomSettings, many.untrackedSettings, len(many.ownCustomNames))
	}

	session := &session{pool: pool, mode: config.PoolerModeSession}
	session.scanText("SELECT set_config($1, $2, false); SET app.x = 1")
	if session.untrackedSettings || len(session.ownCustomNames) != 0 {
		t.Error("session mode followed custom names: DISCARD ALL resets them")
	}
}

func TestContainsCustomName(t *testing.T) {
	names := []string{"app.tenant", "appé.x"}
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"app.tenant", true}, {"APP.Tenant", true}, {"app.tenan", false},
		{"appé.x", true}, {"APPé.X", true}, {"appÉ.x", false}, // only ASCII folds
	} {
		if got := containsCustomName(names, []byte(tc.name)); got != tc.want {
			t.Errorf("containsCustomName(%q) = %v", tc.name, got)
		}
	}
}

// TestUnnamedCustomSettingPinsForGood: a client that may have set a custom
// parameter whose name pgtender cannot see keeps its server connection for
// the rest of its life (no probe could release it, so none is run: this
// fake Postgres would fail it), is counted as pinned, and the connection
// is not reused after it.
func TestUnnamedCustomSettingPinsForGood(t *testing.T) {
	h := newHarness(t, nil)
	a := h.connect()
	mustExec(t, a, "SELECT set_config(current_user, 'x', false)")
	pid := mustWhoami(t, a)
	pinned := func() int { return h.p.PoolStats()[0].ClientsPinned }
	waitFor(t, "the client to be counted as pinned", func() bool { return pinned() == 1 })

	b := h.connect()
	other := goWhoami(t, b)
	h.waitWaiting(1)
	for range 3 {
		if got := mustWhoami(t, a); got != pid {
			t.Fatalf("pinned client moved from backend %d to %d", pid, got)
		}
	}
	if !notYet(other) {
		t.Fatal("another client got the pinned server connection")
	}

	closeClient(a)
	got := recvWithin(t, other, "the other client's WHOAMI")
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.pid == pid {
		t.Errorf("the pinned client's server connection (backend %d) was reused", pid)
	}
	waitFor(t, "the pin to end", func() bool { return pinned() == 0 })
	c := h.fake.byPID(pid)
	if c == nil || !c.Ended() {
		t.Fatal("the pinned client's server connection is still open")
	}
	// Closed as it was, not rolled back or probed first: nothing pgtender
	// could learn makes it clean.
	for _, q := range c.Queries() {
		if strings.Contains(q, "pg_settings") || q == "ROLLBACK" {
			t.Errorf("the pinned connection got %q after its client left", q)
		}
	}
}
