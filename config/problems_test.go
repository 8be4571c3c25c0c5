package config

import (
	"strings"
	"testing"
)

// TestProblems covers every class of problem, each with its file, line and
// key path.
func TestProblems(t *testing.T) {
	const db = "\n[[databases]]\nname = \"app\"\n" // lines 2-3 after the text before it
	tests := []struct {
		name  string
		main  string
		users *string
		want  []want
	}{
		// Syntax and types.
		{"syntax error", "[general]\nport = = 1\n", nil,
			[]want{{"pgdog.toml", 2, "", "invalid TOML"}}},
		{"duplicate key", "[general]\nport = 1\nport = 2\n" + db, nil,
			[]want{{"pgdog.toml", 3, "", "already been defined"}}},
		{"string for int", "[general]\nport = \"6432\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.port", "must be an integer, found a string"}}},
		{"float for int", "[general]\nworkers = 2.5\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.workers", "must be an integer, found a float"}}},
		{"int for string", "[general]\nhost = 1\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.host", "must be a string, found an integer"}}},
		{"string for bool", "[general]\nlog_connections = \"yes\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.log_connections", "must be true or false"}}},
		{"PgBouncer's every address", "[general]\nhost = \"*\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.host", `"*" is not one address`}}},
		{"address list", "[general]\nhost = \"127.0.0.1, ::1\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.host", "is not one address"}}},
		{"int out of range", "[general]\nport = 99999999999999999\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.port", "between 1 and 65535"}}},
		{"section not a table", "general = 1\n" + db, nil,
			[]want{{"pgdog.toml", 1, "general", "must be a table"}}},
		{"databases not an array", "[databases]\nname = \"x\"\n", nil,
			[]want{{"pgdog.toml", 1, "databases", "must be an array of tables"}}},

		// Unknown and unsupported keys.
		{"unknown general key", "[general]\nbogus = 1\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.bogus", "unknown key"}}},
		{"unknown section", "[bogus]\n" + db, nil,
			[]want{{"pgdog.toml", 1, "bogus", "unknown key"}}},
		{"general key at top level", "port = 6432\n" + db, nil,
			[]want{{"pgdog.toml", 1, "port", "below the [general] header"}}},
		{"users in pgdog.toml", "[[users]]\nname = \"a\"\n" + db, nil,
			[]want{{"pgdog.toml", 1, "users", "belong in users.toml"}}},
		{"unsupported general key", "[general]\nquery_parser = \"on\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.query_parser", "not supported by pgtender yet"}}},
		{"unsupported section", "[tcp]\nkeepalive = true\n" + db, nil,
			[]want{{"pgdog.toml", 1, "tcp", "not supported by pgtender yet"}}},
		{"unsupported array section", "[[sharded_tables]]\ndatabase = \"app\"\n" + db, nil,
			[]want{{"pgdog.toml", 1, "sharded_tables", "not supported by pgtender yet"}}},
		{"unsupported database key", db + "statement_timeout = 5\n", nil,
			[]want{{"pgdog.toml", 4, "databases[0].statement_timeout", "not supported by pgtender yet"}}},
		{"replica role", db + "role = \"replica\"\n", nil,
			[]want{{"pgdog.toml", 4, "databases[0].role", `only role = "primary"`}}},
		{"shard 1", db + "shard = 1\n", nil,
			[]want{{"pgdog.toml", 4, "databases[0].shard", "only shard = 0"}}},
		{"unknown database key", db + "hots = \"x\"\n", nil,
			[]want{{"pgdog.toml", 4, "databases[0].hots", "unknown key"}}},
		{"unknown admin key", "[admin]\npasword = \"x\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "admin.pasword", "unknown key"}}},
		{"unsupported user key", db, ptr("[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"p\"\nread_only = true\n"),
			[]want{{"users.toml", 5, "users[0].read_only", "not supported by pgtender yet"}}},
		{"unknown user key", db, ptr("[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"p\"\npasswrd = \"p\"\n"),
			[]want{{"users.toml", 5, "users[0].passwrd", "unknown key"}}},
		{"unknown users.toml section", db, ptr("[general]\nport = 1\n"),
			[]want{{"users.toml", 1, "general", "belongs in pgdog.toml"}}},

		// Ranges.
		{"port 0", "[general]\nport = 0\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.port", "must be between 1 and 65535"}}},
		{"workers 0", "[general]\nworkers = 0\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.workers", "must be at least 1"}}},
		{"listen_backlog 0", "[general]\nlisten_backlog = 0\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.listen_backlog", "must be at least 1"}}},
		{"default_pool_size 0", "[general]\ndefault_pool_size = 0\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.default_pool_size", "must be at least 1"}}},
		{"negative min_pool_size", "[general]\nmin_pool_size = -1\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.min_pool_size", "must not be negative"}}},
		{"min above default", "[general]\ndefault_pool_size = 2\nmin_pool_size = 3\n" + db, nil,
			[]want{{"pgdog.toml", 3, "general.min_pool_size", "larger than default_pool_size (2)"}}},
		{"negative max_client_connections", "[general]\nmax_client_connections = -1\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.max_client_connections", "must not be negative"}}},
		{"openmetrics_port too big", "[general]\nopenmetrics_port = 65536\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.openmetrics_port", "between 0 and 65535"}}},
		{"healthcheck_port negative", "[general]\nhealthcheck_port = -1\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.healthcheck_port", "between 0 and 65535"}}},
		{"bad namespace", "[general]\nopenmetrics_namespace = \"pg-tender\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.openmetrics_namespace", "Prometheus name"}}},
		{"negative time", "[general]\nidle_timeout = -1\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.idle_timeout", "must not be negative"}}},
		{"zero bound", "[general]\ncheckout_timeout = 0\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.checkout_timeout", "at least 1"}}},
		{"time overflows Duration", "[general]\nserver_lifetime = 9223372036854775807\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.server_lifetime", "must be at most"}}},

		// Enumerations.
		{"pooler_mode", "[general]\npooler_mode = \"tx\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.pooler_mode", `"tx" is not one of "transaction" or "session"`}}},
		{"statement mode", "[general]\npooler_mode = \"statement\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.pooler_mode", "not supported by pgtender yet"}}},
		{"auth_type", "[general]\nauth_type = \"cert\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.auth_type", "is not one of"}}},
		{"passthrough_auth", "[general]\npassthrough_auth = \"on\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.passthrough_auth",
				`"on" is not one of "disabled", "enabled", "enabled_plain", "enabled_allow_change" or "enabled_plain_allow_change"`}}},
		{"tls_verify", "[general]\ntls_verify = \"full\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.tls_verify", "is not one of"}}},
		{"prepared_statements full", "[general]\nprepared_statements = \"full\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.prepared_statements", `"full" is not supported by pgtender yet; use "disabled"`}}},
		{"prepared_statements_limit", "[general]\nprepared_statements_limit = -1\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.prepared_statements_limit", "must not be negative"}}},
		{"prepared_statements offers only values in effect", "[general]\nprepared_statements = \"on\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.prepared_statements", `"on" is not one of "disabled"`}}},
		{"log_format", "[general]\nlog_format = \"xml\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.log_format", "is not one of"}}},
		{"log_level", "[general]\nlog_level = \"trace\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.log_level", "is not one of"}}},
		{"database pooler_mode", db + "pooler_mode = \"\"\n", nil,
			[]want{{"pgdog.toml", 4, "databases[0].pooler_mode", "is not one of"}}},

		// TLS and passthrough (files that exist: TestTLSFiles).
		{"certificate without key", "[general]\ntls_certificate = \"c\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.tls_certificate", "is set but tls_private_key is not; client TLS needs both"}}},
		{"key without certificate", "[general]\ntls_private_key = \"k\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.tls_private_key", "is set but tls_certificate is not"}}},
		{"tls_client_required without TLS", "[general]\ntls_client_required = true\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.tls_client_required", "requires client TLS: set tls_certificate and tls_private_key"}}},
		{"passthrough enabled without TLS", "[general]\npassthrough_auth = \"enabled\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.passthrough_auth",
				`"enabled" needs client TLS (clients send cleartext passwords): set tls_certificate and tls_private_key, or use "enabled_plain"`}}},
		{"passthrough allow_change without TLS", "[general]\npassthrough_auth = \"enabled_allow_change\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.passthrough_auth", `or use "enabled_plain_allow_change" to accept cleartext passwords without TLS`}}},
		{"certificate files missing", "[general]\npassthrough_auth = \"enabled\"\ntls_certificate = \"c\"\ntls_private_key = \"k\"\n" + db, nil,
			[]want{{"pgdog.toml", 3, "general.tls_certificate", "cannot load tls_certificate and tls_private_key: open c: no such file"}}},
		{"server CA missing", "[general]\ntls_server_ca_certificate = \"nope.crt\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "general.tls_server_ca_certificate", "cannot read tls_server_ca_certificate: open nope.crt: no such file"}}},

		// Databases.
		{"no databases", "[general]\nport = 6432\n", nil,
			[]want{{"pgdog.toml", 0, "databases", "at least one [[databases]]"}}},
		{"database without name", "[[databases]]\nhost = \"h\"\n", nil,
			[]want{{"pgdog.toml", 1, "databases[0].name", "required"}}},
		{"duplicate database", db + db, nil,
			[]want{{"pgdog.toml", 6, "databases[1].name", `duplicate database name "app" (first defined at line 2)`}}},
		{"database named like admin", "[[databases]]\nname = \"admin\"\n", nil,
			[]want{{"pgdog.toml", 2, "databases[0].name", "admin console"}}},
		{"empty host", db + "host = \"\"\n", nil,
			[]want{{"pgdog.toml", 4, "databases[0].host", "must not be empty"}}},
		{"database port", db + "port = 0\n", nil,
			[]want{{"pgdog.toml", 4, "databases[0].port", "between 1 and 65535"}}},
		{"empty database_name", db + "database_name = \"\"\n", nil,
			[]want{{"pgdog.toml", 4, "databases[0].database_name", "must not be empty"}}},
		{"database pool_size 0", db + "pool_size = 0\n", nil,
			[]want{{"pgdog.toml", 4, "databases[0].pool_size", "must be at least 1"}}},
		{"database min above pool", db + "pool_size = 2\nmin_pool_size = 3\n", nil,
			[]want{{"pgdog.toml", 5, "databases[0].min_pool_size", "3 is larger than the pool size (2)"}}},
		{"database pool below inherited min", "[general]\nmin_pool_size = 5\n" + db + "pool_size = 2\n", nil,
			[]want{{"pgdog.toml", 6, "databases[0].pool_size", "smaller than the inherited min_pool_size (5)"}}},
		{"database hashed password", db + "password = \"" + md5Secret + "\"\n", nil,
			[]want{{"pgdog.toml", 4, "databases[0].password", "must be the plaintext password"}}},

		// Users.
		{"user for unknown database", db, ptr("[[users]]\nname = \"a\"\npassword = \"p\"\ndatabase = \"nope\"\n"),
			[]want{{"users.toml", 4, "users[0].database", `no [[databases]] entry is named "nope"`}}},
		{"user without database", db, ptr("[[users]]\nname = \"a\"\npassword = \"p\"\n"),
			[]want{{"users.toml", 1, "users[0].database", "required"}}},
		{"user without name", db, ptr("[[users]]\ndatabase = \"app\"\npassword = \"p\"\n"),
			[]want{{"users.toml", 1, "users[0].name", "required"}}},
		{"duplicate user", db, ptr("[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"p\"\n\n[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"q\"\n"),
			[]want{{"users.toml", 7, "users[1].name", `duplicate user "a" for database "app" (first defined at line 1)`}}},
		{"user without password", db, ptr("[[users]]\nname = \"a\"\ndatabase = \"app\"\n"),
			[]want{{"users.toml", 1, "users[0].password", `required: passthrough_auth is "disabled" and auth_type is "scram"`}}},
		{"user min above pool", db, ptr("[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"p\"\npool_size = 1\nmin_pool_size = 2\n"),
			[]want{{"users.toml", 6, "users[0].min_pool_size", "2 is larger than the pool size (1)"}}},
		{"user pool below database min", db + "min_pool_size = 4\n", ptr("[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"p\"\npool_size = 3\n"),
			[]want{{"users.toml", 5, "users[0].pool_size", "smaller than the inherited min_pool_size (4)"}}},
		{"user negative min", db, ptr("[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"p\"\nmin_pool_size = -1\n"),
			[]want{{"users.toml", 5, "users[0].min_pool_size", "must not be negative"}}},
		{"user pooler_mode", db, ptr("[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"p\"\npooler_mode = \"statement\"\n"),
			[]want{{"users.toml", 5, "users[0].pooler_mode", "not supported by pgtender yet"}}},
		{"md5 secret with scram", db, ptr("[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"" + md5Secret + "\"\n"),
			[]want{{"users.toml", 4, "users[0].password", `cannot verify auth_type "scram"`}}},
		{"scram secret with md5", "[general]\nauth_type = \"md5\"\n" + db, ptr("[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"" + scramSecret() + "\"\n"),
			[]want{{"users.toml", 4, "users[0].password", `cannot verify auth_type "md5"`}}},
		{"malformed scram secret", db, ptr("[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"SCRAM-SHA-256$4096:xx$yy:zz\"\n"),
			[]want{{"users.toml", 4, "users[0].password", "malformed SCRAM secret"}}},
		{"hashed server_password", db, ptr("[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"p\"\nserver_password = \"" + md5Secret + "\"\n"),
			[]want{{"users.toml", 5, "users[0].server_password", "must be the plaintext password"}}},
		{"users.toml admin", db, ptr("[admin]\nuser = \"\"\n"),
			[]want{{"users.toml", 2, "admin.user", "must not be empty"}}},
		{"admin md5 secret with scram", "[admin]\npassword = \"" + md5Secret + "\"\n" + db, nil,
			[]want{{"pgdog.toml", 2, "admin.password", `cannot verify auth_type "scram"`}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkProblems(t, loadProblems(t, tc.main, tc.users), tc.want)
		})
	}
}

