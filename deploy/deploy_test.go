// Package deploy checks the deployment files kept beside it: the Grafana dashboard
// (grafana/pgtender.json) and the Prometheus alert rules (prometheus/alerts.yml) with their
// promtool unit tests (prometheus/alerts_test.yml). It has no code of its own, only tests.
//
// The checks:
//   - promtool accepts the rules (check rules) and their unit tests pass (test rules);
//   - every alert has a severity, a summary and a description, and a test case where it fires
//     and one where it does not;
//   - the dashboard is valid JSON with the expected variables and panels, each titled and
//     described, and every query in it is valid PromQL (promtool checks them as recording rules);
//   - every metric the dashboard, the rules and the rule tests name is one pgtender exports, and
//     every exported metric is used: referencedMetrics is exactly that set.
//
// promtool comes with Debian's prometheus package; the tests fail, not skip, without it.
package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	dashboardPath  = "grafana/pgtender.json"
	rulesPath      = "prometheus/alerts.yml"
	rulesTestPath  = "prometheus/alerts_test.yml"
	metricPrefix   = "pgtender_" // openmetrics_namespace the dashboard and rules assume
	promtoolBudget = 2 * time.Minute
)

// referencedMetrics returns the metric families the dashboard and the alert rules reference,
// with the pgtender_ prefix (openmetrics_namespace = "pgtender_") and histograms by their
// family name (no _bucket, _sum or _count). It is exactly the list of metrics DESIGN.md
// ("Observability") says pgtender exports: TestReferencedMetrics fails when a file names a
// metric missing here or when a metric here is used by neither file, so an integration test
// can check each name against a real scrape of pgtender's /metrics.
func referencedMetrics() []string {
	return []string{
		// Login path.
		"pgtender_login_duration_seconds", // histogram, label phase
		"pgtender_logins_in_flight",
		"pgtender_logins_total",           // label result
		"pgtender_logins_abandoned_total", // label stage
		// Kernel: per listening socket (labels worker, address), then namespace-wide.
		"pgtender_listen_queue_length",
		"pgtender_listen_queue_capacity",
		"pgtender_listen_overflows_total",
		"pgtender_listen_drops_total",
		// Kernel connection tracking of the network namespace; absent where the kernel has none.
		"pgtender_conntrack_drops_total",
		"pgtender_conntrack_early_drops_total",
		"pgtender_conntrack_insert_failed_total",
		// Pools, labels user and database.
		"pgtender_cl_active",
		"pgtender_cl_waiting",
		"pgtender_sv_active",
		"pgtender_sv_idle",
		"pgtender_sv_idle_xact",
		"pgtender_sv_total",
		"pgtender_maxwait",
		"pgtender_total_xact_count",
		"pgtender_total_query_count",
		"pgtender_total_received",
		"pgtender_total_sent",
		"pgtender_total_wait_time",
		"pgtender_total_server_connections",
		"pgtender_checkout_wait_seconds", // histogram
		"pgtender_clients",
		// Postgres servers, label server.
		"pgtender_server_reachable",
		// Clients, label timeout.
		"pgtender_client_timeouts_total",
	}
}

// histogramMetrics are the families of referencedMetrics whose series carry the _bucket, _sum
// and _count suffixes.
var histogramMetrics = []string{"pgtender_login_duration_seconds", "pgtender_checkout_wait_seconds"}

// familyName maps a series name to its metric family: a histogram's _bucket, _sum and _count
// series to the histogram. Only known histograms are trimmed, since pgtender_total_xact_count
// is a family of its own.
func familyName(series string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(series, suffix); ok && slices.Contains(histogramMetrics, base) {
			return base
		}
	}
	return series
}

// ---------------------------------------------------------------------------------------------
// promtool

func TestPromtoolCheckRules(t *testing.T) {
	out := promtool(t, "check", "rules", rulesPath)
	t.Logf("promtool check rules %s:\n%s", rulesPath, out)
}

