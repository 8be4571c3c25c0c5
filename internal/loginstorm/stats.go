package loginstorm

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// Collector gathers outcomes from concurrent logins.
type Collector struct {
	mutex     sync.Mutex
	counts    map[Class]int64
	sqlStates map[string]int64 // refusals (including expected ones) by SQLSTATE
	abandoned map[Stage]int64  // deliberate abandons and timeouts, by client stage
	timeouts  map[Stage]int64
	latencies []time.Duration // of completed logins (on time and late)
	refusals  []time.Duration // of refused logins, to the ErrorResponse
	// refusalsAfterConnect: of refused logins, from the established
	// connection to the ErrorResponse (the server's part of the wait).
	refusalsAfterConnect []time.Duration
	loggedIn             int64 // outcomes where the server sent ReadyForQuery
	// unanswered counts the logins that ended without the server's answer
	// (timeouts before ReadyForQuery, broken connections, connect
	// timeouts) by how far they got, for the reconciliation's bounds.
	unanswered map[Reach]int64
	examples   map[Class]string
}

// RefusalTarget is the latency within which a refusal should arrive: a
// refused client should learn it at once and retry, not wait out its
// deadline.
const RefusalTarget = 100 * time.Millisecond

// NewCollector returns an empty collector.
func NewCollector() *Collector {
	return &Collector{
		counts: map[Class]int64{}, sqlStates: map[string]int64{}, abandoned: map[Stage]int64{},
		timeouts: map[Stage]int64{}, unanswered: map[Reach]int64{}, examples: map[Class]string{},
	}
}

// Record adds one outcome. It is safe for concurrent use.
func (c *Collector) Record(outcome Outcome) {
	c.mutex.Lock()
	defer c.mutex.Unlock()
	c.counts[outcome.Class]++
	switch outcome.Class {
	case ClassOnTime, ClassLate:
		c.latencies = append(c.latencies, outcome.Latency)
	case ClassRefused, ClassWrongRefused:
		c.sqlStates[outcome.SQLState]++
		c.refusals = append(c.refusals, outcome.Latency)
		c.refusalsAfterConnect = append(c.refusalsAfterConnect, outcome.Latency-outcome.Connect)
	case ClassAbandoned:
		c.abandoned[outcome.Stage]++
	case ClassTimeout:
		c.timeouts[outcome.Stage]++
	}
	if outcome.LoggedIn {
		c.loggedIn++
	} else if outcome.Class == ClassTimeout || outcome.Class == ClassProtocol || outcome.Reach == ReachConnect {
		c.unanswered[outcome.Reach]++
	}
	if outcome.Message != "" && c.examples[outcome.Class] == "" {
		example := outcome.Message
		if outcome.SQLState != "" {
			example = outcome.SQLState + " " + example
		}
		c.examples[outcome.Class] = example
	}
}

// Progress is a snapshot for the once-a-second progress line.
type Progress struct {
	Done     int64
	OnTime   int64
	Failures int64
	P99      time.Duration
}

// Progress returns counts and the p99 of completed logins so far.
func (c *Collector) Progress() Progress {
	c.mutex.Lock()
	latencies := slices.Clone(c.latencies)
	var progress Progress
	for class, count := range c.counts {
		progress.Done += count
		if slices.Contains(failureClasses, class) {
			progress.Failures += count
		}
	}
	progress.OnTime = c.counts[ClassOnTime]
	c.mutex.Unlock()
	slices.Sort(latencies)
	progress.P99 = percentile(latencies, 0.99)
	return progress
}

// Summary is the final report of a run.
type Summary struct {
	Mode           string           `json:"mode"`
	Planned        int64            `json:"planned"`
	OnTime         int64            `json:"completed_on_time"`
	Late           int64            `json:"late"`
	Failed         map[Class]int64  `json:"failed"`
	Abandoned      int64            `json:"abandoned_deliberately"`
	WrongRefused   int64            `json:"wrong_password_refused"`
	RefusedBySQL   map[string]int64 `json:"refused_by_sqlstate"`
	AbandonedStage map[Stage]int64  `json:"abandoned_by_stage"`
	TimeoutStage   map[Stage]int64  `json:"timeout_by_stage"`
	LoggedIn       int64            `json:"logged_in"`
	Unanswered     map[Reach]int64  `json:"unanswered_by_reach"`
	Examples       map[Class]string `json:"examples,omitempty"`
	ElapsedSeconds float64          `json:"elapsed_seconds"`
	LoginsPerSec   float64          `json:"completed_per_second"`
	OnTimePerSec   float64          `json:"ontime_per_second"`
	Latency        LatencySummary   `json:"latency_seconds"`
	// RefusalLatency covers the classes refused and wrong_refused, from the
	// start of the connect to the ErrorResponse.
	RefusalLatency       RefusalLatencySummary `json:"refusal_latency_seconds"`
	RefusalsWithinTarget int64                 `json:"refusals_within_100ms"`
	// RefusalAfterConnect is the same refusals timed from the established
	// connection: without the time the client spent retrying its SYN
	// while the server's accept queue was full.
	RefusalAfterConnect        LatencySummary    `json:"refusal_after_connect_seconds"`
	RefusalsWithinTargetOfConn int64             `json:"refusals_within_100ms_of_connect"`
	Dispatch                   *DispatchStats    `json:"dispatch,omitempty"`
	Held                       *HoldSummary      `json:"held,omitempty"`
	Gate                       GateResult        `json:"gate"`
	Reconciliation             []ReconcileRow    `json:"reconciliation,omitempty"`
	Interrupted                bool              `json:"interrupted,omitempty"`
	Settings                   map[string]string `json:"settings"`
}