// TestNoFalseProblems loads configurations that look close to a problem
// but are fine.
func TestNoFalseProblems(t *testing.T) {
	const db = "[[databases]]\nname = \"app\"\n"
	tests := []struct {
		name        string
		main, users string
	}{
		{"passthrough users need no password", "[general]\npassthrough_auth = \"enabled_plain\"\n" + db,
			"[[users]]\nname = \"a\"\ndatabase = \"app\"\npool_size = 3\n"},
		{"trust needs no password", "[general]\nauth_type = \"trust\"\n" + db,
			"[[users]]\nname = \"a\"\ndatabase = \"app\"\n"},
		{"md5 secret with md5", "[general]\nauth_type = \"md5\"\n" + db,
			"[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"" + md5Secret + "\"\n"},
		{"scram secret with scram", db,
			"[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"" + scramSecret() + "\"\n"},
		{"any secret with plain", "[general]\nauth_type = \"plain\"\n" + db,
			"[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"" + md5Secret + "\"\n"},
		{"explicit zero min_pool_size", "[general]\nmin_pool_size = 0\n" + db + "min_pool_size = 0\n",
			"[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"p\"\nmin_pool_size = 0\npool_size = 1\n"},
		{"same user, two databases", db + "[[databases]]\nname = \"b\"\n",
			"[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = \"p\"\n[[users]]\nname = \"a\"\ndatabase = \"b\"\npassword = \"p\"\n"},
		{"role primary and shard 0", db + "role = \"primary\"\nshard = 0\n", ""},
		{"zero means none", "[general]\nquery_timeout = 0\nidle_timeout = 0\nserver_lifetime = 0\nshutdown_timeout = 0\n" + db, ""},
		{"keys not in effect yet, at their default", "[general]\n" + notInEffectDefaults() + db, ""},
		{"passthrough modes in effect", "[general]\npassthrough_auth = \"enabled_plain_allow_change\"\n" + db, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mustLoad(t, tc.main, &tc.users)
		})
	}
}

