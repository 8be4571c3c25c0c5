package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The Django fleet suite runs the project in testdata/django the way the
// fleets run it: behind gunicorn with several sync worker processes, each
// with its own Django database connection, pointed at pgtender in
// transaction mode with passthrough auth, with CONN_MAX_AGE=0 (a new
// connection per request) and CONN_MAX_AGE=60 (kept), and once more with
// CONN_MAX_AGE=0 on a database whose TimeZone is Django's, so that Django
// sends no SET at connect. The same runs then go straight to Postgres. Every response is checked
// against what the Go side computes, and the responses of every run must be
// the same: the views return nothing that depends on ids or on the order in
// which concurrent requests ran.

const (
	// djangoWorkers is gunicorn's worker processes: more than the pool's
	// server connections, so that through pgtender Django connections share
	// server connections between transactions.
	djangoWorkers  = 3
	djangoPoolSize = 2
	// djangoClients is how many requests the Go side keeps in flight: two
	// per worker, so that a worker always has a request waiting.
	djangoClients = 2 * djangoWorkers
	// djangoUnits is the workload's size: each unit is one request to each
	// of the views in djangoViews, in that order (report and raw read what
	// order wrote).
	djangoUnits = 100
	// djangoWorkloadTimeout bounds one run's workload; it is a bound for a
	// hung run, not a performance target.
	djangoWorkloadTimeout = 3 * time.Minute
)

// djangoViews are the workload's views, in the order a unit requests them.
var djangoViews = []string{"order", "report", "nested", "transfer", "integrity", "raw", "iterate"}

// djangoRun is one run of the suite.
type djangoRun struct {
	pooled     bool
	connMaxAge int
	// timeZoneUTC sets the database's TimeZone to Django's ('UTC'). Django
	// runs SET TIME ZONE on every new connection whose server reports
	// another name (the cluster's default here is 'Etc/UTC'); with this
	// it runs none.
	timeZoneUTC bool
}

func (r djangoRun) name() string {
	target := "direct"
	if r.pooled {
		target = "pgtender"
	}
	name := fmt.Sprintf("%s/conn_max_age=%d", target, r.connMaxAge)
	if r.timeZoneUTC {
		name += "/timezone=UTC"
	}
	return name
}

// djangoResult is what a run measured and returned.
type djangoResult struct {
	requests       int
	errors         []string // at most djangoErrorsKept, then counted only
	errorCount     int
	newConnections int // requests that opened a database connection
	elapsed        time.Duration
	connectMillis  float64           // Django's connect and close, mean of 20
	bodies         map[string]string // request ("order?n=3") → canonical JSON
	summary        string            // canonical JSON of /summary
}

const djangoErrorsKept = 10

func (r *djangoResult) fail(format string, args ...any) {
	r.errorCount++
	if len(r.errors) < djangoErrorsKept {
		r.errors = append(r.errors, fmt.Sprintf(format, args...))
	}
}

func (r *djangoResult) perSecond() float64 {
	return float64(r.requests) / r.elapsed.Seconds()
}

// TestDjangoFleet: see the comment above. 0 errors are required both ways,
// the responses must agree, and requests/s are logged, not asserted.
func TestDjangoFleet(t *testing.T) {
	python := pythonWith(t, "django", "python3-django python3-psycopg2")
	pythonWith(t, "psycopg2", "python3-psycopg2")
	pythonWith(t, "gunicorn", "gunicorn")
	project, err := filepath.Abs(filepath.Join("testdata", "django"))
	if err != nil {
		t.Fatal(err)
	}
	runs := []djangoRun{{true, 0, false}, {true, 60, false}, {true, 0, true}, {false, 0, false}, {false, 60, false}, {false, 0, true}}
	results := make([]*djangoResult, len(runs))
	for i, run := range runs {
		ok := t.Run(run.name(), func(t *testing.T) {
			results[i] = runDjangoFleet(t, python, project, run)
		})
		if !ok {
			t.FailNow()
		}
	}
	// The differential: every run's responses are the first run's.
	reference := results[0]
	for i := 1; i < len(runs); i++ {
		compareDjangoResults(t, runs[0].name(), reference, runs[i].name(), results[i])
	}
	var table []string
	for i, run := range runs {
		r := results[i]
		table = append(table, fmt.Sprintf("%-38s %d requests, %d errors, %d new database connections, %.1f requests/s; Django connect+close %.1f ms",
			run.name(), r.requests, r.errorCount, r.newConnections, r.perSecond(), r.connectMillis))
	}
	t.Logf("django fleet, %d gunicorn sync workers, %d requests in flight:\n%s",
		djangoWorkers, djangoClients, strings.Join(table, "\n"))
}

