package integration

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"
)

// TestPgbench runs pgbench -i and then pgbench -c 16 -j 2 -T 10 through the
// pooler in transaction mode over a pool of 4, with the simple and the
// extended protocol: no transaction may fail.
func TestPgbench(t *testing.T) {
	if testing.Short() {
		t.Skip("pgbench runs take 20 s; skipped with -short")
	}
	pgbench, err := exec.LookPath("pgbench")
	if err != nil {
		t.Fatalf("pgbench not found (.ci/run installs postgresql-client): %v", err)
	}
	tp := startPooler(t, poolerOptions{general: `passthrough_auth = "enabled_plain"`, pool: "pool_size = 4"})
	host, port := splitAddr(t, tp.addr)
	run := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, pgbench, append([]string{"-h", host, "-p", port, "-U", appUser}, append(args, appDB)...)...)
		cmd.Env = append(os.Environ(), "PGPASSWORD="+appPassword, "PGSSLMODE=disable")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("pgbench %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	run("-i", "-s", "1", "-q")
	failed := regexp.MustCompile(`number of failed transactions: (\d+)`)
	tps := regexp.MustCompile(`tps = ([0-9.]+)`)
	for _, protocol := range []string{"simple", "extended"} {
		out := run("-c", "16", "-j", "2", "-T", "10", "-M", protocol)
		m := failed.FindStringSubmatch(out)
		if m == nil || m[1] != "0" {
			t.Fatalf("-M %s: failed transactions %v\n%s", protocol, m, out)
		}
		if regexp.MustCompile(`aborted|error`).MatchString(out) {
			t.Fatalf("-M %s reported errors:\n%s", protocol, out)
		}
		t.Logf("pgbench -c 16 -j 2 -T 10 -M %s through pgtender (pool 4): tps %s, 0 failed", protocol, tps.FindStringSubmatch(out)[1])
	}
}