// TestAllProblemsAtOnce checks that problems in both files are all
// reported, sorted by file and line, and that one broken value does not
// hide the next.
func TestAllProblemsAtOnce(t *testing.T) {
	main := `[general]
port = "x"
workers = 0
pooler_mode = "statement"
bogus = true
tls_certificate = "c"

[[databases]]
name = "app"
pool_size = -3

[[databases]]
name = "app"
lb_weight = 1
`
	users := `[[users]]
name = "a"
database = "nope"
password = "p"

[[users]]
database = "app"
password = 7
`
	checkProblems(t, loadProblems(t, main, &users), []want{
		{"pgdog.toml", 2, "general.port", "must be an integer"},
		{"pgdog.toml", 3, "general.workers", "at least 1"},
		{"pgdog.toml", 4, "general.pooler_mode", "not supported"},
		{"pgdog.toml", 5, "general.bogus", "unknown key"},
		{"pgdog.toml", 6, "general.tls_certificate", "is set but tls_private_key is not"},
		{"pgdog.toml", 10, "databases[0].pool_size", "at least 1"},
		{"pgdog.toml", 13, "databases[1].name", "duplicate"},
		{"pgdog.toml", 14, "databases[1].lb_weight", "not supported"},
		{"users.toml", 3, "users[0].database", "nope"},
		{"users.toml", 6, "users[1].name", "required"},
		{"users.toml", 8, "users[1].password", "must be a string, found an integer"},
	})
}

