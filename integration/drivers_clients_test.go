package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestDriversPsycopg3 runs 32 of Debian's psycopg 3 threads, each with its
// own connection, at its default prepare_threshold (5: named statements
// from a query's fifth execution), at 0 (named at once) and at None (never
// named).
func TestDriversPsycopg3(t *testing.T) {
	python := pythonModule(t, "psycopg", "python3-psycopg")
	const threads, perThread = 32, 25
	for _, m := range []struct {
		threshold string
		needs     []poolerFeature
	}{
		{"default", []poolerFeature{preparedStatements}},
		{"0", []poolerFeature{preparedStatements}},
		{"none", nil},
	} {
		t.Run("prepare_threshold="+m.threshold, func(t *testing.T) {
			runDriverBothWays(t, driverCase{
				driver: "psycopg3", mode: "prepare_threshold=" + m.threshold, needs: m.needs,
				transactions: threads * perThread,
				run: func(t *testing.T, dsn string, pooled bool) *driverRun {
					return runDriverScript(t, 2*time.Minute, func(ctx context.Context) *exec.Cmd {
						return exec.CommandContext(ctx, python, clientScript(t, "psycopg3_check.py"), dsn, m.threshold, itoa(threads), itoa(perThread))
					})
				},
			})
		})
	}
}

// TestDriversAsyncpg runs Debian's asyncpg: 32 concurrent connections with
// the default statement cache (every query a named statement,
// __asyncpg_stmt_N__) and with statement_cache_size=0 (the unnamed
// statement, asyncpg's advice for transaction-mode poolers).
func TestDriversAsyncpg(t *testing.T) {
	python := pythonModule(t, "asyncpg", "python3-asyncpg")
	const connections, perConnection = 32, 25
	for _, m := range []struct {
		cache string
		needs []poolerFeature
	}{
		{"default", []poolerFeature{preparedStatements}},
		{"0", nil},
	} {
		t.Run("statement_cache_size="+m.cache, func(t *testing.T) {
			runDriverBothWays(t, driverCase{
				driver: "asyncpg", mode: "statement_cache_size=" + m.cache, needs: m.needs,
				transactions: connections * perConnection,
				run: func(t *testing.T, dsn string, pooled bool) *driverRun {
					return runDriverScript(t, 2*time.Minute, func(ctx context.Context) *exec.Cmd {
						return exec.CommandContext(ctx, python, clientScript(t, "asyncpg_check.py"), dsn, m.cache, itoa(connections), itoa(perConnection))
					})
				},
			})
		})
	}
}

// jdbcJar is where Debian's libpostgresql-jdbc-java installs pgjdbc.
const jdbcJar = "/usr/share/java/postgresql.jar"

// TestDriversJDBC runs Debian's pgjdbc under Java's single-file launcher:
// 32 threads reusing PreparedStatements across transactions, with
// prepareThreshold=1 (named server statements at once), the default 5, and
// 0 (never named).
func TestDriversJDBC(t *testing.T) {
	java := lookTool(t, "java", "default-jre-headless")
	_, err := os.Stat(jdbcJar)
	requireTool(t, err == nil, "%s: %v: install it (apt-get install -y --no-install-recommends libpostgresql-jdbc-java)", jdbcJar, err)
	const threads, perThread = 32, 25
	for _, m := range []struct {
		threshold string
		needs     []poolerFeature
	}{
		{"1", []poolerFeature{preparedStatements}},
		{"5", []poolerFeature{preparedStatements}},
		{"0", nil},
	} {
		t.Run("prepareThreshold="+m.threshold, func(t *testing.T) {
			runDriverBothWays(t, driverCase{
				driver: "jdbc", mode: "prepareThreshold=" + m.threshold, needs: m.needs,
				transactions: threads * perThread,
				run: func(t *testing.T, dsn string, pooled bool) *driverRun {
					return runDriverScript(t, 3*time.Minute, func(ctx context.Context) *exec.Cmd {
						// -Xshare:auto and a small heap: two cores are shared.
						return exec.CommandContext(ctx, java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", jdbcJar,
							clientScript(t, "JdbcCheck.java"), dsn, m.threshold, itoa(threads), itoa(perThread))
					})
				},
			})
		})
	}
}

