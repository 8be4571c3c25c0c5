package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The driver tests (issue 12) run each real driver at its defaults, and in
// the modes its users pick, once straight to Postgres and once through
// pgtender (transaction mode, passthrough auth, many clients over a pool of
// driversPoolSize), and compare the two runs. They prove what statement
// renaming and settings tracking must make work; until the relay has a
// feature, the pooled runs that need it are skipped (poolerHas) and the
// direct runs, which validate the tests themselves, still run.
//
// Each run ends in a one-line matrix row (t.Logf, "matrix: ...") with the
// transactions and errors of both runs.

// poolerHas says which issue-12 features the relay has; a pooled run of a
// test that needs a missing one is skipped with the reason, its direct run
// still runs. Flip a field when the feature lands (and delete the struct
// when all three have).
var poolerHas = struct {
	// preparedStatements: named prepared statements (protocol-level Parse
	// with a name, PREPARE/EXECUTE, DEALLOCATE [ALL]) are renamed to
	// pool-wide names and re-prepared on any server connection that lacks
	// them; and the unnamed statement parsed before a Sync still means
	// the client's statement when it is bound after it (pgx DescribeExec).
	preparedStatements bool
	// sessionSettings: SET, RESET, RESET ALL and set_config(..., false) of
	// any parameter (search_path, statement_timeout, work_mem…) follow the
	// client to every server connection and never reach another client.
	sessionSettings bool
	// startupOptions: startup-packet settings other than the reported ones
	// (options=-c name=value, a bare statement_timeout or search_path
	// runtime parameter) are applied, and invalid ones are refused at login
	// with the SQLSTATE Postgres gives.
	startupOptions bool
}{preparedStatements: true, sessionSettings: true, startupOptions: true}

// assumePoolerHas turns fields of poolerHas on for one run, to see the
// pooled halves run (and fail) before a feature lands:
// go test -run TestDriversPsycopg3 ./integration -args -assume-pooler-has=preparedStatements
var assumePoolerHas = flag.String("assume-pooler-has", "",
	"comma-separated poolerHas fields to treat as true: preparedStatements, sessionSettings, startupOptions")

var assumeOnce sync.Once

// poolerFeature names one field of poolerHas.
type poolerFeature int

const (
	preparedStatements poolerFeature = iota
	sessionSettings
	startupOptions
)

func (f poolerFeature) has() bool {
	assumeOnce.Do(func() {
		for _, name := range strings.Split(*assumePoolerHas, ",") {
			switch strings.TrimSpace(name) {
			case "preparedStatements":
				poolerHas.preparedStatements = true
			case "sessionSettings":
				poolerHas.sessionSettings = true
			case "startupOptions":
				poolerHas.startupOptions = true
			case "":
			default:
				panic("-assume-pooler-has: unknown feature " + name)
			}
		}
	})
	switch f {
	case preparedStatements:
		return poolerHas.preparedStatements
	case sessionSettings:
		return poolerHas.sessionSettings
	case startupOptions:
		return poolerHas.startupOptions
	}
	return false
}

func (f poolerFeature) String() string {
	switch f {
	case preparedStatements:
		return "poolerHas.preparedStatements (named statements renamed and re-prepared)"
	case sessionSettings:
		return "poolerHas.sessionSettings (SET/RESET of any parameter follows the client)"
	case startupOptions:
		return "poolerHas.startupOptions (startup options and runtime parameters applied)"
	}
	return "poolerFeature(" + strconv.Itoa(int(f)) + ")"
}

