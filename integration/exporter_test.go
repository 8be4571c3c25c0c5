package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// exporterBinary is Debian's prometheus-pgbouncer-exporter (a Python
// exporter that reads SHOW LISTS, STATS, POOLS and DATABASES with
// psycopg2), installed by .ci/run.
func exporterBinary(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("prometheus-pgbouncer-exporter")
	if err != nil {
		t.Fatal("prometheus-pgbouncer-exporter not found: apt-get install prometheus-pgbouncer-exporter")
	}
	return path
}

// runExporter starts the exporter against the console at addr until the
// end of the test and returns its first scrape that holds pgbouncer_pools
// (the last collector's family), or the exporter's output when it never
// has one within the deadline.
func runExporter(t *testing.T, addr, user, password string) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	host, port, _ := strings.Cut(addr, ":")
	metricsPort := freePort(t)
	cmd := exec.Command(exporterBinary(t), "--host", "127.0.0.1", "--port", strconv.Itoa(metricsPort),
		"--pgbouncer-host", host, "--pgbouncer-port", port, "--pgbouncer-user", user)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+password, "PGSSLMODE=disable", "PGCONNECT_TIMEOUT=5")
	output, exited := startChild(t, cmd)
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return nil, output.String()
		default:
		}
		if families, err := scrapeWithin(2*time.Second, url); err == nil && families["pgbouncer_pools"] != nil {
			return families, output.String()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, output.String()
}

// exporterOutcome is what a run of the exporter came to: the families it
// exported, or the last line of the traceback it died with.
func exporterOutcome(families map[string]*dto.MetricFamily, output string) string {
	if families != nil {
		var names []string
		for name := range families {
			if strings.HasPrefix(name, "pgbouncer_") {
				names = append(names, name)
			}
		}
		sort.Strings(names)
		return "exported " + strings.Join(names, " ")
	}
	lines := strings.Split(strings.TrimSpace(output), "\n")
	return "failed: " + strings.TrimSpace(lines[len(lines)-1])
}

// TestConsoleDebianExporter runs Debian's prometheus-pgbouncer-exporter
// against Debian's PgBouncer and against pgtender's console in the same
// run, and requires the same outcome: pgtender's console must serve the
// exporter wherever PgBouncer's does, and fail it at the same place
// where PgBouncer's does. Debian 12's exporter was written for PgBouncer
// 1.7: it asks SHOW STATS for total_requests, which PgBouncer 1.8 replaced
// with total_query_count and total_xact_count, so it fails on Debian 12's PgBouncer 1.18 (and on
// pgtender, which has 1.25's columns) before it exports anything.
func TestConsoleDebianExporter(t *testing.T) {
	bouncer := startPgBouncer(t, pg.Host, pg.Port, 2, "admin_users = "+appUser, "stats_users = "+appUser)
	tp := consolePooler(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := tp.connect(t, ctx)
	if _, err := client.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	theirFamilies, theirOutput := runExporter(t, bouncer, appUser, appPassword)
	ourFamilies, ourOutput := runExporter(t, tp.addr, consoleUser, consolePassword)
	theirs, ours := exporterOutcome(theirFamilies, theirOutput), exporterOutcome(ourFamilies, ourOutput)
	t.Logf("the exporter on PgBouncer: %s", theirs)
	t.Logf("the exporter on pgtender:  %s", ours)
	if ours != theirs {
		t.Errorf("the exporter came to a different end on pgtender than on PgBouncer; its output on pgtender:\n%s", ourOutput)
	}
	if ourFamilies == nil && !strings.Contains(ourOutput, "Traceback") {
		t.Errorf("the exporter neither exported nor failed with a traceback on pgtender; its output:\n%s", ourOutput)
	}
}