func TestPromtoolTestRules(t *testing.T) {
	out := promtool(t, "test", "rules", rulesTestPath)
	t.Logf("promtool test rules %s:\n%s", rulesTestPath, out)
}

// promtool runs promtool with args in the package directory and returns its combined output,
// failing the test if promtool is missing or exits non-zero.
func promtool(t *testing.T, args ...string) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not installed (%v): it comes with Debian's prometheus package "+
			"(apt-get install --no-install-recommends prometheus), which .ci/run installs", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), promtoolBudget)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// ---------------------------------------------------------------------------------------------
// Alert rules: structure and test coverage

func TestAlertRulesAreDocumentedAndTested(t *testing.T) {
	rules := readRules(t, rulesPath)
	cases := readAlertTestCases(t, rulesTestPath)
	severity := regexp.MustCompile(`(?m)^\s+severity:\s*(\S+)\s*$`)
	var alerts int
	for _, r := range rules {
		if r.kind != "alert" {
			continue
		}
		alerts++
		body := withoutComments(r.block)
		if m := severity.FindStringSubmatch(body); m == nil {
			t.Errorf("%s:%d: alert %s has no severity label", rulesPath, r.line, r.name)
		} else if s := strings.Trim(m[1], `"'`); s != "warning" && s != "critical" {
			t.Errorf("%s:%d: alert %s has severity %q, want warning or critical", rulesPath, r.line, r.name, s)
		}
		for _, key := range []string{"summary", "description"} {
			if !regexp.MustCompile(`(?m)^\s+` + key + `:\s*\S`).MatchString(body) {
				t.Errorf("%s:%d: alert %s has no %s annotation", rulesPath, r.line, r.name, key)
			}
		}
		c := cases[r.name]
		if c.firing == 0 {
			t.Errorf("%s: no case where alert %s fires (an alert_rule_test with exp_alerts)", rulesTestPath, r.name)
		}
		if c.silent == 0 {
			t.Errorf("%s: no case where alert %s does not fire (exp_alerts: [])", rulesTestPath, r.name)
		}
		delete(cases, r.name)
	}
	if alerts == 0 {
		t.Fatalf("%s: no alert rules found", rulesPath)
	}
	for name := range cases {
		t.Errorf("%s tests alert %s, which %s does not define", rulesTestPath, name, rulesPath)
	}
}

type alertCases struct{ firing, silent int }

// readAlertTestCases counts, per alert name, the alert_rule_test entries of a promtool test
// file that expect it to fire (exp_alerts with entries) and not to fire (exp_alerts: [] or
// no exp_alerts at all).
func readAlertTestCases(t *testing.T, path string) map[string]alertCases {
	t.Helper()
	lines := readLines(t, path)
	cases := map[string]alertCases{}
	alertname := regexp.MustCompile(`^\s*(?:-\s+)?alertname:\s*["']?(\w+)["']?\s*$`)
	for i, line := range lines {
		m := alertname.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		c := cases[m[1]]
		fires := false
		// The entry's other keys follow until the next list item at the same or a lower level.
		for _, next := range lines[i+1:] {
			trimmed := strings.TrimSpace(next)
			if strings.HasPrefix(trimmed, "- eval_time:") || strings.HasPrefix(trimmed, "- alertname:") ||
				strings.HasPrefix(trimmed, "- name:") || strings.HasPrefix(trimmed, "- interval:") {
				break
			}
			if strings.HasPrefix(trimmed, "- exp_labels:") {
				fires = true
				break
			}
		}
		if fires {
			c.firing++
		} else {
			c.silent++
		}
		cases[m[1]] = c
	}
	return cases
}

// ---------------------------------------------------------------------------------------------
// Dashboard

