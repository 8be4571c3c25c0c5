package config

import "testing"

func TestPoolSettings(t *testing.T) {
	main := `
[general]
default_pool_size = 10
min_pool_size = 1
pooler_mode = "transaction"
passthrough_auth = "enabled_plain"

[[databases]]
name = "plain"
host = "db1"
port = 5433

[[databases]]
name = "tuned"
host = "db2"
database_name = "tuned_prod"
pool_size = 20
min_pool_size = 0
pooler_mode = "session"

[[databases]]
name = "shared"
user = "db_user"
password = "db_password"
`
	users := `
[[users]]
name = "own"
database = "tuned"
password = "own_password"
pool_size = 5
min_pool_size = 2
pooler_mode = "transaction"

[[users]]
name = "inherits"
database = "tuned"
password = "inherits_password"

[[users]]
name = "srv"
database = "plain"
password = "client_password"
server_user = "srv_user"
server_password = "srv_password"

[[users]]
name = "srv"
database = "shared"
password = "client_password"
server_user = "srv_user"
server_password = "srv_password"

[[users]]
name = "md5"
database = "plain"
password = "` + md5Secret + `"

[[users]]
name = "scram"
database = "plain"
password = "` + scramSecret() + `"
min_pool_size = 0
`
	c := mustLoad(t, main, &users)
	tests := []struct {
		name           string
		user, database string
		want           PoolSettings
	}{
		{"passthrough user inherits general", "nobody", "plain", PoolSettings{
			User: "nobody", Database: "plain", ServerHost: "db1", ServerPort: 5433, ServerDatabase: "plain",
			ServerUser: "nobody", PoolSize: 10, MinPoolSize: 1, PoolerMode: PoolerModeTransaction}},
		{"passthrough user inherits database", "nobody", "tuned", PoolSettings{
			User: "nobody", Database: "tuned", ServerHost: "db2", ServerPort: 5432, ServerDatabase: "tuned_prod",
			ServerUser: "nobody", PoolSize: 20, MinPoolSize: 0, PoolerMode: PoolerModeSession}},
		{"user entry wins over database", "own", "tuned", PoolSettings{
			User: "own", Database: "tuned", ServerHost: "db2", ServerPort: 5432, ServerDatabase: "tuned_prod",
			ServerUser: "own", ServerPassword: "own_password", PoolSize: 5, MinPoolSize: 2, PoolerMode: PoolerModeTransaction}},
		{"user entry without overrides", "inherits", "tuned", PoolSettings{
			User: "inherits", Database: "tuned", ServerHost: "db2", ServerPort: 5432, ServerDatabase: "tuned_prod",
			ServerUser: "inherits", ServerPassword: "inherits_password", PoolSize: 20, MinPoolSize: 0, PoolerMode: PoolerModeSession}},
		{"server_user and server_password", "srv", "plain", PoolSettings{
			User: "srv", Database: "plain", ServerHost: "db1", ServerPort: 5433, ServerDatabase: "plain",
			ServerUser: "srv_user", ServerPassword: "srv_password", PoolSize: 10, MinPoolSize: 1, PoolerMode: PoolerModeTransaction}},
		{"database user and password win, as in PgDog", "srv", "shared", PoolSettings{
			User: "srv", Database: "shared", ServerHost: "127.0.0.1", ServerPort: 5432, ServerDatabase: "shared",
			ServerUser: "db_user", ServerPassword: "db_password", PoolSize: 10, MinPoolSize: 1, PoolerMode: PoolerModeTransaction}},
		{"passthrough user gets the database's credentials", "nobody", "shared", PoolSettings{
			User: "nobody", Database: "shared", ServerHost: "127.0.0.1", ServerPort: 5432, ServerDatabase: "shared",
			ServerUser: "db_user", ServerPassword: "db_password", PoolSize: 10, MinPoolSize: 1, PoolerMode: PoolerModeTransaction}},
		{"md5 secret is not a server password", "md5", "plain", PoolSettings{
			User: "md5", Database: "plain", ServerHost: "db1", ServerPort: 5433, ServerDatabase: "plain",
			ServerUser: "md5", PoolSize: 10, MinPoolSize: 1, PoolerMode: PoolerModeTransaction}},
		{"SCRAM secret is not a server password; explicit min 0", "scram", "plain", PoolSettings{
			User: "scram", Database: "plain", ServerHost: "db1", ServerPort: 5433, ServerDatabase: "plain",
			ServerUser: "scram", PoolSize: 10, MinPoolSize: 0, PoolerMode: PoolerModeTransaction}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := c.PoolSettings(tc.user, tc.database)
			if !ok || got != tc.want {
				t.Errorf("PoolSettings(%q, %q) =\n%+v, %v\nwant\n%+v", tc.user, tc.database, got, ok, tc.want)
			}
		})
	}
	if got, ok := c.PoolSettings("own", "missing"); ok || got != (PoolSettings{}) {
		t.Errorf("PoolSettings for a missing database = %+v, %v", got, ok)
	}
}

// TestPoolSettingsByHand covers a Config built without Load: no indexes,
// zero values meaning "inherit" for pool_size and DatabaseName, and a
// min_pool_size larger than the pool capped.
func TestPoolSettingsByHand(t *testing.T) {
	c := Defaults()
	c.Databases = []Database{{Name: "app", Host: "h", Port: 1, PoolSize: 3, MinPoolSize: 5}}
	got, ok := c.PoolSettings("u", "app")
	want := PoolSettings{User: "u", Database: "app", ServerHost: "h", ServerPort: 1, ServerDatabase: "app",
		ServerUser: "u", PoolSize: 3, MinPoolSize: 3, PoolerMode: PoolerModeTransaction}
	if !ok || got != want {
		t.Errorf("PoolSettings = %+v, %v; want %+v", got, ok, want)
	}
}