// TestBrokenFileDoesNotHideTheOther checks that a syntax error in one file
// still lets the other be checked, without follow-on problems.
func TestBrokenFileDoesNotHideTheOther(t *testing.T) {
	users := "[[users]]\nname = \"a\"\ndatabase = \"nowhere\"\nbogus = 1\n"
	checkProblems(t, loadProblems(t, "[general\n", &users), []want{
		{"pgdog.toml", 2, "", "invalid TOML"},
		{"users.toml", 4, "users[0].bogus", "unknown key"},
	})
	checkProblems(t, loadProblems(t, "[general]\nport = 0\n", ptr("[[users]\n")), []want{
		{"pgdog.toml", 0, "databases", "at least one"},
		{"pgdog.toml", 2, "general.port", "between"},
		{"users.toml", 2, "", "invalid TOML"},
	})
}

// TestTypeErrorNeverEchoesValue guards against a password given with the
// wrong type appearing in a message.
func TestTypeErrorNeverEchoesValue(t *testing.T) {
	users := "[[users]]\nname = \"a\"\ndatabase = \"app\"\npassword = 987654321\n"
	for _, p := range loadProblems(t, minimalMain, &users) {
		if strings.Contains(p.String(), "987654321") {
			t.Errorf("problem echoes the password: %s", p)
		}
	}
}