type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID          int                      `json:"id"`
	Type        string                   `json:"type"`
	Title       string                   `json:"title"`
	Description string                   `json:"description"`
	Datasource  *datasourceRef           `json:"datasource"`
	GridPos     struct{ H, W, X, Y int } `json:"gridPos"`
	Targets     []struct {
		Expr       string         `json:"expr"`
		RefID      string         `json:"refId"`
		Datasource *datasourceRef `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's panels
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"` // a string, or {"query": "..."} in newer Grafana
	Datasource *datasourceRef  `json:"datasource"`
}

// query returns the variable's query text in either of Grafana's encodings.
func (v variable) query() (string, error) {
	var s string
	if err := json.Unmarshal(v.Query, &s); err == nil {
		return s, nil
	}
	var o struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(v.Query, &o); err != nil {
		return "", fmt.Errorf("variable %s: query is neither a string nor {\"query\": ...}: %w", v.Name, err)
	}
	return o.Query, nil
}

// wantPanels are the panels the dashboard must keep (issue 5, "Dashboard and alerts").
var wantPanels = []string{
	"Logins per second by result",
	"Login duration p50 and p99 by phase",
	"Logins in flight",
	"Abandoned logins per second by stage",
	"Accept queue length against capacity per listening socket",
	"Listen overflows and drops per second (network namespace)",
	"Conntrack drops per second (network namespace)",
	"Waiting clients and max wait by pool",
	"Checkout wait p99 by pool",
	"Server connections by state",
	"Clients",
}

const datasourceVar = "${datasource}"

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(data) {
		var syntax *json.SyntaxError
		err := json.Unmarshal(data, new(any))
		if errors.As(err, &syntax) {
			line := 1 + strings.Count(string(data[:syntax.Offset]), "\n")
			t.Fatalf("%s:%d: invalid JSON: %v", dashboardPath, line, err)
		}
		t.Fatalf("%s: invalid JSON: %v", dashboardPath, err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// allPanels flattens rows: a collapsed row keeps its panels inside it.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

func TestDashboard(t *testing.T) {
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q, title %q: want both set", d.UID, d.Title)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: want 36 or later (written for 39)", d.SchemaVersion)
	}

	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		t.Errorf("want a variable datasource of type datasource and query prometheus, got %+v", v)
	}
	for _, name := range []string{"instance", "database"} {
		v, ok := vars[name]
		if !ok {
			t.Errorf("no %s variable", name)
			continue
		}
		q, err := v.query()
		if err != nil {
			t.Error(err)
		}
		if v.Type != "query" || v.Datasource == nil || v.Datasource.UID != datasourceVar ||
			!strings.Contains(q, ", "+name+")") {
			t.Errorf("variable %s: want a query variable over %s listing label %s, got type %q query %q",
				name, datasourceVar, name, v.Type, q)
		}
	}

	ids := map[int]string{}
	titles := map[string]bool{}
	panels := allPanels(d.Panels)
	for _, p := range panels {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if other, dup := ids[p.ID]; dup {
			t.Errorf("%s: id also used by %q", where, other)
		}
		ids[p.ID] = p.Title
		if p.Title == "" {
			t.Errorf("%s: no title", where)
		}
		if titles[p.Title] {
			t.Errorf("%s: title used twice", where)
		}
		titles[p.Title] = true
		if p.Type == "row" {
			continue
		}
		// Every panel says what it shows and what a bad value means.
		if len(p.Description) < 80 || !strings.Contains(p.Description, "Bad:") {
			t.Errorf("%s: the description must say what the panel shows and, after \"Bad:\", what a bad value means", where)
		}
		if p.Datasource == nil || p.Datasource.UID != datasourceVar {
			t.Errorf("%s: datasource must be %s", where, datasourceVar)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no queries", where)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s: query %s is empty", where, tg.RefID)
			}
			if tg.Datasource == nil || tg.Datasource.UID != datasourceVar {
				t.Errorf("%s: query %s: datasource must be %s", where, tg.RefID, datasourceVar)
			}
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("%s: query refId %q missing or repeated", where, tg.RefID)
			}
			refs[tg.RefID] = true
		}
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("%s: gridPos %+v outside the 24-column grid", where, p.GridPos)
		}
	}
	for _, want := range wantPanels {
		if !titles[want] {
			t.Errorf("no panel titled %q", want)
		}
	}
	// Panels at the top level must not overlap (Grafana would shuffle them on load).
	for i, a := range d.Panels {
		for _, b := range d.Panels[i+1:] {
			ag, bg := a.GridPos, b.GridPos
			if ag.X < bg.X+bg.W && bg.X < ag.X+ag.W && ag.Y < bg.Y+bg.H && bg.Y < ag.Y+ag.H {
				t.Errorf("panels %q and %q overlap: %+v and %+v", a.Title, b.Title, ag, bg)
			}
		}
	}
}