// TestDjangoServerSideCursors is what DISABLE_SERVER_SIDE_CURSORS = True
// avoids (docs/django.md): with server-side cursors left on, iterator()
// outside atomic declares a cursor WITH HOLD in one transaction and
// fetches from it in later ones. Through pgtender that works because the
// cursor pins the server connection to the Django connection until Django
// closes it (docs/pooling.md, "Session state that pins a server
// connection"); the test checks the answers and that the pins happen and
// end, and logs how many there were.
func TestDjangoServerSideCursors(t *testing.T) {
	python := pythonWith(t, "django", "python3-django python3-psycopg2")
	pythonWith(t, "gunicorn", "gunicorn")
	project, err := filepath.Abs(filepath.Join("testdata", "django"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const database = "django_cursors"
	createDjangoDatabase(t, ctx, database)
	tp := startDjangoPooler(t, database)
	host, port := splitAddr(t, tp.addr)
	env := append(djangoEnv(project, host, port, appDB, 60), "DJANGO_SERVER_SIDE_CURSORS=1")
	djangoManage(t, ctx, python, project, env, "Applying shop.0002_seed... OK", "migrate", "--noinput")
	base := startGunicorn(t, python, project, env)
	pinsBefore, _ := djangoPins(tp)

	const requests = 30
	client := &http.Client{Timeout: 30 * time.Second}
	for i := 0; i < requests; i++ {
		body, _, err := djangoRequest(ctx, client, base, "iterate", i)
		if err == nil {
			err = compareJSON(body, djangoExpected("iterate", i))
		}
		if err != nil {
			t.Fatalf("iterate request %d: %v", i, err)
		}
	}
	logged, _ := djangoPins(tp)
	t.Logf("%d iterate requests with server-side cursors on: pgtender logged %d pins", requests, logged-pinsBefore)
	if logged == pinsBefore {
		t.Errorf("no pin logged: did iterator() use a server-side cursor?")
	}
	eventually(t, 10*time.Second, "every pin to end once Django closed its cursors", func() bool {
		_, pinned := djangoPins(tp)
		return pinned == 0
	})
}

// runDjangoFleet runs the suite once against a database of its own: check,
// migrate, gunicorn, the workload, the summary.
func runDjangoFleet(t *testing.T, python, project string, run djangoRun) *djangoResult {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	target := "direct"
	if run.pooled {
		target = "pooled"
	}
	database := fmt.Sprintf("django_%s_%d_%t", target, run.connMaxAge, run.timeZoneUTC)
	createDjangoDatabase(t, ctx, database)
	if run.timeZoneUTC {
		if err := pg.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{database}.Sanitize()+" SET timezone TO 'UTC'"); err != nil {
			t.Fatal(err)
		}
	}

	host, port, name := pg.Host, strconv.Itoa(pg.Port), database
	var tp *testPooler
	if run.pooled {
		tp = startDjangoPooler(t, database)
		host, port = splitAddr(t, tp.addr)
		name = appDB
	}
	env := djangoEnv(project, host, port, name, run.connMaxAge)

	djangoManage(t, ctx, python, project, env, "System check identified no issues", "check", "--database", "default")
	djangoManage(t, ctx, python, project, env, "Applying shop.0002_seed... OK", "migrate", "--noinput")
	// What a request with CONN_MAX_AGE=0 pays before its first query:
	// Django opening (and initialising) its connection, then closing it.
	out := djangoManage(t, ctx, python, project, env, "connect_ms=", "shell", "-c", djangoConnectCost)
	connectMillis, _ := strconv.ParseFloat(strings.TrimSpace(out[strings.LastIndex(out, "connect_ms=")+len("connect_ms="):]), 64)
	if wantTZ := "server_timezone=UTC\n"; run.timeZoneUTC != strings.Contains(out, wantTZ) {
		t.Errorf("the server's TimeZone as Django saw it: %q, want UTC: %v", out, run.timeZoneUTC)
	}

	base := startGunicorn(t, python, project, env)
	result := driveDjango(t, base)
	result.connectMillis = connectMillis
	if run.pooled {
		// The workers' Django connections (kept open with CONN_MAX_AGE=60)
		// share at most pool_size server connections.
		var servers int
		if err := direct(t, ctx).QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND usename = $2",
			database, appUser).Scan(&servers); err != nil {
			t.Fatal(err)
		}
		if servers > djangoPoolSize {
			t.Errorf("%d server connections to %s, want at most pool_size %d", servers, database, djangoPoolSize)
		}
		t.Logf("server connections to %s after the workload: %d", database, servers)
		// With server-side cursors off nothing the suite does holds state
		// on a server connection between transactions.
		if logged, _ := djangoPins(tp); logged != 0 {
			t.Errorf("pgtender pinned a server connection %d times, want 0", logged)
		}
	}

	t.Logf("%s: %d requests, %d errors, %d new database connections, %v, %.1f requests/s",
		run.name(), result.requests, result.errorCount, result.newConnections, result.elapsed.Round(time.Millisecond), result.perSecond())
	if result.errorCount > 0 {
		t.Fatalf("%d errors, the first ones:\n%s", result.errorCount, strings.Join(result.errors, "\n"))
	}
	// CONN_MAX_AGE does what docs/django.md says: every request opens a
	// connection with 0; with 60 each worker opens one and keeps it.
	if run.connMaxAge == 0 && result.newConnections != result.requests {
		t.Errorf("CONN_MAX_AGE=0: %d of %d requests opened a database connection, want all", result.newConnections, result.requests)
	}
	if run.connMaxAge > 0 && result.newConnections > djangoWorkers {
		t.Errorf("CONN_MAX_AGE=%d: %d requests opened a database connection, want at most one per worker (%d)",
			run.connMaxAge, result.newConnections, djangoWorkers)
	}
	return result
}