// LatencySummary holds percentiles of completed logins, in seconds.
type LatencySummary struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// RefusalLatencySummary holds percentiles of refused logins, in seconds;
// all zero when Count is.
type RefusalLatencySummary struct {
	Count int64 `json:"count"`
	LatencySummary
}

// HoldSummary is how -hold went.
type HoldSummary struct {
	Wanted int   `json:"wanted"`
	Opened int   `json:"opened"`
	Failed int64 `json:"failed"`
}

// GateResult says whether the run met -gate-ontime.
type GateResult struct {
	Want        float64 `json:"want_ontime_share"`
	OnTimeShare float64 `json:"ontime_share"`
	Denominator int64   `json:"denominator"`
	Met         bool    `json:"met"`
}

// Summarize computes the summary. The gate's denominator is every planned
// login except the deliberately abandoned ones; a deliberately wrong
// password that is refused on time counts as a success, because refusing it
// is the right answer.
func (c *Collector) Summarize(elapsed time.Duration, gateOnTime float64) Summary {
	c.mutex.Lock()
	defer c.mutex.Unlock()
	summary := Summary{
		Failed: map[Class]int64{}, RefusedBySQL: maps.Clone(c.sqlStates), AbandonedStage: maps.Clone(c.abandoned),
		TimeoutStage: maps.Clone(c.timeouts), Examples: maps.Clone(c.examples), LoggedIn: c.loggedIn,
		Unanswered: maps.Clone(c.unanswered),
	}
	for _, count := range c.counts {
		summary.Planned += count
	}
	summary.OnTime = c.counts[ClassOnTime]
	summary.Late = c.counts[ClassLate]
	summary.Abandoned = c.counts[ClassAbandoned]
	summary.WrongRefused = c.counts[ClassWrongRefused]
	for _, class := range failureClasses {
		summary.Failed[class] = c.counts[class]
	}
	summary.ElapsedSeconds = elapsed.Seconds()
	if elapsed > 0 {
		summary.LoginsPerSec = float64(summary.OnTime+summary.Late) / elapsed.Seconds()
		summary.OnTimePerSec = float64(summary.OnTime) / elapsed.Seconds()
	}
	summary.Latency = summarizeLatencies(c.latencies)
	summary.RefusalLatency = RefusalLatencySummary{Count: int64(len(c.refusals)), LatencySummary: summarizeLatencies(c.refusals)}
	summary.RefusalsWithinTarget = countWithin(c.refusals, RefusalTarget)
	summary.RefusalAfterConnect = summarizeLatencies(c.refusalsAfterConnect)
	summary.RefusalsWithinTargetOfConn = countWithin(c.refusalsAfterConnect, RefusalTarget)
	summary.Gate = evaluateGate(summary.OnTime+summary.WrongRefused, summary.Planned-summary.Abandoned, gateOnTime)
	return summary
}

// countWithin counts the latencies no longer than limit.
func countWithin(latencies []time.Duration, limit time.Duration) int64 {
	var n int64
	for _, latency := range latencies {
		if latency <= limit {
			n++
		}
	}
	return n
}

func evaluateGate(good, denominator int64, want float64) GateResult {
	gate := GateResult{Want: want, Denominator: denominator}
	if denominator > 0 {
		gate.OnTimeShare = float64(good) / float64(denominator)
	}
	// A run that planned nothing has shown nothing: it does not pass.
	gate.Met = denominator > 0 && gate.OnTimeShare >= want
	return gate
}

// summarizeLatencies returns the percentiles of latencies, which it does not
// modify.
func summarizeLatencies(latencies []time.Duration) LatencySummary {
	sorted := slices.Clone(latencies)
	slices.Sort(sorted)
	return LatencySummary{
		P50: percentile(sorted, 0.50).Seconds(), P95: percentile(sorted, 0.95).Seconds(),
		P99: percentile(sorted, 0.99).Seconds(), Max: percentile(sorted, 1).Seconds(),
	}
}