// TestDashboardQueriesParse hands every dashboard query to promtool as a recording rule, so
// PromQL syntax errors in the dashboard are caught here rather than as empty panels.
func TestDashboardQueriesParse(t *testing.T) {
	exprs := dashboardExprs(t)
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		q, err := json.Marshal(e.expr) // a JSON string is a valid YAML double-quoted scalar
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "      - record: dashboard:query:%d\n        expr: %s\n", i, q)
	}
	file := filepath.Join(t.TempDir(), "dashboard_rules.yml")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out := promtool(t, "check", "rules", file)
	if !strings.Contains(out, fmt.Sprintf("%d rules found", len(exprs))) {
		t.Errorf("promtool did not check all %d dashboard queries:\n%s", len(exprs), out)
	}
}

type located struct {
	where string // file and panel, variable or rule
	expr  string
}

// grafanaVars replaces the dashboard's template variables with values that make a query
// plain PromQL.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "1m", "$__interval", "1m", "$__range", "1h",
	"$instance", ".*", "$database", ".*",
)

var labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.*?)\s*,\s*\w+\s*\)\s*$`)

// dashboardExprs returns every PromQL expression of the dashboard with its variables
// substituted: panel queries, and the series selectors of label_values() variables.
func dashboardExprs(t *testing.T) []located {
	t.Helper()
	d := readDashboard(t)
	var out []located
	add := func(where, expr string) {
		e := grafanaVars.Replace(expr)
		if strings.Contains(e, "$") {
			t.Errorf("%s: %s: unknown template variable in %q", dashboardPath, where, expr)
		}
		out = append(out, located{dashboardPath + ": " + where, e})
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, err := v.query()
		if err != nil {
			t.Fatal(err)
		}
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("%s: variable %s: want label_values(selector, label), got %q", dashboardPath, v.Name, q)
			continue
		}
		add("variable "+v.Name, m[1])
	}
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			add(fmt.Sprintf("panel %q query %s", p.Title, tg.RefID), tg.Expr)
		}
	}
	return out
}

// ---------------------------------------------------------------------------------------------
// Metric names

func TestReferencedMetrics(t *testing.T) {
	known := referencedMetrics()
	if s := slices.Sorted(slices.Values(known)); len(slices.Compact(s)) != len(known) {
		t.Fatalf("referencedMetrics lists a name twice: %v", known)
	}
	exprs := dashboardExprs(t)
	for _, r := range readRules(t, rulesPath) {
		exprs = append(exprs, located{fmt.Sprintf("%s:%d: %s %s", rulesPath, r.line, r.kind, r.name), r.expr})
	}

	used := map[string][]string{} // family -> where
	for _, e := range exprs {
		names, err := metricNames(e.expr)
		if err != nil {
			t.Errorf("%s: %v", e.where, err)
		}
		for _, name := range names {
			family := familyName(name)
			if !slices.Contains(known, family) {
				t.Errorf("%s: metric %s is not one pgtender exports (referencedMetrics, DESIGN.md \"Observability\")", e.where, name)
				continue
			}
			used[family] = append(used[family], e.where)
		}
	}
	for _, name := range known {
		if len(used[name]) == 0 {
			t.Errorf("referencedMetrics lists %s, but neither the dashboard nor the rules use it: "+
				"use it or take it off the list", name)
		}
	}
	var report strings.Builder
	for _, name := range slices.Sorted(maps.Keys(used)) {
		fmt.Fprintf(&report, "  %-36s %d expressions\n", name, len(used[name]))
	}
	t.Logf("metrics referenced by %s and %s:\n%s", dashboardPath, rulesPath, report.String())

	// The rule tests must feed the rules series with names pgtender really exports, or they
	// prove nothing.
	series := regexp.MustCompile(`^\s*-?\s*series:\s*['"]?([a-zA-Z_:][a-zA-Z0-9_:]*)`)
	for i, line := range readLines(t, rulesTestPath) {
		if m := series.FindStringSubmatch(line); m != nil && !slices.Contains(known, familyName(m[1])) {
			t.Errorf("%s:%d: input series %s is not a metric pgtender exports", rulesTestPath, i+1, m[1])
		}
	}
}

