package loginstorm

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// counters builds the server's change over a run: results and abandons by
// label, from a zero "before".
func counters(results, abandoned map[string]float64) (LoginCounters, LoginCounters) {
	return LoginCounters{}, LoginCounters{Results: results, Abandoned: abandoned}
}

func rowsByName(t *testing.T, rows []ReconcileRow) map[string]ReconcileRow {
	t.Helper()
	byName := map[string]ReconcileRow{}
	for _, row := range rows {
		byName[row.Name] = row
	}
	if len(byName) != 8 {
		t.Fatalf("%d rows, want 8: %+v", len(byName), rows)
	}
	return byName
}

const (
	rowOK      = `logins_total{result="ok"}`
	rowAuth    = `logins_total{result="auth_failed"}`
	rowRefused = `logins_total{result=~"shed|rejected|error"}`
	rowShed    = `logins_total{result="shed"}`
	rowStartup = `logins_abandoned_total{stage="startup"}`
	rowAbAuth  = `logins_abandoned_total{stage="auth"}`
	rowAbReady = `logins_abandoned_total{stage="ready"}`
	rowTotal   = "all logins ended (results + abandoned)"
	wantExact  = -1
)

// checkRow asserts a row's range and verdict; max wantExact means min.
func checkRow(t *testing.T, rows map[string]ReconcileRow, name string, min, max int64, match bool) {
	t.Helper()
	if max == wantExact {
		max = min
	}
	row := rows[name]
	if row.ServerMin != min || row.ServerMax != max || row.Match != match {
		t.Errorf("%s: range %d..%d match %v, want %d..%d match %v (server %v, note %q)",
			name, row.ServerMin, row.ServerMax, row.Match, min, max, match, row.Server, row.Note)
	}
}

func TestReconcileQuietRunIsExact(t *testing.T) {
	// 90 logged in (5 of them held), 4 wrong passwords refused, 3 shed,
	// 2 abandoned at auth, 1 abandoned at startup.
	summary := Summary{Planned: 95, LoggedIn: 85, RefusedBySQL: map[string]int64{"28P01": 4, "53300": 3},
		AbandonedStage: map[Stage]int64{StageAuth: 2, StageStartup: 1}, Failed: map[Class]int64{}}
	before, after := counters(map[string]float64{"ok": 90, "auth_failed": 4, "shed": 3}, map[string]float64{"auth": 2, "startup": 1})
	rows := rowsByName(t, Reconcile(summary, 5, before, after))
	checkRow(t, rows, rowOK, 90, wantExact, true)
	checkRow(t, rows, rowAuth, 4, wantExact, true)
	checkRow(t, rows, rowAbAuth, 2, wantExact, true)
	checkRow(t, rows, rowAbReady, 0, wantExact, true)
	// An abandon at startup may in principle be shed or never seen, but
	// the server's counts leave no room for that: startup is exact, and
	// only the rows it could have gone to are ranges.
	checkRow(t, rows, rowStartup, 1, wantExact, true)
	checkRow(t, rows, rowRefused, 3, 4, true)
	checkRow(t, rows, rowShed, 3, 4, true)
	checkRow(t, rows, rowTotal, 99, 100, true)

	// One count off is a mismatch of its row, or of the total when another
	// row could have held it.
	for _, tweak := range []struct {
		result, stage string
		by            float64
		mismatched    []string
	}{
		{"ok", "", 1, []string{rowOK, rowTotal}},
		{"auth_failed", "", -1, []string{rowAuth}},
		{"shed", "", 1, []string{rowTotal}},
		{"", "startup", 1, []string{rowStartup, rowTotal}},
		{"", "ready", 1, []string{rowAbReady, rowTotal}},
	} {
		before, after := counters(map[string]float64{"ok": 90, "auth_failed": 4, "shed": 3}, map[string]float64{"auth": 2, "startup": 1})
		if tweak.result != "" {
			after.Results[tweak.result] += tweak.by
		} else {
			after.Abandoned[tweak.stage] += tweak.by
		}
		for name, row := range rowsByName(t, Reconcile(summary, 5, before, after)) {
			if row.Match == slices.Contains(tweak.mismatched, name) {
				t.Errorf("%s%s %+v: %s match %v, want mismatches in %v (%+v)", tweak.result, tweak.stage, tweak.by, name, row.Match, tweak.mismatched, row)
			}
		}
	}
}