// poolerLacks returns why a pooled run needing features cannot run yet, or
// "" when the relay has them all.
func poolerLacks(features ...poolerFeature) string {
	var missing []string
	for _, f := range features {
		if !f.has() {
			missing = append(missing, f.String())
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return "pgtender lacks " + strings.Join(missing, " and ") + " (issue 12)"
}

// driversPoolSize is the pool the driver tests' many clients share.
const driversPoolSize = 4

// startDriversPooler starts pgtender as the driver tests use it.
func startDriversPooler(t testing.TB, poolSize int) *testPooler {
	t.Helper()
	return startPooler(t, poolerOptions{
		general: `passthrough_auth = "enabled_plain"
pooler_mode = "transaction"
prepared_statements = "extended"`,
		pool: fmt.Sprintf("pool_size = %d", poolSize),
	})
}

// driverRun is what one run of a driver did.
type driverRun struct {
	transactions, errors int
	observed             map[string]string // compared between the two runs
	elapsed              time.Duration
	skipped              string // why the run did not happen
}

func (r *driverRun) cell() string {
	switch {
	case r == nil:
		return "not run"
	case r.skipped != "":
		return "skipped: " + r.skipped
	}
	return fmt.Sprintf("%d transactions/%d errors in %v", r.transactions, r.errors, r.elapsed.Round(time.Millisecond))
}

// driverCase is one driver in one mode, run both ways by runDriverBothWays.
type driverCase struct {
	driver, mode string
	// needs are the features the pooled run needs.
	needs []poolerFeature
	// poolSize is the pooled run's pool; 0: driversPoolSize.
	poolSize int
	// transactions is how many transactions a run must report; 0: any
	// number above 0 (a timed run).
	transactions int
	// run runs the driver against dsn (a postgres:// URL for the app user)
	// and reports what it did; it fails t for what it cannot report.
	run func(t *testing.T, dsn string, pooled bool) *driverRun
}

// runDriverBothWays runs dc straight to Postgres, then (unless the relay
// lacks what it needs) through a fresh pgtender; each run must complete
// dc.transactions transactions with no errors, and their observations must
// agree. It logs the matrix row.
func runDriverBothWays(t *testing.T, dc driverCase) {
	t.Helper()
	var direct, pooled *driverRun
	t.Cleanup(func() {
		t.Logf("matrix: driver=%s mode=%s direct: %s; pooled: %s", dc.driver, dc.mode, direct.cell(), pooled.cell())
	})
	check := func(t *testing.T, r *driverRun) {
		t.Helper()
		switch {
		case dc.transactions == 0 && (r.transactions == 0 || r.errors != 0):
			t.Errorf("%d transactions, %d errors; want some and 0", r.transactions, r.errors)
		case dc.transactions > 0 && (r.transactions != dc.transactions || r.errors != 0):
			t.Errorf("%d transactions, %d errors; want %d and 0", r.transactions, r.errors, dc.transactions)
		}
	}
	t.Run("direct", func(t *testing.T) {
		start := time.Now()
		direct = dc.run(t, pg.ConnString(appUser, appPassword, appDB), false)
		direct.elapsed = time.Since(start)
		check(t, direct)
	})
	t.Run("pooled", func(t *testing.T) {
		if reason := poolerLacks(dc.needs...); reason != "" {
			pooled = &driverRun{skipped: reason}
			t.Skip(reason)
		}
		poolSize := dc.poolSize
		if poolSize == 0 {
			poolSize = driversPoolSize
		}
		tp := startDriversPooler(t, poolSize)
		start := time.Now()
		pooled = dc.run(t, tp.connString(appUser, appPassword, appDB), true)
		pooled.elapsed = time.Since(start)
		check(t, pooled)
		if direct != nil {
			compareObservations(t, direct.observed, pooled.observed)
		}
	})
}

// compareObservations fails t for every key whose value differs, or that
// only one run reported.
func compareObservations(t testing.TB, direct, pooled map[string]string) {
	t.Helper()
	keys := map[string]bool{}
	for k := range direct {
		keys[k] = true
	}
	for k := range pooled {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		d, dok := direct[k]
		p, pok := pooled[k]
		if !dok || !pok || d != p {
			t.Errorf("observation %s: straight to Postgres %q (reported: %v), through pgtender %q (reported: %v)", k, d, dok, p, pok)
		}
	}
}

// scriptSummary is the last line of every driver script in
// testdata/clients: "<driver> <mode>: T transactions, E errors".
var scriptSummary = regexp.MustCompile(`: (\d+) transactions, (\d+) errors$`)

// runDriverScript runs a driver script within timeout and reads its
// "observe:" lines and summary. A script that exits non-zero with a
// summary line is a run with errors (the caller fails it, after the matrix
// row has the figures); one without is a failure of the test.
func runDriverScript(t *testing.T, timeout time.Duration, command func(ctx context.Context) *exec.Cmd) *driverRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := command(ctx)
	cmd.Env = append(cmd.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONNOUSERSITE=1", "PGCONNECT_TIMEOUT=10")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	run := &driverRun{observed: map[string]string{}, elapsed: time.Since(start)}
	var lines []string
	scanner := bufio.NewScanner(&stdout)
	scanner.Buffer(nil, 1<<20)
	for scanner.Scan() {
		line := scanner.Text()
		lines = append(lines, line)
		if rest, ok := strings.CutPrefix(line, "observe: "); ok {
			k, v, _ := strings.Cut(rest, "=")
			run.observed[k] = v
		}
	}
	output := strings.Join(lines, "\n")
	if stderr.Len() > 0 {
		output += "\nstderr:\n" + stderr.String()
	}
	if ctx.Err() != nil {
		t.Fatalf("%v: did not finish within %v\n%s", cmd.Args, timeout, output)
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("%v: %v", cmd.Args, err)
	}
	last := ""
	if len(lines) > 0 {
		last = lines[len(lines)-1]
	}
	m := scriptSummary.FindStringSubmatch(last)
	if m == nil {
		t.Fatalf("%v: %v, last line %q is not a summary\n%s", cmd.Args, err, last, output)
	}
	run.transactions, _ = strconv.Atoi(m[1])
	run.errors, _ = strconv.Atoi(m[2])
	if err != nil || run.errors > 0 {
		t.Errorf("%v: %v\n%s", cmd.Args, err, output)
	} else {
		t.Logf("%v (%v):\n%s", cmd.Args[:2], run.elapsed.Round(time.Millisecond), output)
	}
	return run
}

// requireTool is how a driver test meets a missing tool: under CI=true (set
// by .ci/run's callers) it fails with the install hint, since CI installs
// everything; elsewhere it skips, so a developer without Java or asyncpg
// still runs the rest.
func requireTool(t testing.TB, ok bool, format string, args ...any) {
	t.Helper()
	if ok {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
		t.Fatal(msg)
	}
	t.Skip(msg + " (skipped; under CI=true this fails)")
}

// pythonModule returns a Python 3 that imports module, as pythonWith does,
// but meets a missing module with requireTool.
func pythonModule(t testing.TB, module, debianPackages string) string {
	t.Helper()
	var tried []string
	for _, candidate := range []string{"python3", "/usr/bin/python3"} {
		path, err := exec.LookPath(candidate)
		if err != nil {
			continue
		}
		cmd := exec.Command(path, "-c", "import "+module)
		cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "PYTHONNOUSERSITE=1")
		out, err := cmd.CombinedOutput()
		if err == nil {
			return path
		}
		tried = append(tried, fmt.Sprintf("%s: %s", path, lastLine(out)))
	}
	requireTool(t, false, "no python3 can import %s (%s): install it (apt-get install -y --no-install-recommends python3 %s)",
		module, strings.Join(tried, "; "), debianPackages)
	return ""
}

// lookTool returns the path of a program, meeting a missing one with
// requireTool.
func lookTool(t testing.TB, name, debianPackages string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	requireTool(t, err == nil, "%s not found: install it (apt-get install -y --no-install-recommends %s)", name, debianPackages)
	return path
}