var (
	promqlStrings  = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promqlMatchers = regexp.MustCompile(`\{[^{}]*\}`)
	promqlRanges   = regexp.MustCompile(`\[[^\[\]]*\]`)
	promqlGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	promqlNumbers  = regexp.MustCompile(`(?i)\b(?:0x[0-9a-f]+|\d+(?:\.\d*)?(?:e[+-]?\d+)?(?:ms|[smhdwy])?)\b|\.\d+`)
	promqlIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	metricInString = regexp.MustCompile(`\b` + metricPrefix + `[a-zA-Z0-9_:]*`)
)

// promqlWords are PromQL's keywords and aggregation operators: identifiers that are neither
// functions (followed by "(") nor metric names.
var promqlWords = []string{
	"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
	"bool", "offset", "atan2", "inf", "nan",
	"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk",
	"quantile", "count_values",
}

// metricNames returns the metric names an expression selects. It is a small lexer, not a
// parser: strings, label matchers, ranges, grouping labels and numbers are removed, and every
// identifier left that is not a function call, keyword or aggregation is a metric name. A name
// in a {__name__="..."} matcher is found by its pgtender_ prefix. Anything else is an error,
// so a non-pgtender metric (up, ALERTS) cannot slip into the dashboard or the rules.
func metricNames(expr string) ([]string, error) {
	var names []string
	for _, m := range promqlMatchers.FindAllString(expr, -1) {
		names = append(names, metricInString.FindAllString(m, -1)...)
	}
	s := promqlStrings.ReplaceAllString(expr, `""`)
	s = promqlMatchers.ReplaceAllString(s, " ")
	s = promqlRanges.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, "$1 ")
	s = promqlNumbers.ReplaceAllString(s, " ")
	var errs []error
	for _, m := range promqlIdent.FindAllStringSubmatch(s, -1) {
		word, call := strings.TrimRight(m[0], " \t\n("), m[1] != ""
		switch {
		case call, slices.Contains(promqlWords, strings.ToLower(word)):
		case strings.HasPrefix(word, metricPrefix):
			names = append(names, word)
		default:
			errs = append(errs, fmt.Errorf("metric %s does not have pgtender's prefix %s", word, metricPrefix))
		}
	}
	if len(names) == 0 {
		errs = append(errs, fmt.Errorf("no metric found in %q", expr))
	}
	return names, errors.Join(errs...)
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr    string
		want    []string
		wantErr bool
	}{
		{`rate(pgtender_logins_total{result=~"shed|rejected"}[5m]) > 0`, []string{"pgtender_logins_total"}, false},
		{`histogram_quantile(0.99, sum by (job, le) (rate(pgtender_login_duration_seconds_bucket{phase="total"}[5m]))) > 1`,
			[]string{"pgtender_login_duration_seconds_bucket"}, false},
		{`pgtender_listen_queue_length / pgtender_listen_queue_capacity > 0.8`,
			[]string{"pgtender_listen_queue_length", "pgtender_listen_queue_capacity"}, false},
		{`sum without (instance) (pgtender_cl_waiting offset 5m) > 1e3`, []string{"pgtender_cl_waiting"}, false},
		{`count({__name__="pgtender_clients", job="x"})`, []string{"pgtender_clients"}, false},
		{`up == 0`, nil, true},
		{`pgtender_clients and on (instance) up`, []string{"pgtender_clients"}, true},
	} {
		got, err := metricNames(tc.expr)
		if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %v, %v; want %v, error %v", tc.expr, got, err, tc.want, tc.wantErr)
		}
	}
	for series, want := range map[string]string{
		"pgtender_login_duration_seconds_bucket": "pgtender_login_duration_seconds",
		"pgtender_checkout_wait_seconds_count":   "pgtender_checkout_wait_seconds",
		"pgtender_total_xact_count":              "pgtender_total_xact_count",
		"pgtender_logins_total":                  "pgtender_logins_total",
	} {
		if got := familyName(series); got != want {
			t.Errorf("familyName(%s) = %s, want %s", series, got, want)
		}
	}
}