// TestReconcileOverload is the overload run that used to mismatch: the
// generator's 706 timeouts at auth were 576 clients that never heard the
// server (still in its accept queue) and 130 that had sent their password.
func TestReconcileOverload(t *testing.T) {
	summary := Summary{Planned: 12650, LoggedIn: 10576, Failed: map[Class]int64{ClassConnect: 1368, ClassTimeout: 8261},
		TimeoutStage: map[Stage]int64{StageAuth: 706, StageQuery: 7555},
		Unanswered:   map[Reach]int64{ReachSent: 576, ReachPassword: 130, ReachConnect: 1368}}
	before, after := counters(map[string]float64{"ok": 10580}, map[string]float64{"auth": 111, "ready": 126})
	rows := rowsByName(t, Reconcile(summary, 0, before, after))
	// The 130 that sent their password: 4 admitted before the server saw
	// them leave, 126 seen leaving at ready. With the silent ones and the
	// timed-out connects all unseen but 111 (the server's total says so),
	// those 111 left at auth, and the others are pinned down too.
	checkRow(t, rows, rowOK, 10580, 10706, true)
	checkRow(t, rows, rowAbReady, 126, 130, true)
	checkRow(t, rows, rowAbAuth, 111, 706, true)
	checkRow(t, rows, rowStartup, 0, 576, true)
	// Neither shed nor otherwise refused: up to the silent ones and the
	// timed-out connects may have been shed, none must have.
	checkRow(t, rows, rowShed, 0, 576+1368, true)
	checkRow(t, rows, rowAuth, 0, 130, true)
	// Those that sent their password are all on the server; the silent ones
	// and the timed-out connects may not be.
	checkRow(t, rows, rowTotal, 10576+130, 10576+706+1368, true)
	if rows[rowTotal].Server != 10817 || rows[rowTotal].Generator != 11282 {
		t.Errorf("total %+v", rows[rowTotal])
	}
	if !strings.Contains(rows[rowOK].Note, "besides 10576 certain, 130 that ended after sending the password may be here, at least 4 of them as") {
		t.Errorf("ok note %q", rows[rowOK].Note)
	}

	// More admitted than logged in plus those that sent their password:
	// the ok row fails, and only it and the total.
	_, after = counters(map[string]float64{"ok": 10576 + 131}, map[string]float64{"auth": 111, "ready": 0})
	rows = rowsByName(t, Reconcile(summary, 0, before, after))
	for name, row := range rows {
		if row.Match == (name == rowOK) {
			t.Errorf("%s: match %v (%+v)", name, row.Match, row)
		}
	}

	// Abandoned at ready beyond those past the password: that row fails,
	// and its unexplained count squeezes no other row (nor the total, which
	// the silent ones leave room for).
	_, after = counters(map[string]float64{"ok": 10580}, map[string]float64{"auth": 111, "ready": 200})
	rows = rowsByName(t, Reconcile(summary, 0, before, after))
	for name, row := range rows {
		if row.Match == (name == rowAbReady) {
			t.Errorf("%s: match %v (%+v)", name, row.Match, row)
		}
	}
}

func TestReconcileShedBounds(t *testing.T) {
	// 100 clients read 53300, 10 never heard the server.
	summary := Summary{Planned: 110, RefusedBySQL: map[string]int64{"53300": 100}, Failed: map[Class]int64{ClassRefused: 100, ClassTimeout: 10},
		TimeoutStage: map[Stage]int64{StageAuth: 10}, Unanswered: map[Reach]int64{ReachSent: 10}}
	for _, test := range []struct {
		name             string
		results          map[string]float64
		abandoned        map[string]float64
		shedMin, shedMax int64
		match            bool
		refusedMatch     bool
	}{
		// 5 of the silent ones shed, 2 seen leaving, 3 never seen: the
		// other 5 had nowhere else to be.
		{"some silent shed", map[string]float64{"shed": 105}, map[string]float64{"auth": 2}, 105, 110, true, true},
		{"all silent shed", map[string]float64{"shed": 110}, nil, 110, 110, true, true},
		{"more shed than refusals and silent ones", map[string]float64{"shed": 111}, nil, 110, 110, false, false},
		// A 53300 may be a checkout_timeout, counted rejected.
		{"53300 rejected", map[string]float64{"shed": 99, "rejected": 1}, nil, 99, 110, true, true},
		// One refusal read but not counted: the shed row cannot tell shed
		// from rejected, the refusals row can.
		{"refusal not counted", map[string]float64{"shed": 99}, nil, 99, 110, true, false},
	} {
		t.Run(test.name, func(t *testing.T) {
			before, after := counters(test.results, test.abandoned)
			rows := rowsByName(t, Reconcile(summary, 0, before, after))
			checkRow(t, rows, rowShed, test.shedMin, test.shedMax, test.match)
			if rows[rowRefused].Match != test.refusedMatch {
				t.Errorf("refusals row %+v, want match %v", rows[rowRefused], test.refusedMatch)
			}
		})
	}

	// Without silent clients the shed row is exact: every refused client
	// read its error.
	exact := Summary{Planned: 100, RefusedBySQL: map[string]int64{"53300": 100}, Failed: map[Class]int64{ClassRefused: 100}}
	before, after := counters(map[string]float64{"shed": 100}, nil)
	rows := rowsByName(t, Reconcile(exact, 0, before, after))
	checkRow(t, rows, rowShed, 100, wantExact, true)
	checkRow(t, rows, rowRefused, 100, wantExact, true)
	checkRow(t, rows, rowTotal, 100, wantExact, true)
	_, after = counters(map[string]float64{"shed": 101}, nil)
	if rows := rowsByName(t, Reconcile(exact, 0, before, after)); rows[rowShed].Match || rows[rowRefused].Match {
		t.Errorf("101 shed for 100 refusals matched: %+v", rows[rowShed])
	}
}

