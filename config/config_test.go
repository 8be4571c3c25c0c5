package config

import (
	"errors"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

func TestDefaults(t *testing.T) {
	d := Defaults()
	g := d.General
	checks := []struct {
		key       string
		got, want any
	}{
		{"host", g.Host, "0.0.0.0"},
		{"port", g.Port, 6432},
		{"workers", g.Workers, runtime.GOMAXPROCS(0)},
		{"listen_backlog", g.ListenBacklog, 1024},
		{"default_pool_size", g.DefaultPoolSize, 10},
		{"min_pool_size", g.MinPoolSize, 1},
		{"pooler_mode", g.PoolerMode, PoolerModeTransaction},
		{"auth_type", g.AuthType, AuthSCRAM},
		{"passthrough_auth", g.PassthroughAuth, PassthroughDisabled},
		{"connect_timeout", g.ConnectTimeout, Milliseconds(5000)},
		{"checkout_timeout", g.CheckoutTimeout, Milliseconds(5000)},
		{"client_login_timeout", g.ClientLoginTimeout, Milliseconds(60000)},
		{"query_timeout", g.QueryTimeout, Milliseconds(0)},
		{"client_idle_in_transaction_timeout", g.ClientIdleInTransactionTimeout, Milliseconds(0)},
		{"idle_timeout", g.IdleTimeout, Milliseconds(60000)},
		{"server_lifetime", g.ServerLifetime, Milliseconds(86400000)},
		{"shutdown_timeout", g.ShutdownTimeout, Milliseconds(60000)},
		{"shutdown_readiness_delay", g.ShutdownReadinessDelay, Milliseconds(0)},
		{"rollback_timeout", g.RollbackTimeout, Milliseconds(5000)},
		{"client_write_timeout", g.ClientWriteTimeout, Milliseconds(60000)},
		{"healthcheck_interval", g.HealthcheckInterval, Milliseconds(30000)},
		{"healthcheck_timeout", g.HealthcheckTimeout, Milliseconds(5000)},
		{"idle_healthcheck_interval", g.IdleHealthcheckInterval, Milliseconds(30000)},
		{"idle_healthcheck_delay", g.IdleHealthcheckDelay, Milliseconds(5000)},
		{"passthrough_reverify_interval", g.PassthroughReverifyInterval, Milliseconds(60000)},
		{"max_client_connections", g.MaxClientConnections, 0},
		{"max_message_size", g.MaxMessageSize, 64 << 20},
		{"max_logins_in_progress", g.MaxLoginsInProgress, 0},
		{"login_queue_target", int(g.LoginQueueTarget), 50},
		{"login_queue_max_age", int(g.LoginQueueMaxAge), 2000},
		{"openmetrics_port", g.OpenMetricsPort, 0},
		{"openmetrics_host", g.OpenMetricsHost, "0.0.0.0"},
		{"openmetrics_namespace", g.OpenMetricsNamespace, ""},
		{"healthcheck_port", g.HealthcheckPort, 0},
		{"tls_client_required", g.TLSClientRequired, false},
		{"tls_verify", g.TLSVerify, TLSVerifyPrefer},
		{"prepared_statements", g.PreparedStatements, "extended"},
		{"prepared_statements_limit", g.PreparedStatementsLimit, 500},
		{"log_connections", g.LogConnections, true},
		{"log_disconnections", g.LogDisconnections, true},
		{"log_level", g.LogLevel, "info"},
		{"log_format", g.LogFormat, "text"},
		{"admin.name", d.Admin.Name, "admin"},
		{"admin.user", d.Admin.User, "admin"},
		{"admin.password", d.Admin.Password, ""},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.key, c.got, c.want)
		}
	}
	if got := DefaultDatabase(); got != (Database{Host: "127.0.0.1", Port: 5432, MinPoolSize: -1}) {
		t.Errorf("DefaultDatabase() = %+v", got)
	}
	if got := DefaultUser(); got != (User{MinPoolSize: -1}) {
		t.Errorf("DefaultUser() = %+v", got)
	}
}

