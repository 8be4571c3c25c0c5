package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// rulesFile is the alert rules file the dashboard and the rules tests in
// deploy/ check; TestPrometheusAlertsOnRealScrape loads it unchanged.
const rulesFile = "../deploy/prometheus/alerts.yml"

// TestPrometheusAlertsOnRealScrape proves deploy/prometheus/alerts.yml
// against a real scrape, not only promtool's synthetic series: a real
// Prometheus (Debian's prometheus package, the one that ships promtool)
// scrapes the pgtender binary every second and evaluates the rules file,
// unchanged, every second. Then:
//
//  1. pgtender is frozen (SIGSTOP) while a bounded wave of clients connects
//     to its single listening socket, listen_backlog = 8, so the kernel
//     counts accept-queue overflows; then it runs again (SIGCONT). The
//     alert on listen_overflows_total has no "for", so it must fire.
//  2. A burst of abandoned logins (connect, half a startup packet, close)
//     raises logins_abandoned_total{stage="startup"} above the rule's 1/s
//     over 5m. That alert has "for: 2m", longer than a test should run, so
//     it must be pending (or firing); the rule is not shortened for the
//     test.
//
// Through Prometheus's HTTP API the test also checks that every rule of the
// file is loaded and evaluates without error, that the target's up series
// is 1 again after the freeze, and that the conntrack series are in
// Prometheus exactly when the kernel has /proc/net/stat/nf_conntrack.
// Everything listens on loopback; both processes are killed at the end.
func TestPrometheusAlertsOnRealScrape(t *testing.T) {
	promBinary, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus is not installed (%v): it comes with Debian's prometheus package "+
			"(apt-get install --no-install-recommends prometheus), which .ci/run installs for promtool", err)
	}
	if _, err := os.Stat("/proc/net/netstat"); err != nil {
		t.Skipf("kernel listen counters unavailable here (%v): the overflow alert cannot be driven", err)
	}
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	alertNames := alertNamesIn(t, rules)
	start := time.Now()
	since := func() string { return time.Since(start).Round(10 * time.Millisecond).String() }

	// pgtender: one accept loop on one socket with a small backlog, so a
	// few dozen connects overflow it while it is frozen.
	const backlog = 8
	metricsPort := freePort(t)
	pr := startProcessWith(t, processOptions{general: joinLines(metricsGeneral(metricsPort),
		fmt.Sprintf("listen_backlog = %d", backlog), "workers = 1")})

	// Prometheus: scrape and evaluate every second, TSDB in a temporary
	// directory, API on a loopback port.
	dir := t.TempDir()
	config := filepath.Join(dir, "prometheus.yml")
	writeFile(t, config, fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: pgtender
    static_configs:
      - targets: ["127.0.0.1:%d"]
`, rules, metricsPort))
	promAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	promOutput, promExited := startChild(t, exec.Command(promBinary,
		"--config.file="+config,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr,
		"--log.level=warn"))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("prometheus output:\n%s", promOutput.String())
		}
	})
	prom := &promAPI{base: "http://" + promAddr, client: &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{DisableKeepAlives: true},
	}}
	waitFor(t, 30*time.Second, "Prometheus to be ready", promExited, func() bool {
		return prom.ready()
	})
	t.Logf("%s: prometheus ready on %s", since(), promAddr)

	// Every rule of the file loaded and evaluated once without error.
	waitFor(t, 30*time.Second, "every rule of alerts.yml to be loaded and evaluated", promExited, func() bool {
		groups, err := prom.rules()
		if err != nil {
			return false
		}
		health := map[string]string{}
		for _, g := range groups {
			for _, r := range g.Rules {
				if g.File == rules && r.Type == "alerting" {
					health[r.Name] = r.Health
				}
			}
		}
		for _, name := range alertNames {
			if health[name] != "ok" {
				return false
			}
		}
		return len(health) == len(alertNames)
	})
	t.Logf("%s: the %d alert rules of %s loaded, health ok", since(), len(alertNames), rulesFile)

	// A baseline: two scrapes of the overflow counter before the freeze, so
	// the overflows are an increase Prometheus sees, not a starting value.
	waitFor(t, 30*time.Second, "two scrapes of pgtender", promExited, func() bool {
		v, ok := prom.scalar(`count_over_time(` + namespace + `listen_overflows_total{job="pgtender"}[1m])`)
		return ok && v >= 2
	})
	t.Logf("%s: baseline scraped", since())

	// 1. The frozen accept loop. Every wave client gives up after 1.5 s
	// (waveClient in metrics_test.go), so the freeze is bounded.
	const waveClients = 64
	pr.stop(t)
	frozen := true
	defer func() {
		if frozen {
			_ = pr.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	frozenAt := time.Now()
	outcomes := wave(pr.addr, waveClients, 1500*time.Millisecond)
	if err := pr.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	frozen = false
	resumedAt := time.Now()
	t.Logf("%s: pgtender frozen for %v while %d clients connected to a backlog of %d: %v",
		since(), resumedAt.Sub(frozenAt).Round(time.Millisecond), waveClients, backlog, outcomes)

	// 2. Abandoned logins, well above the rule's 1/s over 5m: rate() over a
	// 5m window that holds only these seconds of samples is about their
	// increase divided by 300 s, so it takes more than 300. Some connects
	// are lost to the small accept queue (the client thinks it connected,
	// the kernel dropped its final ACK), so the burst goes on, 50 at a time,
	// until pgtender itself has counted the target.
	const abandonTarget = 450
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	abandonedStartup := func() float64 {
		v, _ := sample(scrape(t, metricsURL), namespace+"logins_abandoned_total", map[string]string{"stage": "startup"})
		return v
	}
	burstDeadline := time.Now().Add(30 * time.Second)
	sent, retried := 0, 0
	for abandonedStartup() < abandonTarget {
		if time.Now().After(burstDeadline) {
			t.Fatalf("pgtender counted %v abandoned logins after %d connections, want %d within 30 s", abandonedStartup(), sent, abandonTarget)
		}
		s, r := abandonLogins(pr.addr, 50, burstDeadline)
		sent, retried = sent+s, retried+r
	}
	burstDone := time.Now()
	t.Logf("%s: %d connections sent half a startup packet and closed in %v (%d connects given up after 300 ms and made again); pgtender counted %v abandoned in stage startup",
		since(), sent, burstDone.Sub(resumedAt).Round(time.Millisecond), retried, abandonedStartup())

	// The alerts, as Prometheus reports them.
	want := map[string]func(promAlert) bool{
		"PgtenderListenOverflows": func(a promAlert) bool { return a.State == "firing" || a.State == "pending" },
		"PgtenderLoginsAbandoned": func(a promAlert) bool {
			return a.Labels["stage"] == "startup" && (a.State == "pending" || a.State == "firing")
		},
	}
	seen := map[string]promAlert{}
	seenAt := map[string]time.Duration{}
	var last []promAlert
	waitFor(t, 30*time.Second, "PgtenderListenOverflows and PgtenderLoginsAbandoned{stage=startup} to go pending or firing", promExited, func() bool {
		alerts, err := prom.alerts()
		if err != nil {
			return false
		}
		last = alerts
		for _, a := range alerts {
			name := a.Labels["alertname"]
			if match, ok := want[name]; ok && match(a) {
				if _, done := seen[name]; !done {
					seenAt[name] = time.Since(resumedAt)
				}
				seen[name] = a
			}
		}
		return len(seen) == len(want)
	})
	for _, name := range slices.Sorted(maps.Keys(seen)) {
		a := seen[name]
		t.Logf("%s: alert %s %s (value %s, labels %v): active %v after SIGCONT (Prometheus's activeAt), seen by the test %v after SIGCONT; summary: %s",
			since(), name, a.State, a.Value, a.Labels, a.ActiveAt.Sub(resumedAt).Round(10*time.Millisecond),
			seenAt[name].Round(10*time.Millisecond), a.Annotations["summary"])
	}
	// The overflow alert has no "for": once Prometheus has seen the
	// increase it fires at its next evaluation, it is never only pending.
	// The wait matters only if the first poll caught it pending.
	waitFor(t, 10*time.Second, "PgtenderListenOverflows to fire", promExited, func() bool {
		alerts, err := prom.alerts()
		if err != nil {
			return false
		}
		last = alerts
		for _, a := range alerts {
			if a.Labels["alertname"] == "PgtenderListenOverflows" && a.State == "firing" {
				return true
			}
		}
		return false
	})
	for _, a := range last {
		t.Logf("%s: active alert %s{%s} %s since %s, value %s", since(), a.Labels["alertname"], a.Labels["stage"],
			a.State, a.ActiveAt.Format(time.TimeOnly), a.Value)
	}

	// The target is up again after the freeze; the freeze itself shows as
	// failed scrapes (logged, not asserted: it may fall between two).
	waitFor(t, 10*time.Second, `up{job="pgtender"} to be 1`, promExited, func() bool {
		v, ok := prom.scalar(`up{job="pgtender"}`)
		return ok && v == 1
	})
	minUp, _ := prom.scalar(`min_over_time(up{job="pgtender"}[1m])`)
	overflows, _ := prom.scalar(`increase(` + namespace + `listen_overflows_total{job="pgtender"}[1m])`)
	abandoned, _ := prom.scalar(`sum(` + namespace + `logins_abandoned_total{job="pgtender",stage="startup"})`)
	t.Logf("%s: up = 1; lowest up over the last minute %v; listen_overflows_total increase over 1m %.0f; logins_abandoned_total{stage=startup} %.0f",
		since(), minUp, overflows, abandoned)

	// The conntrack counters: in Prometheus exactly when the kernel has them.
	_, statErr := os.Stat("/proc/net/stat/nf_conntrack")
	count, ok := prom.scalar(`count({__name__=~"` + namespace + `conntrack_.*_total", job="pgtender"})`)
	switch {
	case statErr == nil && (!ok || count != 3):
		t.Errorf("this machine has /proc/net/stat/nf_conntrack, but Prometheus holds %v conntrack series of pgtender, want 3", count)
	case errors.Is(statErr, fs.ErrNotExist) && ok:
		t.Errorf("this machine has no /proc/net/stat/nf_conntrack, but Prometheus holds %v conntrack series of pgtender, want none", count)
	default:
		t.Logf("%s: /proc/net/stat/nf_conntrack: %v; conntrack series in Prometheus: %v", since(), statErr, count)
	}

	// No rule broke on the real series.
	groups, err := prom.rules()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Health != "ok" || r.LastError != "" {
				t.Errorf("rule %s (group %s): health %q, last error %q", r.Name, g.Name, r.Health, r.LastError)
			}
		}
	}
}

// alertNamesIn returns the names of the alerting rules of a rules file.
func alertNamesIn(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^\s*-\s+alert:\s*(\w+)\s*$`).FindAllStringSubmatch(string(data), -1) {
		names = append(names, m[1])
	}
	if len(names) == 0 {
		t.Fatalf("%s: no alerting rules", path)
	}
	return names
}