func TestReconcileWrongPasswordsExact(t *testing.T) {
	summary := Summary{Planned: 50, LoggedIn: 40, RefusedBySQL: map[string]int64{"28P01": 10}, Failed: map[Class]int64{}}
	before, after := counters(map[string]float64{"ok": 40, "auth_failed": 10}, nil)
	rows := rowsByName(t, Reconcile(summary, 0, before, after))
	checkRow(t, rows, rowAuth, 10, wantExact, true)
	_, after = counters(map[string]float64{"ok": 40, "auth_failed": 11}, nil)
	rows = rowsByName(t, Reconcile(summary, 0, before, after))
	checkRow(t, rows, rowAuth, 10, wantExact, false)

	// A client that timed out after sending a wrong password may still have
	// been refused by the server; here it can be nowhere else.
	summary.Planned, summary.Unanswered = 51, map[Reach]int64{ReachPassword: 1}
	rows = rowsByName(t, Reconcile(summary, 0, before, after))
	checkRow(t, rows, rowAuth, 11, wantExact, true)
	checkRow(t, rows, rowTotal, 51, wantExact, true)
	// Or it was admitted.
	_, after = counters(map[string]float64{"ok": 41, "auth_failed": 10}, nil)
	rows = rowsByName(t, Reconcile(summary, 0, before, after))
	checkRow(t, rows, rowAuth, 10, 11, true)
	checkRow(t, rows, rowOK, 41, wantExact, true)
}

func TestReconcileDeliberateAbandons(t *testing.T) {
	// 6 abandoned at startup, 4 at ready.
	summary := Summary{Planned: 10, Abandoned: 10, AbandonedStage: map[Stage]int64{StageStartup: 6, StageReady: 4}, Failed: map[Class]int64{}}
	before, after := counters(map[string]float64{"ok": 3}, map[string]float64{"startup": 6, "ready": 1})
	rows := rowsByName(t, Reconcile(summary, 0, before, after))
	// Nothing was shed and the total is complete: startup is exact.
	checkRow(t, rows, rowStartup, 6, wantExact, true)
	// Ready: the server may have written ReadyForQuery before the close.
	checkRow(t, rows, rowOK, 3, 4, true)
	checkRow(t, rows, rowAbReady, 1, 4, true)
	checkRow(t, rows, rowTotal, 4, 10, true)
	// Under overload an abandon at startup may be shed instead.
	_, after = counters(map[string]float64{"ok": 3, "shed": 2}, map[string]float64{"startup": 4, "ready": 1})
	rows = rowsByName(t, Reconcile(summary, 0, before, after))
	checkRow(t, rows, rowStartup, 4, 6, true)
	checkRow(t, rows, rowShed, 2, 6, true)
	if !strings.Contains(rows[rowStartup].Note, "6 abandoned at startup may be here, at least 4 of them") {
		t.Errorf("startup note %q", rows[rowStartup].Note)
	}
}

func TestReconcileNotesUnsettled(t *testing.T) {
	before, after := counters(map[string]float64{"ok": 1}, nil)
	after.Unsettled = true
	rows := rowsByName(t, Reconcile(Summary{Planned: 1, LoggedIn: 1, Failed: map[Class]int64{}}, 0, before, after))
	if !rows[rowTotal].Match || !strings.Contains(rows[rowTotal].Note, "still ending logins") {
		t.Errorf("total %+v", rows[rowTotal])
	}
}