func TestLoadMinimalAppliesDefaults(t *testing.T) {
	c := mustLoad(t, minimalMain, nil)
	if !reflect.DeepEqual(c.General, Defaults().General) || c.Admin != Defaults().Admin {
		t.Errorf("general/admin differ from Defaults():\n%s", c.Redacted())
	}
	want := Database{Name: "app", Host: "127.0.0.1", Port: 5432, DatabaseName: "app", MinPoolSize: -1, Line: 2}
	if len(c.Databases) != 1 || c.Databases[0] != want {
		t.Errorf("databases = %+v, want [%+v]", c.Databases, want)
	}
	if len(c.Users) != 0 || c.UsersPath != "" {
		t.Errorf("users = %+v (path %q), want none", c.Users, c.UsersPath)
	}
}

func TestLoadEveryKey(t *testing.T) {
	main := `
[general]
host = "127.0.0.1"
port = 7432
workers = 3
listen_backlog = 4096
default_pool_size = 20
min_pool_size = 2
pooler_mode = "session"
auth_type = "md5"
passthrough_auth = "enabled_plain_allow_change"
connect_timeout = 1
checkout_timeout = 2
client_login_timeout = 3
query_timeout = 0
client_idle_in_transaction_timeout = 0
idle_timeout = 6
server_lifetime = 7
shutdown_timeout = 8
rollback_timeout = 9
stats_period = 2000
client_write_timeout = 10
shutdown_readiness_delay = 19
healthcheck_interval = 15
healthcheck_timeout = 16
idle_healthcheck_interval = 17
idle_healthcheck_delay = 18
passthrough_reverify_interval = 60000
max_client_connections = 11
max_message_size = 2048
max_logins_in_progress = 12
login_queue_target = 13
login_queue_max_age = 14
openmetrics_port = 0
openmetrics_host = "127.0.0.2"
openmetrics_namespace = "pgtender_"
healthcheck_port = 0
tls_certificate = ""
tls_private_key = ""
tls_client_required = false
tls_verify = "verify_full"
tls_server_ca_certificate = ""
prepared_statements = "disabled"
prepared_statements_limit = 100
log_connections = false
log_disconnections = false
log_level = "debug"
log_format = "json"

[admin]
name = "pgtender_admin"
user = "root"
password = "secret"

[[databases]]
name = "app"
host = "db.internal"
port = 5433
database_name = "app_prod"
user = "svc"
password = "svcpw"
pool_size = 30
min_pool_size = 0
pooler_mode = "transaction"
role = "primary"
shard = 0
`
	users := `
[[users]]
name = "alice"
database = "app"
password = "alicepw"
pool_size = 5
min_pool_size = 1
pooler_mode = "session"
server_user = "alice_srv"
server_password = "alice_srvpw"
`
	// The keys of notInEffect are written at their default, the only value
	// Load accepts; TestNotInEffect covers every other value.
	c := mustLoad(t, main, &users)
	g := c.General
	wantGeneral := General{
		Host: "127.0.0.1", Port: 7432, Workers: 3, ListenBacklog: 4096,
		DefaultPoolSize: 20, MinPoolSize: 2, PoolerMode: PoolerModeSession,
		AuthType: AuthMD5, PassthroughAuth: PassthroughEnabledPlainAllowChange,
		ConnectTimeout: 1, CheckoutTimeout: 2, ClientLoginTimeout: 3,
		IdleTimeout: 6, ServerLifetime: 7,
		ShutdownTimeout: 8, RollbackTimeout: 9, StatsPeriod: 2000, ClientWriteTimeout: 10, PassthroughReverifyInterval: 60000,
		ShutdownReadinessDelay: 19,
		HealthcheckInterval:    15, HealthcheckTimeout: 16, IdleHealthcheckInterval: 17, IdleHealthcheckDelay: 18,
		MaxClientConnections: 11, MaxMessageSize: 2048, MaxLoginsInProgress: 12, LoginQueueTarget: 13, LoginQueueMaxAge: 14,
		OpenMetricsHost:      "127.0.0.2",
		OpenMetricsNamespace: "pgtender_",
		TLSVerify:            TLSVerifyVerifyFull,
		PreparedStatements:   "disabled", PreparedStatementsLimit: 100, LogLevel: "debug", LogFormat: "json",
	}
	if g != wantGeneral {
		t.Errorf("general =\n%+v\nwant\n%+v", g, wantGeneral)
	}
	if want := (Admin{Name: "pgtender_admin", User: "root", Password: "secret"}); c.Admin != want {
		t.Errorf("admin = %+v, want %+v", c.Admin, want)
	}
	wantDB := Database{Name: "app", Host: "db.internal", Port: 5433, DatabaseName: "app_prod",
		User: "svc", Password: "svcpw", PoolSize: 30, MinPoolSize: 0, PoolerMode: PoolerModeTransaction, Line: 55}
	if len(c.Databases) != 1 || c.Databases[0] != wantDB {
		t.Errorf("databases = %+v, want [%+v]", c.Databases, wantDB)
	}
	wantUser := User{Name: "alice", Database: "app", Password: "alicepw", PoolSize: 5, MinPoolSize: 1,
		PoolerMode: PoolerModeSession, ServerUser: "alice_srv", ServerPassword: "alice_srvpw", Line: 2}
	if len(c.Users) != 1 || c.Users[0] != wantUser {
		t.Errorf("users = %+v, want [%+v]", c.Users, wantUser)
	}
	if g.ConnectTimeout.Duration().Milliseconds() != 1 {
		t.Errorf("Duration() = %v", g.ConnectTimeout.Duration())
	}
}

