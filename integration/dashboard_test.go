package integration

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestDashboardAndAlertsNameExportedMetrics scrapes a running pgtender
// (with openmetrics_namespace = "pgtender_", as the dashboard and the rules
// assume) and checks that every metric the Grafana dashboard and the alert
// rules refer to is one pgtender exports.
func TestDashboardAndAlertsNameExportedMetrics(t *testing.T) {
	metricsPort := freePort(t)
	pr := startProcessWith(t, processOptions{
		general: metricsGeneral(metricsPort),
	})
	// One login, so that the pool families have a series.
	conn, err := pr.connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	families := scrape(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))

	// The conntrack counters exist only where the kernel has connection
	// tracking (metrics/conntrack.go); elsewhere their absence is right.
	_, statErr := os.Stat("/proc/net/stat/nf_conntrack")
	conntrackAbsent := errors.Is(statErr, fs.ErrNotExist)
	name := regexp.MustCompile(`\b` + namespace + `[a-z_]+`)
	for _, file := range []string{"../deploy/grafana/pgtender.json", "../deploy/prometheus/alerts.yml"} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var missing []string
		seen := map[string]bool{}
		for _, ref := range name.FindAllString(string(data), -1) {
			family := ref
			if families[family] == nil {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if trimmed := strings.TrimSuffix(ref, suffix); trimmed != ref && families[trimmed] != nil {
						family = trimmed
					}
				}
			}
			if conntrackAbsent && strings.HasPrefix(family, namespace+"conntrack_") {
				seen[ref] = true
				continue
			}
			if families[family] == nil && !seen[ref] {
				missing = append(missing, ref)
			}
			seen[ref] = true
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Errorf("%s refers to metrics pgtender does not export: %v", filepath.Base(file), missing)
		}
		if len(seen) == 0 {
			t.Errorf("%s refers to no %s metric at all", file, namespace)
		}
	}
}
