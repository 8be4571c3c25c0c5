package integration

import (
	"context"
	"testing"
	"time"
)

// TestPassthroughLogin checks both cleartext passthrough modes: the right
// password is admitted, a wrong one is refused with 28P01 whether the pool
// is cold or warm, and an unknown database gets 3D000.
func TestPassthroughLogin(t *testing.T) {
	for _, mode := range []string{"enabled_plain", "enabled_plain_allow_change"} {
		t.Run(mode, func(t *testing.T) {
			tp := startPooler(t, poolerOptions{general: `passthrough_auth = "` + mode + `"`})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			// Cold: nothing verified yet, no server connection exists.
			if _, err := tp.connectAs(ctx, appUser, wrongPassword, appDB); sqlState(err) != "28P01" {
				t.Fatalf("wrong password on a cold pool: got %v, want SQLSTATE 28P01", err)
			}
			if _, err := tp.connectAs(ctx, "nobody", "x", appDB); sqlState(err) != "28P01" {
				t.Fatalf("unknown role: got %v, want SQLSTATE 28P01", err)
			}

			conn, err := tp.connectAs(ctx, appUser, appPassword, appDB)
			if err != nil {
				t.Fatalf("right password: %v", err)
			}
			var user string
			if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil || user != appUser {
				t.Fatalf("current_user = %q, %v", user, err)
			}

			// Warm: a verified password and an idle server connection exist.
			if _, err := tp.connectAs(ctx, appUser, wrongPassword, appDB); sqlState(err) != "28P01" {
				t.Fatalf("wrong password on a warm pool: got %v, want SQLSTATE 28P01", err)
			}
			conn.Close(ctx)
			if _, err := tp.connectAs(ctx, appUser, wrongPassword, appDB); sqlState(err) != "28P01" {
				t.Fatalf("wrong password with an idle server connection: got %v, want SQLSTATE 28P01", err)
			}
			again, err := tp.connectAs(ctx, appUser, appPassword, appDB)
			if err != nil {
				t.Fatalf("right password again: %v", err)
			}
			again.Close(ctx)

			if _, err := tp.connectAs(ctx, appUser, appPassword, "no_such_db"); sqlState(err) != "3D000" {
				t.Fatalf("unknown database: got %v, want SQLSTATE 3D000", err)
			}
		})
	}
}

// TestConfiguredUsers logs in users from users.toml with each auth_type.
func TestConfiguredUsers(t *testing.T) {
	for _, authType := range []string{"scram", "md5", "plain", "trust"} {
		t.Run(authType, func(t *testing.T) {
			tp := startPooler(t, poolerOptions{
				general: `auth_type = "` + authType + `"`,
				users: joinLines(
					`[[users]]`,
					`name = "`+appUser+`"`,
					`database = "`+appDB+`"`,
					`password = "`+appPassword+`"`,
				),
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			conn, err := tp.connectAs(ctx, appUser, appPassword, appDB)
			if err != nil {
				t.Fatalf("login: %v", err)
			}
			var one int
			if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
				t.Fatalf("SELECT 1 = %d, %v", one, err)
			}
			conn.Close(ctx)
			_, err = tp.connectAs(ctx, appUser, wrongPassword, appDB)
			if authType == "trust" {
				if err != nil {
					t.Fatalf("trust refused a login: %v", err)
				}
				return
			}
			if sqlState(err) != "28P01" {
				t.Fatalf("wrong password: got %v, want SQLSTATE 28P01", err)
			}
		})
	}
}