func TestLoadExamples(t *testing.T) {
	c, err := Load("../pgdog.toml.example", "../users.toml.example")
	if err != nil {
		t.Fatalf("the example files do not load:\n%v", err)
	}
	g := c.General
	if g.Host != "127.0.0.1" || g.Port != 6432 || g.PassthroughAuth != PassthroughEnabledPlain || g.AuthType != AuthSCRAM {
		t.Errorf("general = %+v", g)
	}
	// The example ships a public password, so it listens on loopback only, and
	// names metrics as deploy/grafana and deploy/prometheus expect.
	if g.OpenMetricsHost != "127.0.0.1" || g.OpenMetricsPort != 9930 || g.OpenMetricsNamespace != "pgtender_" {
		t.Errorf("openmetrics host, port, namespace = %q, %d, %q; want 127.0.0.1, 9930, pgtender_",
			g.OpenMetricsHost, g.OpenMetricsPort, g.OpenMetricsNamespace)
	}
	if c.Admin.Password != "admin" {
		t.Errorf("admin password = %q, want admin", c.Admin.Password)
	}
	s, ok := c.PoolSettings("pgtender", "pgtender")
	want := PoolSettings{User: "pgtender", Database: "pgtender", ServerHost: "127.0.0.1", ServerPort: 5432,
		ServerDatabase: "pgtender", ServerUser: "pgtender", ServerPassword: "pgtender",
		PoolSize: 10, MinPoolSize: 1, PoolerMode: PoolerModeTransaction}
	if !ok || s != want {
		t.Errorf("PoolSettings = %+v, %v; want %+v", s, ok, want)
	}
}

func TestMaxPoolSizeAlias(t *testing.T) {
	c := mustLoad(t, "[general]\nmax_pool_size = 7\n"+minimalMain, nil)
	if c.General.DefaultPoolSize != 7 {
		t.Errorf("default_pool_size = %d, want 7 from max_pool_size", c.General.DefaultPoolSize)
	}
	checkProblems(t, loadProblems(t, "[general]\nmax_pool_size = 0\n"+minimalMain, nil), []want{
		{"pgdog.toml", 2, "general.max_pool_size", "must be at least 1"},
	})
	checkProblems(t, loadProblems(t, "[general]\nmax_pool_size = 7\ndefault_pool_size = 8\n"+minimalMain, nil), []want{
		{"pgdog.toml", 2, "general.max_pool_size", "set only one"},
	})
}