// percentile is the nearest-rank percentile of sorted values; 0 when empty.
func percentile(sorted []time.Duration, quantile float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(quantile * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// WriteText prints the final table.
func (s Summary) WriteText(out io.Writer) {
	fmt.Fprintf(out, "loginstorm %s, %s\n", s.Mode, s.Settings["target"])
	if s.Interrupted {
		fmt.Fprintln(out, "  run INTERRUPTED: logins not started are counted as skipped")
	}
	row := func(label string, count int64) {
		share := 0.0
		if s.Planned > 0 {
			share = float64(count) / float64(s.Planned)
		}
		fmt.Fprintf(out, "  %-28s %10d  %6.2f%%\n", label, count, 100*share)
	}
	row("planned", s.Planned)
	row("completed on time", s.OnTime)
	row("late (completed after deadline)", s.Late)
	var failed int64
	for _, class := range failureClasses {
		if class != ClassLate {
			failed += s.Failed[class]
		}
	}
	row("failed", failed)
	for _, class := range failureClasses {
		if class == ClassLate || s.Failed[class] == 0 {
			continue
		}
		row("  "+string(class), s.Failed[class])
	}
	if s.WrongRefused > 0 {
		row("wrong password refused (ok)", s.WrongRefused)
	}
	if s.Abandoned > 0 {
		row("abandoned deliberately", s.Abandoned)
	}
	if len(s.RefusedBySQL) > 0 {
		fmt.Fprintf(out, "  refusals by SQLSTATE:        %s\n", formatCounts(s.RefusedBySQL))
	}
	if len(s.TimeoutStage) > 0 {
		fmt.Fprintf(out, "  timeouts by stage:           %s\n", formatCounts(s.TimeoutStage))
	}
	if len(s.AbandonedStage) > 0 {
		fmt.Fprintf(out, "  abandoned by stage:          %s\n", formatCounts(s.AbandonedStage))
	}
	if len(s.Unanswered) > 0 {
		fmt.Fprintf(out, "  unanswered, by reach:        %s\n", formatCounts(s.Unanswered))
	}
	fmt.Fprintf(out, "  elapsed %.2fs, completed %.1f logins/s, on time %.1f logins/s\n", s.ElapsedSeconds, s.LoginsPerSec, s.OnTimePerSec)
	fmt.Fprintf(out, "  latency of completed logins: p50 %s  p95 %s  p99 %s  max %s\n",
		seconds(s.Latency.P50), seconds(s.Latency.P95), seconds(s.Latency.P99), seconds(s.Latency.Max))
	if refusals := s.RefusalLatency; refusals.Count > 0 {
		fmt.Fprintf(out, "  latency of refusals (%d): p50 %s  p95 %s  p99 %s  max %s; within %s: %d (%.2f%%)\n",
			refusals.Count, seconds(refusals.P50), seconds(refusals.P95), seconds(refusals.P99), seconds(refusals.Max),
			RefusalTarget, s.RefusalsWithinTarget, 100*float64(s.RefusalsWithinTarget)/float64(refusals.Count))
		after := s.RefusalAfterConnect
		fmt.Fprintf(out, "    from the established connection:  p50 %s  p95 %s  p99 %s  max %s; within %s: %d (%.2f%%)\n",
			seconds(after.P50), seconds(after.P95), seconds(after.P99), seconds(after.Max),
			RefusalTarget, s.RefusalsWithinTargetOfConn, 100*float64(s.RefusalsWithinTargetOfConn)/float64(refusals.Count))
	}
	if s.Dispatch != nil {
		verdict := "kept its schedule"
		if s.Dispatch.LateCount > 0 {
			verdict = "FELL BEHIND its schedule"
		}
		fmt.Fprintf(out, "  generator %s: max dispatch lag %s, %d dispatches later than %s\n",
			verdict, seconds(s.Dispatch.MaxLagSeconds), s.Dispatch.LateCount, LateDispatchThreshold)
	}
	if s.Held != nil {
		fmt.Fprintf(out, "  held idle connections: %d of %d opened (%d failed)\n", s.Held.Opened, s.Held.Wanted, s.Held.Failed)
	}
	for _, class := range slices.Sorted(maps.Keys(s.Examples)) {
		fmt.Fprintf(out, "  example %s: %s\n", class, s.Examples[class])
	}
	verdict := "NOT MET"
	if s.Gate.Met {
		verdict = "met"
	}
	fmt.Fprintf(out, "  gate: on-time share %.4f of %d (want >= %.4f): %s\n", s.Gate.OnTimeShare, s.Gate.Denominator, s.Gate.Want, verdict)
	if len(s.Reconciliation) > 0 {
		writeReconciliation(out, s.Reconciliation)
	}
}

func formatCounts[K ~string](counts map[K]int64) string {
	parts := make([]string, 0, len(counts))
	for key, count := range counts {
		parts = append(parts, fmt.Sprintf("%s=%d", key, count))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func seconds(value float64) string {
	return time.Duration(value * float64(time.Second)).Round(time.Microsecond).String()
}
