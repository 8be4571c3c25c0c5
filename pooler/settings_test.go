package pooler

import (
	"reflect"
	"strings"
	"testing"

	"github.com/pgtender/pgtender/pooler/wire"
)

func TestStartupSettingsOf(t *testing.T) {
	startup := &wire.Startup{Parameters: []wire.Parameter{
		{Name: "user", Value: "app"}, {Name: "database", Value: "appdb"},
		{Name: "application_name", Value: "web"}, {Name: "_pq_.x", Value: "1"},
		{Name: "options", Value: `-c search_path=tenant_7 --statement-timeout=5s -c application_name=from\ options`},
		{Name: "extra_float_digits", Value: "3"},
	}}
	got, refused := startupSettingsOf(startup)
	if refused != nil {
		t.Fatal(refused)
	}
	// options come after the other parameters and win, as in Postgres.
	want := settingsOf("application_name", "from options", "search_path", "tenant_7",
		"statement_timeout", "5s", "extra_float_digits", "3")
	if !got.equal(want) {
		t.Errorf("settings = %v, want %v", got, want)
	}
	if _, refused := startupSettingsOf(&wire.Startup{Parameters: []wire.Parameter{{Name: "options", Value: "-c"}}}); refused == nil || refused.code != sqlstateSyntaxError {
		t.Errorf("malformed options: %v, want 42601", refused)
	}
	if got, _ := startupSettingsOf(&wire.Startup{Parameters: []wire.Parameter{{Name: "user", Value: "app"}}}); len(got) != 0 {
		t.Errorf("no settings: %v", got)
	}
}

func TestProbeResult(t *testing.T) {
	var r probeResult
	rows := [][]string{
		{"c", "statement_timeout", "250s"}, {"c", "lock_timeout", "0"},
		{"s", "search_path", "tenant_7, public"}, {"s", "role", "reader"},
		{"d", "statement_timeout", "0"}, {"d", "lock_timeout", "0"},
		{"s", "app.tenant", "7"},
		{"p", "listen", "1"}, {"p", "advisory", "0"}, {"p", "cursor", "0"}, {"p", "prepare", "0"}, {"p", "temp", "2"},
	}
	for _, row := range rows {
		values := [][]byte{[]byte(row[0]), []byte(row[1]), []byte(row[2])}
		if err := r.takeProbeRow(values); err != nil {
			t.Fatalf("%v: %v", row, err)
		}
	}
	r.finish()
	// lock_timeout is at its session-start value: not the client's.
	want := settingsOf("statement_timeout", "250s", "search_path", "tenant_7, public", "role", "reader", "app.tenant", "7")
	if !r.settings.equal(want) {
		t.Errorf("settings = %v, want %v", r.settings, want)
	}
	if !r.pins.any() || r.pins.listening != 1 || r.pins.tempRelations != 2 || r.pins.String() != "LISTEN, temporary tables" {
		t.Errorf("pins = %+v (%s)", r.pins, r.pins)
	}
	for _, bad := range [][][]byte{
		{[]byte("s"), []byte("x")},
		{[]byte("p"), []byte("listen"), []byte("many")},
		{[]byte("?"), []byte("x"), []byte("y")},
		{[]byte("s"), nil, []byte("y")},
	} {
		if err := r.takeProbeRow(bad); err == nil {
			t.Errorf("row %q accepted", bad)
		}
	}
}

// TestProbeQueryIsQualified: nothing in the probe resolves through the
// client's search_path: every function and operator is pg_catalog's.
func TestProbeQueryIsQualified(t *testing.T) {
	q := probeQuery([]string{"app.tenant", "it's.odd"})
	if !strings.Contains(q, "; "+ownQueryPrefix) {
		t.Fatalf("the probe does not turn the timeouts off:\n%s", q)
	}
	for _, unqualified := range []string{" current_setting(", " count(", " = ", " <> ", "FROM pg_settings", "FROM pg_locks"} {
		if strings.Contains(strings.Replace(q, ownQueryPrefix, "", 1), unqualified) {
			t.Errorf("probe query has unqualified %q:\n%s", unqualified, q)
		}
	}
	if !strings.Contains(q, `('it''s.odd'::pg_catalog.text)`) {
		t.Errorf("custom name not quoted as a literal:\n%s", q)
	}
	if !strings.HasPrefix(q, "SELECT 'c', 'statement_timeout'") {
		t.Errorf("the timeouts are not read first:\n%s", q)
	}
}

func TestCustomSettings(t *testing.T) {
	var c customSettings
	for _, name := range []string{"app.tenant", "App.Tenant", "b.x", "a.y"} {
		if !c.learn(name) {
			t.Fatalf("learn(%q) refused", name)
		}
	}
	if got := strings.Join(c.list(), ","); got != "a.y,app.tenant,b.x" {
		t.Errorf("names = %s", got)
	}
	for i := len(c.list()); i < maxCustomSettings; i++ {
		c.learn("n.n" + strings.Repeat("x", i))
	}
	if c.learn("one.more") {
		t.Error("learned past maxCustomSettings")
	}
	if !c.learn("app.tenant") {
		t.Error("a known name is refused once the set is full")
	}
}

// TestSharedSettings: logins with the same startup settings share one
// canonical map; a setting spelled differently, a value Postgres has not
// accepted, or one more setting is not a match.
func TestSharedSettings(t *testing.T) {
	var valid validSettings
	valid.store(setting{"DateStyle", "iso, mdy"}, "ISO, MDY")
	valid.store(setting{"datestyle", "iso, mdy"}, "ISO, MDY") // accepted, but the shared map spells it otherwise
	valid.store(setting{"application_name", "web"}, "web")
	startup := func(pairs ...string) sessionSettings {
		settings := make(sessionSettings)
		for i := 0; i < len(pairs); i += 2 {
			settings.set(pairs[i], pairs[i+1])
		}
		return settings
	}
	var shared sharedSettings
	if got := shared.find(startup("DateStyle", "iso, mdy"), &valid); got != nil {
		t.Fatalf("found %v before any was added", got)
	}
	canonical := sessionSettings{"datestyle": {"DateStyle", "ISO, MDY"}, "application_name": {"application_name", "web"}}
	shared.add(canonical)
	got := shared.find(startup("application_name", "web", "DateStyle", "iso, mdy"), &valid)
	if got == nil || reflect.ValueOf(got).UnsafePointer() != reflect.ValueOf(canonical).UnsafePointer() {
		t.Fatalf("the same settings: got %v, want the shared map", got)
	}
	for name, settings := range map[string]sessionSettings{
		"spelled otherwise": startup("application_name", "web", "datestyle", "iso, mdy"),
		"not accepted":      startup("application_name", "api", "DateStyle", "iso, mdy"),
		"fewer":             startup("application_name", "web"),
		"more":              startup("application_name", "web", "DateStyle", "iso, mdy", "TimeZone", "UTC"),
	} {
		if got := shared.find(settings, &valid); got != nil {
			t.Errorf("%s: got %v, want no match", name, got)
		}
	}
	for range sharedSettingsEntries { // the oldest entries give way
		shared.add(sessionSettings{"application_name": {"application_name", "web"}})
	}
	if got := shared.find(startup("application_name", "web", "DateStyle", "iso, mdy"), &valid); got != nil {
		t.Errorf("after %d more were added: got %v, want the first one gone", sharedSettingsEntries, got)
	}
}
