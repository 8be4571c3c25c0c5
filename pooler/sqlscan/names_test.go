package sqlscan

import (
	"strings"
	"testing"
)

// customNames lists what a Scanner captured, joined by ",".
func customNames(s *Scanner) string {
	names := make([]string, s.NumCustomNames())
	for i := range names {
		names[i] = string(s.CustomName(i))
	}
	return strings.Join(names, ",")
}

type namesCase struct {
	text    string
	names   string  // captured, joined by ","
	unknown bool    // UnknownCustomName
	effects Effects // all of them, when not 0
}

var namesCases = []namesCase{
	// SET and RESET: var_name is ColId ('.' ColId)*.
	{text: "SET app.tenant = '7'", names: "app.tenant"},
	{text: "set App.Tenant TO 7", names: "app.tenant"},
	{text: "SET SESSION app.tenant = 7", names: "app.tenant"},
	{text: `SET "App"."Tenant" = 7`, names: "App.Tenant"},
	{text: `SET "app.tenant" = 7`, names: "app.tenant"}, // one ColId with a dot in it
	{text: `SET "a""b".c = 1`, names: `a"b.c`},
	{text: "SET app . tenant = 7", names: "app.tenant"},
	{text: "SET app/* c */.tenant = 7", names: "app.tenant"},
	{text: "SET a.b.c = 1", names: "a.b.c"},
	{text: "SET app.tenant FROM CURRENT", names: "app.tenant"},
	{text: "SET app.tenant TO DEFAULT", names: "app.tenant"},
	{text: "SET app.tenant=7", names: "app.tenant"},
	{text: "SET local.thing = 1", names: "local.thing"},
	{text: "SET session.thing = 1", names: "session.thing"},
	{text: "SET SESSION session.thing = 1", names: "session.thing"},
	{text: "SET transaction.thing = 1", names: "transaction.thing"},
	{text: "RESET app.tenant", names: "app.tenant"},
	{text: "reset app.tenant;", names: "app.tenant"},
	{text: "SET app.a = 1; SET app.b = 2; RESET APP.A", names: "app.a,app.b"},
	{text: `SET app.a = 1; SET "APP"."A" = 2`, names: "app.a"}, // one parameter: names ignore ASCII case
	{text: "BEGIN; SET app.tenant = 7; COMMIT", names: "app.tenant"},
	{text: "SET " + strings.Repeat("p", 70) + ".x = 1", names: strings.Repeat("p", 63) + ".x"}, // truncated as an identifier
	// Nothing to capture.
	{text: "SET LOCAL app.tenant = 7", effects: 0},
	{text: "SET LOCAL local.thing = 1", effects: 0},
	{text: "SET search_path = x", effects: SetsSetting},
	{text: "SET SESSION AUTHORIZATION bob", effects: SetsSetting},
	{text: "RESET ALL", effects: ResetsAll},
	{text: "SET app. = 1", effects: SetsSetting}, // a syntax error
	{text: "SET app.'x' = 1", effects: SetsSetting},
	{text: "ALTER ROLE r SET app.tenant = 7", effects: 0},
	{text: "ALTER DATABASE d RESET app.tenant", effects: 0},
	{text: "CREATE FUNCTION f() RETURNS int LANGUAGE sql SET app.x = 1 AS 'SELECT 1'", effects: 0},
	{text: "UPDATE t SET app.x = 1", effects: 0},
	{text: "SELECT app.tenant FROM app", effects: 0},
	{text: "SELECT 'SET app.x = 1'", effects: 0},

	// set_config(setting_name, new_value, is_local).
	{text: "SELECT set_config('app.tenant', '7', false)", names: "app.tenant"},
	{text: "select pg_catalog.set_config('App.Tenant', $1, false)", names: "App.Tenant"},
	{text: "SELECT set_config('app.tenant', $1, $2)", names: "app.tenant"},
	{text: "SELECT set_config('app.tenant', f(1, 2), false)", names: "app.tenant"},
	{text: "SELECT set_config('app.tenant', '7', 'true')", names: "app.tenant"}, // only the literal TRUE is read
	{text: "SELECT set_config('it''s.x', '7', false)", names: "it's.x"},
	{text: "SELECT set_config(E'app.tenant', '7', false)", names: "app.tenant"},
	{text: "SELECT set_config('app'\n'.tenant', '7', false)", names: "app.tenant"}, // a continued string
	{text: "SELECT set_config('app.a', '1', false), set_config('app.b', '2', false)", names: "app.a,app.b"},
	{text: "SELECT set_config('search_path', 'x', false)", effects: SetsSetting},
	{text: "SELECT set_config('app.tenant', '7', true)", effects: SetsSetting},
	{text: "SELECT set_config('app.tenant', '7', TRUE)", effects: SetsSetting},
	{text: "SELECT set_config('app.tenant', f(1, false), true)", effects: SetsSetting},
	{text: "SELECT set_config($1, $2, true)", effects: SetsSetting},
	{text: "SELECT 1 AS set_config", effects: SetsSetting}, // not a call
	// Names the text does not show.
	{text: "SELECT set_config($1, $2, false)", unknown: true},
	{text: "SELECT set_config($1, '7', $2)", unknown: true},
	{text: "SELECT set_config('app.' || $1, '7', false)", unknown: true},
	{text: "SELECT set_config('app.tenant'::text, '7', false)", unknown: true},
	{text: "SELECT set_config(name, '7', false) FROM t", unknown: true},
	{text: "SELECT set_config(('app.x'), '7', false)", unknown: true},
	{text: "SELECT set_config($$app.tenant$$, '7', false)", unknown: true},
	{text: "SELECT set_config(E'app\\x2etenant', '7', false)", unknown: true},
	{text: "SELECT set_config(U&'app.tenant', '7', false)", unknown: true},
	{text: "SELECT set_config('app.tenant', '7', true", effects: SetsSetting}, // cut short: a syntax error
	{text: "SELECT set_config('app.a', set_config('app.b', '1', false), false)", unknown: true},
	{text: "SELECT set_config(setting_name => 'app.x', new_value => '7', is_local => false)", unknown: true},
}

