package loginstorm

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	var sorted []time.Duration
	for i := 1; i <= 100; i++ {
		sorted = append(sorted, time.Duration(i)*time.Millisecond)
	}
	for _, test := range []struct {
		quantile float64
		want     time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.95, 95 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}, {0, time.Millisecond}} {
		if got := percentile(sorted, test.quantile); got != test.want {
			t.Errorf("p%v = %s, want %s", test.quantile*100, got, test.want)
		}
	}
	if got := percentile(nil, 0.99); got != 0 {
		t.Errorf("empty p99 = %s", got)
	}
	if got := percentile([]time.Duration{7}, 0.5); got != 7 {
		t.Errorf("single p50 = %s", got)
	}
}

func TestSummaryClassesAndGate(t *testing.T) {
	collector := NewCollector()
	record := func(count int, outcome Outcome) {
		for range count {
			collector.Record(outcome)
		}
	}
	record(90, Outcome{Class: ClassOnTime, Latency: 10 * time.Millisecond, LoggedIn: true})
	record(2, Outcome{Class: ClassLate, Latency: 6 * time.Second, LoggedIn: true})
	record(3, Outcome{Class: ClassRefused, SQLState: "53300", Stage: StageAuth})
	record(4, Outcome{Class: ClassWrongRefused, SQLState: "28P01", Stage: StageAuth})
	record(5, Outcome{Class: ClassAbandoned, Stage: StageAuth})
	record(1, Outcome{Class: ClassTimeout, Stage: StageReady, Message: "i/o timeout"})
	summary := collector.Summarize(2*time.Second, 0.94)
	if summary.Planned != 105 {
		t.Fatalf("planned %d, want 105", summary.Planned)
	}
	if summary.Late != 2 || summary.Failed[ClassRefused] != 3 || summary.Failed[ClassTimeout] != 1 || summary.WrongRefused != 4 || summary.Abandoned != 5 {
		t.Fatalf("classes wrong: %+v", summary)
	}
	if summary.RefusedBySQL["53300"] != 3 || summary.RefusedBySQL["28P01"] != 4 || summary.TimeoutStage[StageReady] != 1 {
		t.Fatalf("by SQLSTATE/stage wrong: %v %v", summary.RefusedBySQL, summary.TimeoutStage)
	}
	// (90 on time + 4 expected refusals) / (105 - 5 abandoned) = 0.94.
	if summary.Gate.Denominator != 100 || summary.Gate.OnTimeShare != 0.94 || !summary.Gate.Met {
		t.Fatalf("gate %+v, want 0.94 of 100, met", summary.Gate)
	}
	if summary.Latency.P50 != 0.01 || summary.Latency.Max != 6 || summary.LoginsPerSec != 46 {
		t.Fatalf("latency %+v rate %v", summary.Latency, summary.LoginsPerSec)
	}
	if summary := collector.Summarize(time.Second, 0.95); summary.Gate.Met {
		t.Fatalf("gate 0.95 met with 0.94")
	}
	if empty := NewCollector().Summarize(time.Second, 0); empty.Gate.Met {
		t.Fatalf("an empty run met its gate")
	}
	var text bytes.Buffer
	summary.WriteText(&text)
	for _, want := range []string{"planned", "105", "late (completed after deadline)", "refused", "53300=3", "gate: on-time share 0.9400"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, text.String())
		}
	}
}