// createDjangoDatabase creates database, owned by the app role, afresh for
// one run. Cleanups run last-in first-out: the drop, registered before
// pgtender and gunicorn start, runs after they have stopped.
func createDjangoDatabase(t *testing.T, ctx context.Context, database string) {
	t.Helper()
	drop := func() error {
		return pg.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{database}.Sanitize()+" WITH (FORCE)")
	}
	if err := drop(); err != nil {
		t.Fatal(err)
	}
	if err := pg.CreateDatabase(ctx, database, appUser); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Errorf("dropping %s: %v", database, err)
		}
	})
}

// startDjangoPooler starts pgtender as the fleets run it in front of
// Django: transaction mode, passthrough auth, a pool smaller than the
// number of gunicorn workers; the client database appdb is database on
// the server.
func startDjangoPooler(t *testing.T, database string) *testPooler {
	t.Helper()
	return startPooler(t, poolerOptions{
		general: joinLines(`passthrough_auth = "enabled_plain"`, `pooler_mode = "transaction"`),
		pool:    joinLines(fmt.Sprintf("pool_size = %d", djangoPoolSize), fmt.Sprintf("database_name = %q", database)),
	})
}

// djangoEnv is the environment testdata/django/fleetsite/settings.py reads.
func djangoEnv(project, host, port, database string, connMaxAge int) []string {
	return append(os.Environ(),
		"PYTHONDONTWRITEBYTECODE=1", "PYTHONNOUSERSITE=1", "PYTHONPATH="+project,
		"DJANGO_SETTINGS_MODULE=fleetsite.settings",
		"DJANGO_DB_HOST="+host, "DJANGO_DB_PORT="+port, "DJANGO_DB_NAME="+database,
		"DJANGO_DB_USER="+appUser, "DJANGO_DB_PASSWORD="+appPassword,
		"DJANGO_DB_SSLMODE=disable", "DJANGO_CONN_MAX_AGE="+itoa(connMaxAge))
}

// djangoPins counts the pins pgtender logged; pinnedClients is how many
// clients are pinned now.
func djangoPins(tp *testPooler) (logged, pinnedClients int) {
	for _, s := range tp.PoolStats() {
		pinnedClients += s.ClientsPinned
	}
	return strings.Count(tp.logs.String(), "server connection pinned to its client"), pinnedClients
}

