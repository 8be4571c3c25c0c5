package pooler

import (
	"testing"
	"time"
)

// TestStatsWindowAverage checks SHOW STATS's averages as PgBouncer's
// calc_average computes them: counts per second over the window, wait
// time per assignment.
func TestStatsWindowAverage(t *testing.T) {
	at := time.Unix(1000, 0)
	w := &statsWindow{
		previousAt: at, at: at.Add(10 * time.Second),
		previous: map[string]databaseTotals{"db": {assignments: 100, transactions: 50, queries: 70, received: 1000, sent: 5000, waitMicros: 900, logins: 3}},
		totals:   map[string]databaseTotals{"db": {assignments: 120, transactions: 150, queries: 170, received: 2000, sent: 25000, waitMicros: 1900, logins: 13}},
	}
	got := w.average("db")
	want := databaseTotals{assignments: 2, transactions: 10, queries: 10, received: 100, sent: 2000, waitMicros: 50, logins: 1}
	if got != want {
		t.Errorf("average = %+v, want %+v", got, want)
	}
	if got := (*statsWindow)(nil).average("db"); got != (databaseTotals{}) {
		t.Errorf("no reading yet: %+v", got)
	}
	if got := (&statsWindow{at: at, totals: w.totals}).average("db"); got != (databaseTotals{}) {
		t.Errorf("one reading: %+v, want zeros", got)
	}
	// A counter that went back (its pool was replaced by a reload) gives
	// 0, not a wrapped figure.
	back := &statsWindow{previousAt: at, at: at.Add(time.Second), previous: w.totals, totals: w.previous}
	if got := back.average("db"); got != (databaseTotals{}) {
		t.Errorf("counters that went back: %+v, want zeros", got)
	}
}
