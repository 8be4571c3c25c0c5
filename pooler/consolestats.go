package pooler

import (
	"slices"
	"time"

	"github.com/pgtender/pgtender/pooler/admin"
)

// SHOW STATS's averages are PgBouncer's (stats.c, calc_average): every
// stats_period the totals are read, and each average is the difference
// from the previous reading, per second for a count and per event for a
// time, shown until the next reading. statsLoop takes the readings.

// databaseTotals are one database's counters, summed over its pools.
type databaseTotals struct {
	assignments  uint64 // server connections given to clients
	transactions uint64
	queries      uint64
	received     uint64
	sent         uint64
	waitMicros   uint64 // time clients waited for a server connection
	serverParses uint64
	logins       uint64
}

// statsWindow is the last two readings of the totals.
type statsWindow struct {
	at, previousAt   time.Time
	totals, previous map[string]databaseTotals // by database; previous nil before the second reading
}

// consoleTotals reads the totals of every configured database and every
// database a pool has (a pool of a database a reload removed may still
// drain).
func (p *Pooler) consoleTotals() map[string]databaseTotals {
	totals := make(map[string]databaseTotals)
	for _, db := range p.state.Load().cfg.Databases {
		totals[db.Name] = databaseTotals{}
	}
	for _, st := range p.PoolStats() {
		t := totals[st.Database]
		t.assignments += st.Assignments
		t.transactions += st.Transactions
		t.queries += st.Queries
		t.received += st.BytesReceived
		t.sent += st.BytesSent
		t.waitMicros += uint64(st.WaitTime / time.Microsecond)
		t.serverParses += st.StatementParses
		t.logins += st.Logins
		totals[st.Database] = t
	}
	return totals
}

// takeStatsReading replaces the window with one whose latest reading is
// now's.
func (p *Pooler) takeStatsReading(now time.Time) {
	next := &statsWindow{at: now, totals: p.consoleTotals()}
	if old := p.consoleStats.Load(); old != nil {
		next.previousAt, next.previous = old.at, old.totals
	}
	p.consoleStats.Store(next)
}

// statsLoop takes a reading at start and every stats_period, as a reload
// last set it, until Shutdown.
func (p *Pooler) statsLoop() {
	defer p.wg.Done()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-p.done:
			return
		case now := <-timer.C:
			p.takeStatsReading(now)
			timer.Reset(p.state.Load().cfg.General.StatsPeriod.Duration())
		}
	}
}

// row is the totals as SHOW STATS's columns after database (in the
// order totals and averages share), with NULL where pgtender does not
// measure: transaction and query times, clients' Parses and Binds.
func (t databaseTotals) row() []any {
	return []any{t.assignments, t.transactions, t.queries, t.received, t.sent,
		nil, nil, t.waitMicros, nil, t.serverParses, nil, t.logins}
}

// average is one database's averages over the window, in a databaseTotals:
// counts per second, waitMicros per assignment.
func (w *statsWindow) average(database string) databaseTotals {
	if w == nil || w.previous == nil {
		return databaseTotals{}
	}
	elapsed := w.at.Sub(w.previousAt)
	if elapsed <= 0 {
		return databaseTotals{}
	}
	now, before := w.totals[database], w.previous[database]
	perSecond := func(a, b uint64) uint64 {
		if a < b {
			return 0 // a counter that went back: its pool was replaced
		}
		return uint64(float64(a-b) / elapsed.Seconds())
	}
	avg := databaseTotals{
		assignments:  perSecond(now.assignments, before.assignments),
		transactions: perSecond(now.transactions, before.transactions),
		queries:      perSecond(now.queries, before.queries),
		received:     perSecond(now.received, before.received),
		sent:         perSecond(now.sent, before.sent),
		serverParses: perSecond(now.serverParses, before.serverParses),
		logins:       perSecond(now.logins, before.logins),
	}
	if now.assignments > before.assignments && now.waitMicros >= before.waitMicros {
		avg.waitMicros = (now.waitMicros - before.waitMicros) / (now.assignments - before.assignments)
	}
	return avg
}

// showStats is SHOW STATS (totals and averages), STATS_TOTALS or
// STATS_AVERAGES, a row per database. Transaction and query times, and
// the clients' Parse and Bind counts, are NULL: pgtender does not measure
// them (docs/admin.md).
func (p *Pooler) showStats(table *admin.Table, totals, averages bool) *admin.Result {
	current := p.consoleTotals()
	window := p.consoleStats.Load()
	names := make([]string, 0, len(current))
	for name := range current {
		names = append(names, name)
	}
	slices.Sort(names)
	result := table.NewResult()
	for _, name := range names {
		row := []any{name}
		if totals {
			row = append(row, current[name].row()...)
		}
		if averages {
			row = append(row, window.average(name).row()...)
		}
		result.Add(row...)
	}
	return result
}
