package admin

import (
	"errors"
	"testing"
)

func TestParseCommand(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  Command
	}{
		{"", Command{}},
		{" ; ", Command{}},
		{"SHOW POOLS", Command{"SHOW", "pools"}},
		{"  show Pools ;", Command{"SHOW", "pools"}},
		{"show\tstats_totals;", Command{"SHOW", "stats_totals"}},
		{"reload", Command{"RELOAD", ""}},
		{"KILL_CLIENT 42", Command{"KILL_CLIENT", "42"}},
		{`PAUSE "My""Db"`, Command{"PAUSE", `My"Db`}},
		{"pause MyDb", Command{"PAUSE", "MyDb"}},
		{"SELECT version", Command{"SELECT", "version"}},
		{"SET default_pool_size = 5", Command{"SET", "default_pool_size = 5"}},
		{"set\tserver_lifetime='100' ;", Command{"SET", "server_lifetime='100'"}},
	} {
		got, err := ParseCommand(tc.query)
		if err != nil || got != tc.want {
			t.Errorf("ParseCommand(%q) = %+v, %v; want %+v", tc.query, got, err, tc.want)
		}
	}
	for _, query := range []string{
		"SHOW POOLS EXTRA", "SHOW;POOLS", "1+1", "select 1 + 1", `PAUSE "unclosed`, `PAUSE ""`,
		"SHOW POOLS;;", "SHOW-POOLS", "héllo",
	} {
		_, err := ParseCommand(query)
		var syntax *SyntaxError
		if !errors.As(err, &syntax) {
			t.Errorf("ParseCommand(%q) = %v, want a SyntaxError", query, err)
			continue
		}
		if want := "invalid command '" + query + "', use SHOW HELP;"; err.Error() != want {
			t.Errorf("ParseCommand(%q) error %q, want PgBouncer's %q", query, err, want)
		}
	}
}

func FuzzParseCommand(f *testing.F) {
	for _, seed := range []string{"SHOW POOLS", `PAUSE "a""b"`, "KILL_CLIENT 1;", ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, query string) {
		cmd, err := ParseCommand(query)
		if err != nil {
			return
		}
		// A command that parsed has a verb unless it was empty, and no
		// argument without a verb.
		if cmd.Verb == "" && cmd.Arg != "" {
			t.Fatalf("ParseCommand(%q) = %+v", query, cmd)
		}
	})
}