func TestInlineDatabasesArray(t *testing.T) {
	c := mustLoad(t, `databases = [{ name = "a" }, { name = "b", port = 5433 }]`, nil)
	if len(c.Databases) != 2 || c.Databases[1].Port != 5433 || c.Databases[1].DatabaseName != "b" {
		t.Errorf("databases = %+v", c.Databases)
	}
	// Keys inside inline tables have no line of their own: the problem
	// points at the line of the array.
	checkProblems(t, loadProblems(t, "\ndatabases = [{ name = \"a\" }, { name = \"b\", port = 0 }]", nil), []want{
		{"pgdog.toml", 2, "databases[1].port", "between 1 and 65535"},
	})
}

func TestUsersTomlAdminReplacesSection(t *testing.T) {
	users := "[admin]\npassword = \"from-users\"\n"
	c := mustLoad(t, "[admin]\nname = \"console\"\npassword = \"from-main\"\n"+minimalMain, &users)
	if want := (Admin{Name: "admin", User: "admin", Password: "from-users"}); c.Admin != want {
		t.Errorf("admin = %+v, want %+v (users.toml replaces the whole section, as in PgDog)", c.Admin, want)
	}
}

func TestLookups(t *testing.T) {
	users := `
[[users]]
name = "alice"
database = "app"
password = "a"

[[users]]
name = "alice"
database = "other"
password = "b"
`
	loaded := mustLoad(t, minimalMain+"\n[[databases]]\nname = \"other\"\n", &users)
	byHand := &Config{Databases: loaded.Databases, Users: loaded.Users} // no indexes
	for name, c := range map[string]*Config{"loaded": loaded, "by hand": byHand} {
		if d, ok := c.Database("other"); !ok || d.Name != "other" {
			t.Errorf("%s: Database(other) = %+v, %v", name, d, ok)
		}
		if _, ok := c.Database("nope"); ok {
			t.Errorf("%s: Database(nope) found", name)
		}
		if u, ok := c.User("alice", "other"); !ok || u.Password != "b" {
			t.Errorf("%s: User(alice, other) = %+v, %v", name, u, ok)
		}
		if _, ok := c.User("alice", "nope"); ok {
			t.Errorf("%s: User(alice, nope) found", name)
		}
	}
}

func TestProblemString(t *testing.T) {
	for _, tc := range []struct {
		p    Problem
		want string
	}{
		{Problem{"pgdog.toml", 12, "general.port", "must be between 1 and 65535"}, "pgdog.toml:12: general.port: must be between 1 and 65535"},
		{Problem{"pgdog.toml", 0, "databases", "at least one"}, "pgdog.toml: databases: at least one"},
		{Problem{"/etc/users.toml", 3, "", "invalid TOML: x"}, "/etc/users.toml:3: invalid TOML: x"},
	} {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
	l := &ProblemList{Problems: []Problem{{"a", 1, "k", "m"}, {"b", 2, "", "n"}}}
	if got, want := l.Error(), "a:1: k: m\nb:2: n"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

func TestFilesMissingOrEmpty(t *testing.T) {
	dir := t.TempDir()
	_, err := Load(filepath.Join(dir, "pgdog.toml"), filepath.Join(dir, "users.toml"))
	pl, ok := errors.AsType[*ProblemList](err)
	if !ok || len(pl.Problems) != 2 {
		t.Fatalf("Load of two missing files = %v, want two problems", err)
	}
	for i, name := range []string{"pgdog.toml", "users.toml"} {
		if p := pl.Problems[i]; filepath.Base(p.File) != name || p.Line != 0 || !strings.Contains(p.Message, "does not exist") {
			t.Errorf("problem %d = %v", i, p)
		}
	}

	// An empty users.toml is no users; a missing usersPath is no users.
	c := mustLoad(t, minimalMain, ptr(""))
	if len(c.Users) != 0 {
		t.Errorf("users = %+v", c.Users)
	}
}