// djangoConnectCost is Python for `manage.py shell -c`: the TimeZone the
// server reports at login, then the mean time of 20 connects and closes of
// Django's default connection, in milliseconds.
const djangoConnectCost = `import time
import psycopg2
from django.db import connection
# The TimeZone the server reports at login, before Django may SET it.
plain = psycopg2.connect(**connection.get_connection_params())
print("server_timezone=%s" % plain.get_parameter_status("TimeZone"))
plain.close()
start = time.perf_counter()
for _ in range(20):
    connection.ensure_connection()
    connection.close()
print("connect_ms=%.2f" % ((time.perf_counter() - start) / 20 * 1000))
`

// djangoManage runs `manage.py args...` within ctx and fails the test unless it
// succeeds and its output contains want. It returns the output.
func djangoManage(t *testing.T, ctx context.Context, python, project string, env []string, want string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, append([]string{filepath.Join(project, "manage.py")}, args...)...)
	cmd.Dir = project
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), want) {
		t.Fatalf("manage.py %s: %v, want output containing %q:\n%s", strings.Join(args, " "), err, want, out)
	}
	t.Logf("manage.py %s:\n%s", strings.SplitN(strings.Join(args, " "), "\n", 2)[0], strings.TrimSpace(string(out)))
	return string(out)
}

// startGunicorn starts gunicorn with djangoWorkers sync workers on a free
// loopback port, in a process group of its own so that the master and its
// workers are all stopped at the end of the test, and waits until it
// answers. It returns the base URL.
func startGunicorn(t *testing.T, python, project string, env []string) string {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(python, "-m", "gunicorn",
		"--workers", itoa(djangoWorkers), "--worker-class", "sync",
		"--bind", addr, "--chdir", project,
		// A worker stuck on the database is killed and the request fails
		// rather than hanging the test.
		"--timeout", "30", "--graceful-timeout", "5",
		"--log-level", "warning", "fleetsite.wsgi:application")
	cmd.Dir = project
	cmd.Env = env
	// Pdeathsig: if the test binary dies, the master dies with it, and the
	// workers leave when they see their parent gone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	output := new(syncBuffer)
	cmd.Stdout, cmd.Stderr = output, output
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	pgid := cmd.Process.Pid
	t.Cleanup(func() {
		stopProcessGroup(t, pgid, exited)
		if t.Failed() {
			t.Logf("gunicorn output:\n%s", output.String())
		}
	})

	base := "http://" + addr
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("gunicorn exited before it answered:\n%s", output.String())
		default:
		}
		resp, err := client.Get(base + "/ping")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			err = fmt.Errorf("%s: %s", resp.Status, body)
		}
		if time.Now().After(deadline) {
			t.Fatalf("gunicorn on %s did not answer /ping within 60s: %v\n%s", addr, err, output.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return base
}

// stopProcessGroup stops gunicorn: SIGTERM to the group (the master stops
// its workers gracefully), SIGKILL to what is left after a bound, and then
// waits until no live process is left in the group.
func stopProcessGroup(t testing.TB, pgid int, exited <-chan struct{}) {
	t.Helper()
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		t.Errorf("gunicorn (process group %d) still running 15s after SIGTERM; killing it", pgid)
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-exited
	}
	// A worker that outlived its master would be left behind otherwise.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	eventually(t, 10*time.Second, fmt.Sprintf("no process left in gunicorn's process group %d", pgid), func() bool {
		return len(liveProcessesInGroup(pgid)) == 0
	})
}

// liveProcessesInGroup lists the processes of group pgid that are not
// zombies (a killed worker whose master is gone may wait as a zombie for an
// init that does not reap; it holds no socket and no memory).
func liveProcessesInGroup(pgid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", entry.Name(), "stat"))
		if err != nil {
			continue
		}
		// After the parenthesised command name: state, ppid, pgrp.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 3 || fields[0] == "Z" {
			continue
		}
		if group, err := strconv.Atoi(fields[2]); err == nil && group == pgid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// driveDjango runs the workload: djangoUnits units, djangoClients at a