// TestDriversNodePostgresNamed runs node-postgres named queries ({name,
// text, values}) from 32 concurrent clients.
func TestDriversNodePostgresNamed(t *testing.T) {
	dir := installNodePg(t)
	const clients, perClient = 32, 25
	runDriverBothWays(t, driverCase{
		driver: "node-postgres", mode: "named queries", needs: []poolerFeature{preparedStatements},
		transactions: clients * perClient,
		run: func(t *testing.T, dsn string, pooled bool) *driverRun {
			return runDriverScript(t, 2*time.Minute, func(ctx context.Context) *exec.Cmd {
				cmd := exec.CommandContext(ctx, "node", filepath.Join(dir, "node_pg_named_check.js"), dsn, itoa(clients), itoa(perClient))
				cmd.Dir = dir
				return cmd
			})
		},
	})
}

// installNodePg installs node-postgres (pinned in
// testdata/clients/package-lock.json) and the node scripts into a
// temporary directory, as TestClientsNodePostgres does.
func installNodePg(t *testing.T) string {
	t.Helper()
	lookTool(t, "node", "nodejs npm")
	lookTool(t, "npm", "nodejs npm")
	dir := t.TempDir()
	for _, name := range []string{"package.json", "package-lock.json", "node_pg_check.js", "node_pg_named_check.js"} {
		data, err := os.ReadFile(clientScript(t, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	install := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts")
	install.Dir = dir
	install.Env = append(os.Environ(), "npm_config_update_notifier=false")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	return dir
}

// TestDriversPgbenchPrepared runs pgbench -M prepared -c 16 -j 2 -T 10
// (each client prepares pgbench's statements by name, P_0…, once, then
// only binds them): no transaction may fail.
func TestDriversPgbenchPrepared(t *testing.T) {
	if testing.Short() {
		t.Skip("pgbench runs take 10 s each; skipped with -short")
	}
	pgbench := lookTool(t, "pgbench", "postgresql (pgbench ships with the server package)")
	initialized := false
	processed := regexp.MustCompile(`number of transactions actually processed: (\d+)`)
	failed := regexp.MustCompile(`number of failed transactions: (\d+)`)
	aborted := regexp.MustCompile(`client \d+ script \d+ aborted`)
	runDriverBothWays(t, driverCase{
		driver: "pgbench", mode: "-M prepared -c 16 -j 2 -T 10", needs: []poolerFeature{preparedStatements},
		// transactions: 0, a timed run: any number, all of them successful.
		run: func(t *testing.T, dsn string, pooled bool) *driverRun {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			run := func(args ...string) (string, error) {
				cmd := exec.CommandContext(ctx, pgbench, append(args, dsn)...)
				cmd.Env = append(os.Environ(), "PGSSLMODE=disable")
				out, err := cmd.CombinedOutput()
				return string(out), err
			}
			if !initialized {
				if out, err := run("-i", "-s", "1", "-q"); err != nil {
					t.Fatalf("pgbench -i: %v\n%s", err, out)
				}
				initialized = true
			}
			out, err := run("-M", "prepared", "-c", "16", "-j", "2", "-T", "10")
			p, f := processed.FindStringSubmatch(out), failed.FindStringSubmatch(out)
			if p == nil || f == nil {
				t.Fatalf("pgbench: %v, and no processed or failed-transactions line:\n%s", err, out)
			}
			// pgbench counts as failed only the transactions it retries
			// (serialization, deadlock); a client that meets any other
			// error is aborted (and exits 2): each abort is an error here.
			r := &driverRun{}
			failures, _ := strconv.Atoi(f[1])
			processed, _ := strconv.Atoi(p[1])
			r.errors = failures + len(aborted.FindAllString(out, -1))
			r.transactions = processed + r.errors
			if err != nil || regexp.MustCompile(`aborted|error`).MatchString(out) {
				t.Errorf("pgbench -M prepared: %v, errors:\n%s", err, out)
			}
			t.Logf("pgbench -M prepared:\n%s", out)
			return r
		},
	})
}