func TestParseArgs(t *testing.T) {
	var stderr bytes.Buffer
	cfg, err := ParseArgs([]string{"-user", "a,b", "-database", "x,y,z", "-passwords", "p1,p2", "-rate", "100"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Targets) != 3 || cfg.Targets[1] != (Target{User: "b", Database: "y"}) || cfg.Targets[2] != (Target{User: "a", Database: "z"}) {
		t.Fatalf("targets %v", cfg.Targets)
	}
	if !cfg.OpenLoop() || len(cfg.Passwords) != 2 || cfg.Deadline != 5*time.Second || cfg.GateOnTime != 0.99 || cfg.Query != "SELECT 1" {
		t.Fatalf("config %+v", cfg)
	}
	for _, bad := range [][]string{{"-wrong", "2"}, {"-abandon", "later"}, {"-password", "a", "-passwords", "b,c"}, {"-c", "0"}, {"stray"}, {"-targets", "/nonexistent"}} {
		if _, err := ParseArgs(bad, &stderr); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	// Password rotation on the clock.
	cfg, _ = ParseArgs([]string{"-passwords", "p1,p2", "-password-switch-after", "2s"}, &stderr)
	if got := cfg.planFor(0, time.Second).Password; got != "p1" {
		t.Errorf("at 1s password %q, want p1", got)
	}
	if got := cfg.planFor(1, 3*time.Second).Password; got != "p2" {
		t.Errorf("at 3s password %q, want p2", got)
	}
}

func TestRefusalLatency(t *testing.T) {
	collector := NewCollector()
	// 20 refusals at 10..200 ms, 5 of them wrong passwords, and completed
	// logins whose latencies must not mix in.
	for i := 1; i <= 20; i++ {
		outcome := Outcome{Class: ClassRefused, SQLState: "53300", Stage: StageAuth, Latency: time.Duration(i) * 10 * time.Millisecond}
		if i%4 == 0 {
			outcome.Class, outcome.SQLState = ClassWrongRefused, "28P01"
		}
		if i%2 == 0 {
			// The connect took all but 5 ms (SYNs retried while the
			// server's accept queue was full).
			outcome.Connect = outcome.Latency - 5*time.Millisecond
		}
		collector.Record(outcome)
		collector.Record(Outcome{Class: ClassOnTime, Latency: time.Second, LoggedIn: true})
	}
	collector.Record(Outcome{Class: ClassTimeout, Stage: StageAuth, Reach: ReachSent})
	summary := collector.Summarize(time.Second, 0.5)
	refusals := summary.RefusalLatency
	if refusals.Count != 20 || refusals.P50 != 0.1 || refusals.P95 != 0.19 || refusals.P99 != 0.2 || refusals.Max != 0.2 {
		t.Fatalf("refusal latency %+v", refusals)
	}
	// 10 ms ... 100 ms: the target is inclusive.
	if summary.RefusalsWithinTarget != 10 {
		t.Fatalf("refusals within 100ms: %d, want 10", summary.RefusalsWithinTarget)
	}
	// From the established connection: 5 ms for the even ones, 10..190 ms
	// for the odd ones; 15 within the target.
	if after := summary.RefusalAfterConnect; summary.RefusalsWithinTargetOfConn != 15 || after.Max != 0.19 || after.P50 != 0.005 {
		t.Fatalf("refusals after the connect %+v, %d within 100ms; want max 0.19 s, p50 0.005 s, 15", after, summary.RefusalsWithinTargetOfConn)
	}
	if summary.Latency.P50 != 1 || summary.Latency.Max != 1 {
		t.Fatalf("completed latency %+v mixes in refusals", summary.Latency)
	}
	if summary.Unanswered[ReachSent] != 1 || len(summary.Unanswered) != 1 {
		t.Fatalf("unanswered %v", summary.Unanswered)
	}
	var text bytes.Buffer
	summary.WriteText(&text)
	for _, want := range []string{"latency of refusals (20): p50 100ms  p95 190ms  p99 200ms  max 200ms; within 100ms: 10 (50.00%)", "unanswered, by reach:        sent=1"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, text.String())
		}
	}
	encoded, err := json.Marshal(summary)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"refusal_latency_seconds":{"count":20,"p50":0.1,"p95":0.19,"p99":0.2,"max":0.2}`, `"refusals_within_100ms":10`} {
		if !strings.Contains(string(encoded), want) {
			t.Errorf("JSON lacks %s: %s", want, encoded)
		}
	}

	// No refusal: a zero count, and no line in the table.
	empty := NewCollector()
	empty.Record(Outcome{Class: ClassOnTime, Latency: time.Millisecond, LoggedIn: true})
	summary = empty.Summarize(time.Second, 0.5)
	if summary.RefusalLatency != (RefusalLatencySummary{}) || summary.RefusalsWithinTarget != 0 {
		t.Fatalf("refusal latency without refusals: %+v", summary.RefusalLatency)
	}
	text.Reset()
	summary.WriteText(&text)
	if strings.Contains(text.String(), "latency of refusals") {
		t.Errorf("table reports refusal latency without refusals:\n%s", text.String())
	}
}
