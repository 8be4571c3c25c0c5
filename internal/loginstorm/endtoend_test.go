package loginstorm

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

// runAgainst parses args, points them at server, runs, and waits until the
// server has accounted for every login that reached it.
func runAgainst(t *testing.T, server *fakeServer, args ...string) Summary {
	t.Helper()
	var stderr bytes.Buffer
	cfg, err := ParseArgs(append([]string{"-addr", server.address(), "-password", "secret", "-progress", "never"}, args...), &stderr)
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	before := server.ended()
	summary, err := Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	reached := before + summary.Planned - summary.Failed[ClassSkipped] - summary.Failed[ClassConnect]
	if summary.Held != nil {
		reached += int64(summary.Held.Opened)
	}
	waitFor(t, "the server to account for every login", func() bool { return server.ended() == reached })
	return summary
}

func TestLoginMethodsClosedLoop(t *testing.T) {
	for _, method := range []string{"cleartext", "md5", "scram"} {
		t.Run(method, func(t *testing.T) {
			server := startFakeServer(t, method, "secret")
			summary := runAgainst(t, server, "-c", "4", "-n", "40")
			results, abandoned, queries := server.snapshot()
			if summary.Planned != 40 || summary.OnTime != 40 || !summary.Gate.Met {
				t.Fatalf("planned %d on time %d gate %+v examples %v", summary.Planned, summary.OnTime, summary.Gate, summary.Examples)
			}
			if results["ok"] != 40 || queries != 40 || len(abandoned) != 0 {
				t.Fatalf("server saw %v, %d queries, abandoned %v", results, queries, abandoned)
			}
			if summary.Latency.P50 <= 0 || summary.Latency.Max < summary.Latency.P99 {
				t.Fatalf("latency %+v", summary.Latency)
			}
		})
	}
}

func TestOpenLoopWrongPasswordsMatchServer(t *testing.T) {
	server := startFakeServer(t, "scram", "secret")
	summary := runAgainst(t, server, "-rate", "400", "-n", "120", "-wrong", "0.25", "-user", "a,b", "-database", "x,y")
	results, _, _ := server.snapshot()
	if summary.Planned != 120 || summary.WrongRefused == 0 || summary.OnTime == 0 {
		t.Fatalf("summary %+v", summary)
	}
	if results["auth_failed"] != summary.WrongRefused || results["ok"] != summary.OnTime || summary.OnTime+summary.WrongRefused != 120 {
		t.Fatalf("server %v, generator on time %d wrong refused %d", results, summary.OnTime, summary.WrongRefused)
	}
	if summary.RefusedBySQL["28P01"] != summary.WrongRefused || !summary.Gate.Met {
		t.Fatalf("refusals %v gate %+v", summary.RefusedBySQL, summary.Gate)
	}
	if refusals := summary.RefusalLatency; refusals.Count != summary.WrongRefused || refusals.P50 <= 0 || refusals.P50 >= 5 {
		t.Fatalf("refusal latency %+v of %d wrong passwords refused", refusals, summary.WrongRefused)
	}
	if summary.Dispatch == nil {
		t.Fatal("open loop without dispatch stats")
	}
}

func TestRefusedWith53300(t *testing.T) {
	server := startFakeServer(t, "cleartext", "secret")
	server.refuse.Store(true)
	server.refuseDelay.Store(int64(20 * time.Millisecond))
	metricsURL := startMetrics(t, server, "")
	summary := runAgainst(t, server, "-c", "2", "-n", "10", "-deadline", "2s", "-metrics", metricsURL)
	results, _, _ := server.snapshot()
	if summary.Failed[ClassRefused] != 10 || summary.RefusedBySQL["53300"] != 10 || results["shed"] != 10 || summary.Gate.Met {
		t.Fatalf("summary %+v server %v", summary, results)
	}
	// Each refusal took at least the server's delay, connect included, and
	// far less than the deadline.
	refusals := summary.RefusalLatency
	if refusals.Count != 10 || refusals.P50 < 0.02 || refusals.P50 >= 2 || refusals.Max < refusals.P99 || refusals.P99 < refusals.P50 {
		t.Fatalf("refusal latency %+v", refusals)
	}
	if summary.RefusalsWithinTarget > 10 || summary.Latency != (LatencySummary{}) {
		t.Fatalf("within 100ms %d, completed latency %+v", summary.RefusalsWithinTarget, summary.Latency)
	}
	// Every refused client read its error: the shed count is exact.
	for _, row := range summary.Reconciliation {
		if !row.Match || row.ServerMin != row.ServerMax {
			t.Errorf("row %+v: want an exact match", row)
		}
	}

	// Refusals slower than the target are counted as such.
	server.refuseDelay.Store(int64(150 * time.Millisecond))
	summary = runAgainst(t, server, "-c", "2", "-n", "4", "-deadline", "2s")
	if summary.RefusalLatency.Count != 4 || summary.RefusalsWithinTarget != 0 || summary.RefusalLatency.P50 < 0.15 || summary.RefusalLatency.P50 >= 2 {
		t.Fatalf("slow refusals: %+v, %d within 100ms", summary.RefusalLatency, summary.RefusalsWithinTarget)
	}
}