func TestParseLoginCountersInFlight(t *testing.T) {
	exposition := "# TYPE x_logins_total counter\nx_logins_total{result=\"ok\"} 3\n# TYPE x_logins_in_flight gauge\nx_logins_in_flight 2\n"
	got, err := ParseLoginCounters(strings.NewReader(exposition), "x_")
	if err != nil || got.Results["ok"] != 3 || !got.HasInFlight || got.InFlight != 2 {
		t.Fatalf("%+v %v", got, err)
	}
	got, err = ParseLoginCounters(strings.NewReader("x_logins_total{result=\"ok\"} 3\n"), "x_")
	if err != nil || got.HasInFlight {
		t.Fatalf("without the gauge: %+v %v", got, err)
	}
}

func TestScrapeSettledWaitsForTheServer(t *testing.T) {
	// The server ends its last login at the fourth scrape; loginstorm must
	// wait for logins_in_flight 0 and two equal scrapes.
	var scrapes atomic.Int64
	metrics := httptest.NewServer(http.HandlerFunc(func(writer http.ResponseWriter, _ *http.Request) {
		n := scrapes.Add(1)
		ok, inFlight := 9, 1
		if n >= 4 {
			ok, inFlight = 10, 0
		}
		fmt.Fprintf(writer, "logins_total{result=\"ok\"} %d\nlogins_in_flight %d\n", ok, inFlight)
	}))
	defer metrics.Close()
	cfg := Config{MetricsURL: metrics.URL}
	got, err := scrapeSettled(context.Background(), metrics.Client(), cfg, nil)
	if err != nil || got.Results["ok"] != 10 || got.Unsettled || scrapes.Load() != 5 {
		t.Fatalf("%+v %v after %d scrapes", got, err, scrapes.Load())
	}

	// A server that never settles is scraped for at most settleTime.
	defer func(saved time.Duration) { settleTime = saved }(settleTime)
	settleTime = 300 * time.Millisecond
	scrapes.Store(-1000)
	start := time.Now()
	got, err = scrapeSettled(context.Background(), metrics.Client(), cfg, nil)
	if err != nil || !got.Unsettled || time.Since(start) > 2*time.Second {
		t.Fatalf("%+v %v after %s", got, err, time.Since(start))
	}
}

// TestSumCountsReconcilesAsOne splits TestReconcileOverload's run between
// two generators: their summed counts reconcile with the server's as the
// single run's did.
func TestSumCountsReconcilesAsOne(t *testing.T) {
	first := Summary{Planned: 6000, LoggedIn: 5000, Failed: map[Class]int64{ClassConnect: 368, ClassTimeout: 632},
		TimeoutStage: map[Stage]int64{StageAuth: 200, StageQuery: 432},
		Unanswered:   map[Reach]int64{ReachSent: 150, ReachPassword: 50, ReachConnect: 368}}
	second := Summary{Planned: 6650, LoggedIn: 5576, Failed: map[Class]int64{ClassConnect: 1000, ClassTimeout: 7629},
		TimeoutStage: map[Stage]int64{StageAuth: 506, StageQuery: 7123},
		Unanswered:   map[Reach]int64{ReachSent: 426, ReachPassword: 80, ReachConnect: 1000},
		Held:         &HoldSummary{Wanted: 3, Opened: 3}}
	whole := SumCounts(first, second)
	if whole.Planned != 12650 || whole.LoggedIn != 10576 || whole.Failed[ClassTimeout] != 8261 ||
		whole.Unanswered[ReachSent] != 576 || whole.TimeoutStage[StageAuth] != 706 || whole.Held.Opened != 3 {
		t.Fatalf("summed %+v", whole)
	}
	before, after := counters(map[string]float64{"ok": 10580 + 3}, map[string]float64{"auth": 111, "ready": 126})
	rows := rowsByName(t, Reconcile(whole, 3, before, after))
	checkRow(t, rows, rowOK, 10580+3, 10706+3, true)
	checkRow(t, rows, rowAbReady, 126, 130, true)
	checkRow(t, rows, rowAbAuth, 111, 706, true)
	// One generator's counts alone do not explain the server's.
	if rows := rowsByName(t, Reconcile(first, 0, before, after)); rows[rowOK].Match {
		t.Errorf("one generator's counts matched the whole run's: %+v", rows[rowOK])
	}
}