// abandonLogins opens n connections one after the other, each sending
// three bytes of a startup packet's length word and closing: a login that
// started (its first byte arrived) and was abandoned in stage startup. The
// accept queue is small (listen_backlog = 8), and on a busy machine it
// fills whenever pgtender's accept loop is not scheduled for a moment; the
// kernel then drops the SYN and the client would retransmit it only after
// a second. So each connect is given up after 300 ms and made again, at
// most until deadline. It returns how many were sent and how many connects
// were given up or failed.
func abandonLogins(addr string, n int, deadline time.Time) (sent, retried int) {
	for sent < n && time.Now().Before(deadline) {
		conn, err := net.DialTimeout("tcp", addr, 300*time.Millisecond)
		if err != nil {
			retried++
			continue
		}
		if _, err := conn.Write([]byte{0, 0, 0}); err == nil {
			sent++
		}
		conn.Close()
	}
	return sent, retried
}

// waitFor is eventually, polling every 100 ms (each poll is an HTTP round
// trip), that also fails at once if the process whose exit closes exited
// has exited.
func waitFor(t *testing.T, timeout time.Duration, what string, exited <-chan struct{}, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		select {
		case <-exited:
			t.Fatalf("prometheus exited while waiting for %s", what)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// promAPI is a client of the few endpoints of Prometheus's HTTP API the
// test reads (https://prometheus.io/docs/prometheus/latest/querying/api/).
type promAPI struct {
	base   string
	client *http.Client
}

type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"` // pending or firing
	ActiveAt    time.Time         `json:"activeAt"`
	Value       string            `json:"value"`
}

type promRuleGroup struct {
	Name  string `json:"name"`
	File  string `json:"file"`
	Rules []struct {
		Name      string `json:"name"`
		Type      string `json:"type"`   // alerting or recording
		Health    string `json:"health"` // ok, err or unknown (not evaluated yet)
		LastError string `json:"lastError"`
	} `json:"rules"`
}

// ready reports whether /-/ready answers 200.
func (p *promAPI) ready() bool {
	resp, err := p.client.Get(p.base + "/-/ready")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// get fetches an API path and decodes the data of a successful answer
// into out.
func (p *promAPI) get(path string, query url.Values, out any) error {
	u := p.base + path
	if query != nil {
		u += "?" + query.Encode()
	}
	resp, err := p.client.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var envelope struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&envelope); err != nil {
		return fmt.Errorf("GET %s: %s: %w", path, resp.Status, err)
	}
	if envelope.Status != "success" {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, envelope.Error)
	}
	return json.Unmarshal(envelope.Data, out)
}

func (p *promAPI) alerts() ([]promAlert, error) {
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	err := p.get("/api/v1/alerts", nil, &data)
	return data.Alerts, err
}

func (p *promAPI) rules() ([]promRuleGroup, error) {
	var data struct {
		Groups []promRuleGroup `json:"groups"`
	}
	err := p.get("/api/v1/rules", nil, &data)
	return data.Groups, err
}

// scalar runs an instant query and returns the value of its only series;
// ok is false when the query fails or does not give exactly one series.
func (p *promAPI) scalar(query string) (float64, bool) {
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Value [2]json.RawMessage `json:"value"` // [unix time, "value"]
		} `json:"result"`
	}
	if err := p.get("/api/v1/query", url.Values{"query": {query}}, &data); err != nil {
		return 0, false
	}
	if data.ResultType != "vector" || len(data.Result) != 1 {
		return 0, false
	}
	var s string
	if err := json.Unmarshal(data.Result[0].Value[1], &s); err != nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	return v, err == nil
}