func TestStallTimesOutAtDeadline(t *testing.T) {
	server := startFakeServer(t, "md5", "secret")
	server.stall.Store(true)
	start := time.Now()
	summary := runAgainst(t, server, "-c", "3", "-n", "3", "-deadline", "200ms")
	if elapsed := time.Since(start); elapsed > 3*time.Second {
		t.Errorf("3 stalled logins with a 200ms deadline took %s", elapsed)
	}
	_, abandoned, _ := server.snapshot()
	if summary.Failed[ClassTimeout] != 3 || summary.TimeoutStage[StageAuth] != 3 || abandoned["auth"] != 3 {
		t.Fatalf("summary %+v server abandoned %v", summary, abandoned)
	}
	if summary.Unanswered[ReachSent] != 3 {
		t.Fatalf("unanswered %v, want 3 that heard nothing", summary.Unanswered)
	}
}

func TestTimeoutsReconcileByReach(t *testing.T) {
	for _, test := range []struct {
		name  string
		stall func(*fakeServer)
		reach Reach
		// the rows that are ranges: those the timeouts may be in, unless
		// the server's other counts pin them down
		ranged []string
	}{
		{"before the first byte", func(s *fakeServer) { s.stall.Store(true) }, ReachSent,
			[]string{`logins_total{result=~"shed|rejected|error"}`, `logins_total{result="shed"}`, `logins_abandoned_total{stage="startup"}`, "all logins ended (results + abandoned)"}},
		{"after the password", func(s *fakeServer) { s.stallReady.Store(true) }, ReachPassword,
			[]string{`logins_total{result="ok"}`, `logins_total{result="auth_failed"}`, `logins_total{result=~"shed|rejected|error"}`, `logins_abandoned_total{stage="auth"}`}},
	} {
		t.Run(test.name, func(t *testing.T) {
			server := startFakeServer(t, "scram", "secret")
			test.stall(server)
			metricsURL := startMetrics(t, server, "")
			summary := runAgainst(t, server, "-c", "3", "-n", "3", "-deadline", "200ms", "-metrics", metricsURL)
			if summary.Failed[ClassTimeout] != 3 || summary.Unanswered[test.reach] != 3 {
				t.Fatalf("timeouts %d unanswered %v, want 3 at %q", summary.Failed[ClassTimeout], summary.Unanswered, test.reach)
			}
			for _, row := range summary.Reconciliation {
				if !row.Match {
					t.Errorf("row %+v does not match", row)
				}
				if ranged := slices.Contains(test.ranged, row.Name); ranged != (row.ServerMin < row.ServerMax) {
					t.Errorf("row %+v: want a range %v", row, ranged)
				}
			}
		})
	}
}

func TestAbandonAtEachStage(t *testing.T) {
	for _, stage := range []string{"startup", "auth", "ready"} {
		t.Run(stage, func(t *testing.T) {
			server := startFakeServer(t, "scram", "secret")
			summary := runAgainst(t, server, "-c", "2", "-n", "6", "-abandon", stage, "-abandon-share", "1")
			results, abandoned, _ := server.snapshot()
			if summary.Abandoned != 6 || summary.AbandonedStage[Stage(stage)] != 6 {
				t.Fatalf("summary %+v", summary)
			}
			// The fake writes AuthenticationOk and ReadyForQuery together,
			// as pgtender does, so a login left at "ready" is an ok login.
			if stage == "ready" {
				if results["ok"] != 6 {
					t.Fatalf("server %v %v", results, abandoned)
				}
			} else if abandoned[stage] != 6 {
				t.Fatalf("server abandoned %v", abandoned)
			}
			if summary.Gate.Denominator != 0 || summary.Gate.Met {
				t.Fatalf("gate %+v: deliberate abandons are not in the denominator", summary.Gate)
			}
		})
	}
}

