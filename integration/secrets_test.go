package integration

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestConfiguredUserSecrets logs configured users in with pgx (pgconn) and
// psql, under auth_type scram and md5, with the users.toml password given
// in plaintext and as a stored secret (the SCRAM-SHA-256$ secret copied from
// pg_authid, or "md5" + md5(password + user)); the pool then opens server
// connections with server_password. A wrong password gets 28P01 from
// both clients.
func TestConfiguredUserSecrets(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Fatalf("psql not found (.ci/run installs postgresql-client): %v", err)
	}
	const role, password = "secrets_user", "secrets-password"
	newRole(t, role, password)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var scramSecret string
	if err := direct(t, ctx).QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", role).Scan(&scramSecret); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(scramSecret, "SCRAM-SHA-256$") {
		t.Fatalf("pg_authid holds %.14s…, want a SCRAM-SHA-256 secret", scramSecret)
	}
	sum := md5.Sum([]byte(password + role))
	md5Secret := "md5" + hex.EncodeToString(sum[:])

	for _, c := range []struct{ name, authType, secret string }{
		{"scram/plaintext", "scram", password},
		{"scram/stored", "scram", scramSecret},
		{"md5/plaintext", "md5", password},
		{"md5/stored", "md5", md5Secret},
	} {
		t.Run(c.name, func(t *testing.T) {
			users := joinLines(`[[users]]`, `name = "`+role+`"`, `database = "`+appDB+`"`, `password = "`+c.secret+`"`)
			if c.secret != password {
				users = joinLines(users, `server_password = "`+password+`"`)
			}
			tp := startPooler(t, poolerOptions{general: `auth_type = "` + c.authType + `"`, users: users})
			client := newLoginClient(t, tp, role)
			if err := client.login(ctx, password); err != nil {
				t.Fatalf("pgx, right password: %v", err)
			}
			if err := client.login(ctx, wrongPassword); sqlState(err) != "28P01" {
				t.Fatalf("pgx, wrong password: %v, want SQLSTATE 28P01", err)
			}
			host, port := splitAddr(t, tp.addr)
			runPsql := func(pw string) (string, error) {
				cmd := exec.CommandContext(ctx, psql, "-h", host, "-p", port, "-U", role, "-d", appDB,
					"-X", "-w", "-A", "-t", "-c", "SELECT current_user")
				cmd.Env = append(os.Environ(), "PGPASSWORD="+pw, "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=10")
				out, err := cmd.CombinedOutput()
				return strings.TrimSpace(string(out)), err
			}
			if out, err := runPsql(password); err != nil || out != role {
				t.Fatalf("psql, right password: %v: %s", err, out)
			}
			out, err := runPsql(wrongPassword)
			if err == nil || !strings.Contains(out, `password authentication failed for user "`+role+`"`) {
				t.Fatalf("psql, wrong password: %v: %s; want a password authentication failure", err, out)
			}
		})
	}
}