func TestCustomNames(t *testing.T) {
	for _, tc := range namesCases {
		s := scanPieces(tc.text, false)
		effects := s.Effects()
		got := customNames(s)
		if got != tc.names || (effects&UnknownCustomName != 0) != tc.unknown {
			t.Errorf("%q: names %q, %v; want %q, unknown %v", tc.text, got, effects, tc.names, tc.unknown)
			continue
		}
		if tc.effects != 0 || tc.names == "" && !tc.unknown {
			if effects != tc.effects {
				t.Errorf("%q: %v, want %v", tc.text, effects, tc.effects)
			}
		}
		if (tc.names != "" || tc.unknown) && effects&SetsSetting == 0 {
			t.Errorf("%q: names without SetsSetting (%v)", tc.text, effects)
		}
		for cut := 0; cut <= len(tc.text); cut++ {
			split := scanPieces(tc.text, false, cut)
			if got := customNames(split); got != tc.names || split.Effects() != effects {
				t.Fatalf("%q split at %d: names %q, %v; in one piece %q, %v", tc.text, cut, got, split.Effects(), tc.names, effects)
			}
		}
	}
}

func TestCustomNamesStandardConformingStringsOff(t *testing.T) {
	for _, tc := range []namesCase{
		{text: "SELECT set_config('app.tenant', '7', false)", names: "app.tenant"},
		{text: "SELECT set_config('app\\.tenant', '7', false)", unknown: true},
	} {
		s := scanPieces(tc.text, true)
		if got, unknown := customNames(s), s.Effects()&UnknownCustomName != 0; got != tc.names || unknown != tc.unknown {
			t.Errorf("%q: names %q, unknown %v; want %q, %v", tc.text, got, unknown, tc.names, tc.unknown)
		}
	}
}

func TestCustomNamesBounds(t *testing.T) {
	var many strings.Builder
	for i := range maxCustomNames {
		many.WriteString("SET app.n" + string(rune('a'+i)) + " = 1;")
	}
	s := scanPieces(many.String(), false)
	if n := s.NumCustomNames(); n != maxCustomNames || s.Effects()&UnknownCustomName != 0 {
		t.Fatalf("%d names: kept %d, %v", maxCustomNames, n, s.Effects())
	}
	many.WriteString("SET app.one_more = 1; SET app.na = 2")
	s = scanPieces(many.String(), false)
	if n := s.NumCustomNames(); n != maxCustomNames || s.Effects()&UnknownCustomName == 0 {
		t.Errorf("%d names and one more: kept %d, %v; want UnknownCustomName", maxCustomNames, n, s.Effects())
	}

	long := "SELECT set_config('app." + strings.Repeat("x", customNameBytes) + "', '1', false)"
	s = scanPieces(long, false)
	if n := s.NumCustomNames(); n != 0 || s.Effects()&UnknownCustomName == 0 {
		t.Errorf("a name longer than the Scanner keeps: %d names, %v; want UnknownCustomName", n, s.Effects())
	}
	// A long name that does not fit does not take a later one's place.
	s = scanPieces(long+"; SET app.short = 1", false)
	if got := customNames(s); got != "app.short" {
		t.Errorf("after a name that did not fit: %q", got)
	}
}

func TestCustomNamesReset(t *testing.T) {
	var s Scanner
	s.Write([]byte("SET app.tenant = 1"))
	if s.NumCustomNames() != 1 {
		t.Fatal("not captured")
	}
	s.Reset()
	s.Write([]byte("SELECT 1"))
	if n := s.NumCustomNames(); n != 0 {
		t.Errorf("Reset kept %d names", n)
	}
}

func TestMaySetUnnamedCustom(t *testing.T) {
	for _, tc := range []struct {
		e    Effects
		want bool
	}{
		{0, false},
		{SetsSetting, false},
		{SetsSetting | UnknownCustomName, true},
		{Uncertain, true},
		{DoBlock, false},
	} {
		if got := tc.e.MaySetUnnamedCustom(); got != tc.want {
			t.Errorf("%v.MaySetUnnamedCustom() = %v", tc.e, got)
		}
	}
	if !UnknownCustomName.MayChangeSettings() || !UnknownCustomName.NeedsSession() {
		t.Error("UnknownCustomName is in neither group")
	}
}