// time, then /summary.
func driveDjango(t *testing.T, base string) *djangoResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), djangoWorkloadTimeout)
	defer cancel()
	client := &http.Client{Timeout: 30 * time.Second}
	result := &djangoResult{bodies: map[string]string{}}
	var mu sync.Mutex // guards result

	units := make(chan int, djangoUnits)
	for n := 1; n <= djangoUnits; n++ {
		units <- n
	}
	close(units)
	start := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < djangoClients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range units {
				for _, view := range djangoViews {
					if ctx.Err() != nil {
						return
					}
					key := fmt.Sprintf("%s?n=%d", view, n)
					body, opened, err := djangoRequest(ctx, client, base, view, n)
					if err == nil {
						err = compareJSON(body, djangoExpected(view, n))
					}
					mu.Lock()
					result.requests++
					if opened {
						result.newConnections++
					}
					if err != nil {
						result.fail("%s: %v", key, err)
					} else {
						result.bodies[key] = body
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	result.elapsed = time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("the workload did not finish within %v (%d requests done)", djangoWorkloadTimeout, result.requests)
	}
	if want := djangoUnits * len(djangoViews); result.requests != want {
		t.Fatalf("%d requests made, want %d", result.requests, want)
	}

	summary, _, err := djangoRequest(ctx, client, base, "summary", 0)
	if err == nil {
		err = compareJSON(summary, djangoExpectedSummary())
	}
	if err != nil {
		result.fail("summary: %v", err)
	}
	result.summary = summary
	return result
}

// djangoRequest makes one request: POST for the views that write, GET for
// the others. It returns the canonical JSON body and whether the request
// opened a database connection (the project's X-New-DB-Connection header).
func djangoRequest(ctx context.Context, client *http.Client, base, view string, n int) (string, bool, error) {
	var req *http.Request
	var err error
	switch view {
	case "order", "nested", "transfer", "integrity":
		form := url.Values{"n": {itoa(n)}}.Encode()
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, base+"/"+view, strings.NewReader(form))
		if err == nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
	default:
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, base+"/"+view+"?n="+itoa(n), nil)
	}
	if err != nil {
		return "", false, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", false, err
	}
	opened := resp.Header.Get("X-New-DB-Connection") == "1"
	if resp.StatusCode != http.StatusOK {
		return "", opened, fmt.Errorf("%s: %.200s", resp.Status, body)
	}
	canonical, err := canonicalJSON(body)
	return canonical, opened, err
}

// canonicalJSON re-encodes a JSON document with sorted keys.
func canonicalJSON(data []byte) (string, error) {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return "", fmt.Errorf("not JSON: %w: %.200s", err, data)
	}
	out, err := json.Marshal(v)
	return string(out), err
}

// compareJSON compares a canonical JSON body with the expected value.
func compareJSON(body string, want any) error {
	data, err := json.Marshal(want)
	if err != nil {
		return err
	}
	canonical, err := canonicalJSON(data)
	if err != nil {
		return err
	}
	if body != canonical {
		return fmt.Errorf("got %s, want %s", body, canonical)
	}
	return nil
}