// ---------------------------------------------------------------------------------------------
// A reader for the subset of YAML the rules file uses

type rule struct {
	kind  string // "alert" or "record"
	name  string
	line  int    // of the "- alert:" or "- record:" line
	expr  string // the PromQL expression
	block string // the rule's lines, up to the next rule or group
}

var (
	ruleStart = regexp.MustCompile(`^\s*-\s+(alert|record):\s*["']?([\w:]+)["']?\s*$`)
	groupLine = regexp.MustCompile(`^\s*-\s+name:`)
	exprLine  = regexp.MustCompile(`^(\s*)expr:\s*(.*?)\s*$`)
)

// readRules reads the rules of a Prometheus rules file without a YAML library (the module has
// none, and this package adds no dependency): each "- alert:" or "- record:" item, its expr as
// an inline scalar (plain or quoted) or a block scalar (| or >), and its lines. promtool
// validates the file as real YAML; this only has to find the expressions, and it fails if
// it finds a different number of expressions than rules.
func readRules(t *testing.T, path string) []rule {
	t.Helper()
	lines := readLines(t, path)
	var rules []rule
	exprs := 0
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if m := ruleStart.FindStringSubmatch(line); m != nil {
			rules = append(rules, rule{kind: m[1], name: m[2], line: i + 1})
		} else if groupLine.MatchString(line) && len(rules) > 0 {
			rules[len(rules)-1].block += "\n" // a group ends the previous rule's block
		}
		if len(rules) == 0 {
			continue
		}
		r := &rules[len(rules)-1]
		r.block += line + "\n"
		m := exprLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		exprs++
		indent, value := len(m[1]), m[2]
		switch {
		case strings.HasPrefix(value, "|") || strings.HasPrefix(value, ">"):
			var body []string
			for i+1 < len(lines) {
				next := lines[i+1]
				if strings.TrimSpace(next) != "" && len(next)-len(strings.TrimLeft(next, " ")) <= indent {
					break
				}
				i++
				r.block += next + "\n"
				body = append(body, strings.TrimSpace(next))
			}
			r.expr = strings.TrimSpace(strings.Join(body, "\n"))
		case strings.HasPrefix(value, `"`):
			s, err := strconv.Unquote(value)
			if err != nil {
				t.Fatalf("%s:%d: expr: %v", path, i+1, err)
			}
			r.expr = s
		case strings.HasPrefix(value, "'"):
			r.expr = strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(value, "'"), "'"), "''", "'")
		default:
			r.expr = value
		}
		if r.expr == "" {
			t.Fatalf("%s:%d: empty expr", path, i+1)
		}
	}
	if exprs != len(rules) {
		t.Fatalf("%s: found %d rules but %d expressions; keep one expr per rule, inline or as a block scalar", path, len(rules), exprs)
	}
	return rules
}

func withoutComments(block string) string {
	var out []string
	for line := range strings.SplitSeq(block, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return lines
}