func TestHoldAndReconcileWithMetrics(t *testing.T) {
	server := startFakeServer(t, "md5", "secret")
	metricsURL := startMetrics(t, server, "pgtender_")
	// Pre-existing counts must be subtracted: log in once before the run.
	runAgainst(t, server, "-c", "1", "-n", "1")
	summary := runAgainst(t, server, "-rate", "300", "-n", "90", "-wrong", "0.2", "-abandon", "auth", "-abandon-share", "0.1",
		"-hold", "5", "-metrics", metricsURL, "-metrics-namespace", "pgtender_")
	if summary.Held == nil || summary.Held.Opened != 5 {
		t.Fatalf("held %+v", summary.Held)
	}
	if len(summary.Reconciliation) == 0 {
		t.Fatal("no reconciliation")
	}
	for _, row := range summary.Reconciliation {
		if !row.Match {
			t.Errorf("reconciliation row %+v does not match", row)
		}
	}
	if ok := summary.Reconciliation[0]; ok.Generator != summary.OnTime+5 || ok.Server != float64(ok.Generator) {
		t.Errorf("ok row %+v, want on time %d + 5 held", ok, summary.OnTime)
	}
	var text bytes.Buffer
	summary.WriteText(&text)
	if !strings.Contains(text.String(), "reconciliation with /metrics") || strings.Contains(text.String(), "MISMATCH") {
		t.Errorf("table:\n%s", text.String())
	}
	// The held connections were closed when the run ended.
	waitFor(t, "held connections to close", func() bool {
		server.mutex.Lock()
		defer server.mutex.Unlock()
		return len(server.open) == 0
	})
}

func TestReconcileDetectsMismatchAndWrongNamespace(t *testing.T) {
	server := startFakeServer(t, "cleartext", "secret")
	metricsURL := startMetrics(t, server, "pgtender_")
	var stderr bytes.Buffer
	cfg, _ := ParseArgs([]string{"-addr", server.address(), "-password", "secret", "-n", "1", "-metrics", metricsURL}, &stderr)
	if _, err := Run(context.Background(), cfg, nil); err == nil || !strings.Contains(err.Error(), "logins_total not found") {
		t.Fatalf("wrong namespace: err %v", err)
	}
	before := LoginCounters{Results: map[string]float64{"ok": 10}}
	after := LoginCounters{Results: map[string]float64{"ok": 12}}
	rows := Reconcile(Summary{Planned: 3, LoggedIn: 3}, 0, before, after)
	if rows[0].Match || rows[len(rows)-1].Match {
		t.Fatalf("3 logins against a change of 2 matched: %+v", rows)
	}
}

func TestMainExitCodesAndJSON(t *testing.T) {
	server := startFakeServer(t, "cleartext", "secret")
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"-bogus"}, &stdout, &stderr); code != ExitUsage {
		t.Errorf("usage error: exit %d", code)
	}
	stdout.Reset()
	code := Main(context.Background(), []string{"-addr", server.address(), "-password", "secret", "-n", "5", "-c", "1", "-json"}, &stdout, &stderr)
	if code != ExitGateMet {
		t.Fatalf("exit %d: %s %s", code, stdout.String(), stderr.String())
	}
	var decoded map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &decoded); err != nil || decoded["planned"] != float64(5) {
		t.Fatalf("json %v: %s", err, stdout.String())
	}
	if refusals, ok := decoded["refusal_latency_seconds"].(map[string]any); !ok || refusals["count"] != float64(0) || decoded["refusals_within_100ms"] != float64(0) {
		t.Fatalf("json refusal latency: %s", stdout.String())
	}
	server.refuse.Store(true)
	stdout.Reset()
	if code := Main(context.Background(), []string{"-addr", server.address(), "-password", "secret", "-n", "5", "-c", "1"}, &stdout, &stderr); code != ExitGateNotMet {
		t.Fatalf("refusing server: exit %d", code)
	}
	waitFor(t, "the server to account for every login", func() bool { return server.ended() == 10 })
}

func TestConnectFailureIsCounted(t *testing.T) {
	server := startFakeServer(t, "cleartext", "secret")
	address := server.address()
	server.close()
	var stderr bytes.Buffer
	cfg, _ := ParseArgs([]string{"-addr", address, "-n", "3", "-c", "1"}, &stderr)
	summary, err := Run(context.Background(), cfg, nil)
	if err != nil || summary.Failed[ClassConnect] != 3 || summary.Gate.Met {
		t.Fatalf("err %v summary %+v", err, summary)
	}
}