// compareDjangoResults requires two runs' responses to be the same.
func compareDjangoResults(t *testing.T, name string, a *djangoResult, otherName string, b *djangoResult) {
	t.Helper()
	keys := make([]string, 0, len(a.bodies))
	for k := range a.bodies {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	differences := 0
	for _, k := range keys {
		if a.bodies[k] != b.bodies[k] {
			differences++
			if differences <= djangoErrorsKept {
				t.Errorf("%s: %s answered %s, %s answered %s", k, name, a.bodies[k], otherName, b.bodies[k])
			}
		}
	}
	if len(a.bodies) != len(b.bodies) {
		t.Errorf("%s has %d responses, %s %d", name, len(a.bodies), otherName, len(b.bodies))
	}
	if a.summary != b.summary {
		t.Errorf("summary: %s answered %s, %s answered %s", name, a.summary, otherName, b.summary)
	}
	if differences > 0 {
		t.Errorf("%d responses differ between %s and %s", differences, name, otherName)
	}
}

// The workload's data, as testdata/django/shop computes it.
const (
	djangoProducts       = 20
	djangoAccounts       = 10
	djangoOpeningBalance = 1000
)

func djangoSKU(k int) string { return fmt.Sprintf("p-%02d", k) }

func djangoPrice(k int) int { return (k + 1) * 100 }

// djangoOrderLines mirrors shop.views.order_lines: (product, qty) pairs.
func djangoOrderLines(n int) [][2]int {
	return [][2]int{{n % djangoProducts, n%5 + 1}, {(n + 7) % djangoProducts, n%3 + 1}, {(n + 13) % djangoProducts, 1}}
}

// djangoTransfer mirrors shop.views.transfer_of.
func djangoTransfer(n int) (from, to, amount int) {
	from = n % djangoAccounts
	to = (from + 1 + n%(djangoAccounts-1)) % djangoAccounts
	return from, to, n%7 + 1
}

// djangoExpected is the response view must give for n.
func djangoExpected(view string, n int) any {
	customer := fmt.Sprintf("c-%d", n)
	items, value := 0, 0
	type line struct {
		sku string
		qty int
	}
	var lines []line
	for _, l := range djangoOrderLines(n) {
		items += l[1]
		value += l[1] * djangoPrice(l[0])
		lines = append(lines, line{djangoSKU(l[0]), l[1]})
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i].sku < lines[j].sku })
	switch view {
	case "order":
		return map[string]any{"n": n, "updated": 1, "status": "placed", "lines": 3, "total": value}
	case "report":
		var rows [][]any
		for _, l := range lines {
			rows = append(rows, []any{l.sku, l.qty, customer})
		}
		return map[string]any{"n": n, "lines": rows,
			"customer": map[string]any{"name": customer, "orders_count": 1, "items": items, "value": value}}
	case "nested":
		return map[string]any{"n": n, "inside": 3, "in_atomic": true, "texts": []string{"kept-1", "kept-3", "outer"},
			"on_commit_ran": true, "in_atomic_after": false}
	case "transfer":
		from, to, amount := djangoTransfer(n)
		return map[string]any{"n": n, "locked": 2, "from": fmt.Sprintf("a-%d", from), "to": fmt.Sprintf("a-%d", to),
			"amount": amount, "total": djangoAccounts * djangoOpeningBalance}
	case "integrity":
		return map[string]any{"n": n, "caught": []string{"atomic", "savepoint", "autocommit"}, "after_atomic": 1,
			"texts": []string{"after", "before"}, "customers": 1}
	case "raw":
		return map[string]any{"n": n, "joined": []any{customer, 3, items, value},
			"echoed":    []any{`it's "quoted" %s; -- ` + customer, n + 1, true},
			"raw_names": []string{customer}}
	case "iterate":
		total := 0
		for k := 0; k < djangoProducts; k++ {
			total += djangoPrice(k)
		}
		return map[string]any{"count": djangoProducts, "total": total}
	}
	panic("no expected response for view " + view)
}

// djangoExpectedSummary is /summary after djangoUnits complete units.
func djangoExpectedSummary() any {
	lineCount := make([]int, djangoProducts)
	itemCount := make([]int, djangoProducts)
	balances := make([]int, djangoAccounts)
	for a := range balances {
		balances[a] = djangoOpeningBalance
	}
	lines, items, value := 0, 0, 0
	for n := 1; n <= djangoUnits; n++ {
		for _, l := range djangoOrderLines(n) {
			lineCount[l[0]]++
			itemCount[l[0]] += l[1]
			lines++
			items += l[1]
			value += l[1] * djangoPrice(l[0])
		}
		from, to, amount := djangoTransfer(n)
		balances[from] -= amount
		balances[to] += amount
	}
	var products [][]any
	for k := 0; k < djangoProducts; k++ {
		var sum any // SQL's sum over no rows is NULL
		if lineCount[k] > 0 {
			sum = itemCount[k]
		}
		products = append(products, []any{djangoSKU(k), lineCount[k], sum})
	}
	var accounts [][]any
	for a := 0; a < djangoAccounts; a++ {
		accounts = append(accounts, []any{fmt.Sprintf("a-%d", a), balances[a]})
	}
	return map[string]any{
		// c-n from order, dup-n from integrity.
		"customers":     2 * djangoUnits,
		"orders":        djangoUnits,
		"totals":        map[string]any{"lines": lines, "items": items, "value": value},
		"products":      products,
		"balances":      accounts,
		"balance_total": djangoAccounts * djangoOpeningBalance,
		// Three notes from nested, two from integrity.
		"notes": 5 * djangoUnits,
	}
}
