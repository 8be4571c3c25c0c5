package config

import (
	"slices"
	"strings"
	"testing"
)

func TestRedactedHidesEveryPassword(t *testing.T) {
	main := `
[general]
default_pool_size = 4

[admin]
password = "pw-admin-1"

[[databases]]
name = "app"
user = "svc"
password = "pw-database-2"
pool_size = 6
`
	users := `
[[users]]
name = "alice"
database = "app"
password = "pw-user-3"
server_password = "pw-server-4"

[[users]]
name = "bob"
database = "app"
password = "` + scramSecret() + `"
min_pool_size = 2
`
	c := mustLoad(t, main, &users)
	out := c.Redacted()
	secrets := []string{"pw-admin-1", "pw-database-2", "pw-user-3", "pw-server-4", scramSecret(), "SCRAM-SHA-256"}
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("Redacted() contains the password %q:\n%s", s, out)
		}
	}
	for _, line := range []string{
		`password = "***"`,
		"[general]", "[admin]", "[[databases]]", "[[users]]",
		"default_pool_size = 4",
		"pool_size = 6\n",            // the database's own
		"pool_size = 6  # inherited", // alice's, from the database
		"min_pool_size = 2\n",        // bob's own
		`pooler_mode = "transaction"  # inherited`,
		`user = "svc"`,
		`server_user = ""`,
	} {
		if !strings.Contains(out, line) {
			t.Errorf("Redacted() lacks %q:\n%s", line, out)
		}
	}
	if n := strings.Count(out, `= "***"`); n != 5 {
		t.Errorf("Redacted() has %d redacted passwords, want 5:\n%s", n, out)
	}
	// Every key of every section is shown.
	for _, f := range tagFields(typeOf[General]()) {
		if !strings.Contains(out, "\n"+f.key+" = ") {
			t.Errorf("Redacted() lacks general key %s", f.key)
		}
	}
}

func TestDiff(t *testing.T) {
	base := `
[general]
port = 6432
default_pool_size = 10

[admin]
password = "a"

[[databases]]
name = "app"

[[databases]]
name = "gone"
`
	baseUsers := `
[[users]]
name = "alice"
database = "app"
password = "p"
`
	tests := []struct {
		name        string
		main, users string
		changed     []string
		restart     []string
	}{
		{"nothing", base, baseUsers, nil, nil},
		{"reordered entries are not a change", `
[general]
default_pool_size = 10
port = 6432

[admin]
password = "a"

[[databases]]
name = "gone"

[[databases]]
name = "app"
`, baseUsers, nil, nil},
		{"reloadable and restart keys", strings.Replace(strings.Replace(base,
			"port = 6432", "port = 7000\nworkers = 99\nlisten_backlog = 5\nlog_level = \"debug\"\nlog_format = \"json\"", 1),
			"default_pool_size = 10", "default_pool_size = 11\ncheckout_timeout = 5\nlog_connections = false", 1), baseUsers,
			[]string{"general.port", "general.workers", "general.listen_backlog", "general.default_pool_size",
				"general.checkout_timeout", "general.log_connections", "general.log_level", "general.log_format"},
			[]string{"general.port", "general.workers", "general.listen_backlog", "general.log_level", "general.log_format"}},
		{"passthrough_auth needs a restart, auth_type does not", strings.Replace(base, "port = 6432",
			"passthrough_auth = \"enabled_plain\"\nauth_type = \"md5\"", 1), baseUsers,
			[]string{"general.auth_type", "general.passthrough_auth"},
			[]string{"general.passthrough_auth"}},
		{"host and openmetrics host and namespace", strings.Replace(base, "port = 6432",
			"host = \"127.0.0.1\"\nopenmetrics_host = \"::1\"\nopenmetrics_namespace = \"x_\"", 1), baseUsers,
			[]string{"general.host", "general.openmetrics_host", "general.openmetrics_namespace"},
			[]string{"general.host", "general.openmetrics_host", "general.openmetrics_namespace"}},
		{"database added, removed and changed", `
[general]
port = 6432
default_pool_size = 10

[admin]
password = "a"

[[databases]]
name = "app"
pool_size = 3
host = "elsewhere"

[[databases]]
name = "new"
`, baseUsers,
			[]string{`databases["app"].host`, `databases["app"].pool_size`, `databases["gone"]`, `databases["new"]`}, nil},
		{"user password and settings", base, `
[[users]]
name = "alice"
database = "app"
password = "changed"
pooler_mode = "session"

[[users]]
name = "bob"
database = "app"
password = "p"
`, []string{`users["alice","app"].password`, `users["alice","app"].pooler_mode`, `users["bob","app"]`}, nil},
		{"admin password", strings.Replace(base, `password = "a"`, `password = "b"`, 1), baseUsers,
			[]string{"admin.password"}, nil},
	}
	old := mustLoad(t, base, &baseUsers)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Diff(old, mustLoad(t, tc.main, &tc.users))
			if !slices.Equal(d.Changed, tc.changed) {
				t.Errorf("Changed = %q, want %q", d.Changed, tc.changed)
			}
			if !slices.Equal(d.RestartRequired, tc.restart) {
				t.Errorf("RestartRequired = %q, want %q", d.RestartRequired, tc.restart)
			}
			if d.Empty() != (len(tc.changed) == 0) {
				t.Errorf("Empty() = %v", d.Empty())
			}
			for _, path := range d.Changed {
				if strings.Contains(path, "changed") {
					t.Errorf("a changed path carries a value: %q", path)
				}
			}
		})
	}
	if d := Diff(nil, old); len(d.Changed) == 0 {
		t.Errorf("Diff(nil, cfg) found no change")
	}
}

// TestRestartKeys pins the keys a reload cannot change.
func TestRestartKeys(t *testing.T) {
	var got []string
	for _, f := range tagFields(typeOf[General]()) {
		if f.restart {
			got = append(got, f.key)
		}
	}
	want := []string{"host", "port", "workers", "listen_backlog", "passthrough_auth", "passthrough_reverify_interval", "max_logins_in_progress", "openmetrics_port",
		"openmetrics_host", "openmetrics_namespace", "healthcheck_port", "log_level", "log_format"}
	if !slices.Equal(got, want) {
		t.Errorf("restart keys = %q, want %q", got, want)
	}
}
