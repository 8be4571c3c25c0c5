package pooler

import (
	"math/bits"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/cpu"

	"github.com/pgtender/pgtender/config"
)

// CheckoutWaitBuckets are the upper bounds, in seconds, of the checkout
// wait histogram: from an idle connection taken at once (the first bucket)
// to a wait as long as the default checkout_timeout.
var CheckoutWaitBuckets = []float64{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10}

// durationHistogram is a fixed-bucket histogram of atomics: recording is
// two atomic adds, with no lock and no allocation, so pools can record
// every checkout; metrics reads it at scrape time.
type durationHistogram struct {
	counts   [16]atomic.Uint64 // per bucket (not cumulative); the last used one is +Inf
	sumNanos atomic.Uint64
}

func (h *durationHistogram) observe(d time.Duration) {
	seconds := d.Seconds()
	i := 0
	for i < len(CheckoutWaitBuckets) && seconds > CheckoutWaitBuckets[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sumNanos.Add(uint64(max(d, 0)))
}

// HistogramSnapshot is a histogram read at one moment.
type HistogramSnapshot struct {
	Bounds []float64 // upper bounds in seconds, as CheckoutWaitBuckets
	// Cumulative[i] counts observations <= Bounds[i].
	Cumulative []uint64
	Count      uint64
	SumSeconds float64
}

// snapshotOf sums histograms (a pool's stripes) into one snapshot.
func snapshotOf(histograms ...*durationHistogram) HistogramSnapshot {
	var counts [16]uint64
	var sumNanos uint64
	for _, h := range histograms {
		for i := range counts {
			counts[i] += h.counts[i].Load()
		}
		sumNanos += h.sumNanos.Load()
	}
	snap := HistogramSnapshot{Bounds: CheckoutWaitBuckets, Cumulative: make([]uint64, len(CheckoutWaitBuckets))}
	var running uint64
	for i := range CheckoutWaitBuckets {
		running += counts[i]
		snap.Cumulative[i] = running
	}
	snap.Count = running + counts[len(CheckoutWaitBuckets)]
	snap.SumSeconds = float64(sumNanos) / 1e9
	return snap
}

// poolCounters are the counters of a pool that its clients' transactions
// move: each checkout, each chunk relayed, each ReadyForQuery. A pool keeps
// several (poolStats.stripes), each padded to cache lines of its own, and a
// session writes only the one its process id picks (poolStats.stripe), so
// that two sessions busy on two cores seldom write the same cache line;
// readers sum the stripes (sumStripes). Counters moved once per login or
// per server connection stay single in poolStats.
type poolCounters struct {
	transactions  atomic.Uint64
	queries       atomic.Uint64
	bytesReceived atomic.Uint64
	bytesSent     atomic.Uint64
	assignments   atomic.Uint64
	waitNanos     atomic.Int64
	checkoutWait  durationHistogram
	_             cpu.CacheLinePad // the next stripe starts on another line
}

// maxCounterStripes bounds a pool's stripes, which cost memory per pool.
const maxCounterStripes = 64

// newCounterStripes returns a pool's stripes: about two per core, a power
// of two.
func newCounterStripes() []poolCounters {
	n := 2 * runtime.GOMAXPROCS(0)
	return make([]poolCounters, min(1<<bits.Len(uint(n-1)), maxCounterStripes))
}

// stripe returns the stripe a session with process id id writes. The ids'
// low bits are uniform (keySource.processID), so sessions spread evenly.
// pgtender's own checkouts (login parameters, settings checks) use id 0.
func (st *poolStats) stripe(id uint32) *poolCounters {
	return &st.stripes[id&uint32(len(st.stripes)-1)]
}

// counterSums is a pool's poolCounters summed over its stripes.
type counterSums struct {
	transactions, queries, bytesReceived, bytesSent, assignments uint64
	waitTime                                                     time.Duration
	checkoutWait                                                 HistogramSnapshot
}

// sumStripes adds up st's stripes. Each counter only grows, so the sum of
// reads made one after the other never goes back between two calls.
func (st *poolStats) sumStripes() counterSums {
	var sums counterSums
	histograms := make([]*durationHistogram, len(st.stripes))
	for i := range st.stripes {
		c := &st.stripes[i]
		sums.transactions += c.transactions.Load()
		sums.queries += c.queries.Load()
		sums.bytesReceived += c.bytesReceived.Load()
		sums.bytesSent += c.bytesSent.Load()
		sums.assignments += c.assignments.Load()
		sums.waitTime += time.Duration(c.waitNanos.Load())
		histograms[i] = &c.checkoutWait
	}
	sums.checkoutWait = snapshotOf(histograms...)
	return sums
}

// PoolStats is a snapshot of one pool, named after PgBouncer's and PgDog's
// SHOW POOLS and SHOW STATS columns, which exporters already know.
type PoolStats struct {
	User, Database string
	Mode           config.PoolerMode
	Size           int

	ClientsActive  int // cl_active: clients with a server connection linked
	ClientsWaiting int // cl_waiting: clients waiting for a server connection
	// ClientsPinned: clients whose server connection is pinned to them in
	// transaction mode, because their session holds what cannot follow
	// them (LISTEN, advisory locks, temporary tables, WITH HOLD cursors,
	// SQL PREPARE, a custom parameter set under a name pgtender cannot see).
	ClientsPinned int

	// PreparedStatements: distinct renamed prepared statements the pool
	// knows (prepared.go); StatementParses: Parses of them pgtender sent
	// to server connections (a client's, renamed, or its own before a
	// Bind or Describe on a connection that lacked the statement);
	// StatementsEvicted: statements closed on a server connection to stay
	// within prepared_statements_limit.
	PreparedStatements int
	StatementParses    uint64
	StatementsEvicted  uint64

	ServersActive            int // sv_active: linked, the client's statement or transaction in progress
	ServersIdle              int // sv_idle: in the pool, ready
	ServersIdleInTransaction int // sv_idle_xact: linked, the client idle inside a transaction
	ServersTotal             int // sv_total: open or being opened
	ServersTested            int // sv_tested: running a health check

	// HealthChecks: health checks run on idle server connections, at
	// checkout or in the background; HealthCheckFailures: those that
	// failed and closed their connection.
	HealthChecks        uint64
	HealthCheckFailures uint64

	MaxWait time.Duration // maxwait: how long the oldest waiting client has waited

	Transactions      uint64        // total_xact_count: transactions (ReadyForQuery back to idle)
	Queries           uint64        // total_query_count: requests answered (Query, Sync, FunctionCall)
	BytesReceived     uint64        // total_received: bytes from clients
	BytesSent         uint64        // total_sent: bytes to clients
	WaitTime          time.Duration // total_wait_time: time clients spent waiting for a server connection
	ServerConnections uint64        // total_server_connections: server connections opened
	CheckoutTimeouts  uint64        // checkouts that gave up after checkout_timeout
	Logins            uint64        // total_client_login_count: clients logged in to the pool
	Assignments       uint64        // total_server_assignment_count: server connections given to clients
	CheckoutWait      HistogramSnapshot
}

// PoolStats returns a snapshot of every pool. It walks the sessions to
// classify linked server connections, so it costs O(clients) and is meant
// for scrapes and the admin console, not for the hot path.
func (p *Pooler) PoolStats() []PoolStats {
	order := p.poolList()
	pools := make(map[*Pool]*PoolStats, len(order))
	now := time.Now()
	for _, pool := range order {
		settings := pool.settings.Load()
		sums := pool.stats.sumStripes()
		st := &PoolStats{
			User: pool.key.user, Database: pool.key.database, Mode: settings.mode, Size: settings.size,
			Transactions:        sums.transactions,
			Queries:             sums.queries,
			BytesReceived:       sums.bytesReceived,
			BytesSent:           sums.bytesSent,
			WaitTime:            sums.waitTime,
			ServerConnections:   uint64(pool.stats.serverConnects.Load()),
			CheckoutTimeouts:    uint64(pool.stats.checkoutTimeouts.Load()),
			Logins:              pool.stats.logins.Load(),
			Assignments:         sums.assignments,
			CheckoutWait:        sums.checkoutWait,
			ClientsPinned:       int(pool.stats.pinnedClients.Load()),
			PreparedStatements:  pool.statements.len(),
			StatementParses:     pool.stats.statementParses.Load(),
			StatementsEvicted:   pool.stats.statementsEvicted.Load(),
			ServersTested:       int(pool.stats.beingChecked.Load()),
			HealthChecks:        pool.stats.healthChecks.Load(),
			HealthCheckFailures: pool.stats.healthCheckFailures.Load(),
		}
		pool.mu.Lock()
		st.ServersIdle = len(pool.idle)
		st.ServersTotal = pool.total
		st.ClientsWaiting = len(pool.waiters)
		if len(pool.waiters) > 0 {
			st.MaxWait = now.Sub(pool.waiters[0].since)
		}
		pool.mu.Unlock()
		pools[pool] = st
	}
	for _, s := range p.sessionList() {
		s.mu.Lock()
		sc := s.server
		idleInTransaction := sc != nil && s.link.idleInTransaction()
		s.mu.Unlock()
		if sc == nil {
			continue
		}
		st := pools[sc.pool]
		if st == nil {
			continue // a pool closed by a reload
		}
		st.ClientsActive++
		if idleInTransaction {
			st.ServersIdleInTransaction++
		} else {
			st.ServersActive++
		}
	}
	out := make([]PoolStats, 0, len(order))
	for _, pool := range order {
		out = append(out, *pools[pool])
	}
	return out
}

// ListenSocket is one worker's listening socket, for reading the kernel's
// accept-queue figures (TCP_INFO) at scrape time.
type ListenSocket struct {
	Worker int
	Addr   net.Addr
	Conn   syscall.RawConn
}

// ListenSockets returns the listening sockets (after Listen).
func (p *Pooler) ListenSockets() []ListenSocket {
	sockets := make([]ListenSocket, 0, len(p.listeners))
	for i, l := range p.listeners {
		raw, err := l.SyscallConn()
		if err != nil {
			continue
		}
		sockets = append(sockets, ListenSocket{Worker: i, Addr: l.Addr(), Conn: raw})
	}
	return sockets
}

// PassthroughVerifications counts what the passthrough registry did on its
// slow path since the pooler started (all zero without passthrough):
// round trips to Postgres by outcome (OK, Rejected, Error; background
// re-verifications included, a verification shared by several clients
// once), verifications not made because a failed-verification limit was
// reached (Throttled), and logins refused from the negative cache
// (CachedRejection). Logins with the verified password count nowhere.
type PassthroughVerifications struct {
	OK, Rejected, Error        uint64
	Throttled, CachedRejection uint64
}

// PassthroughVerifications returns the registry's counters now.
func (p *Pooler) PassthroughVerifications() PassthroughVerifications {
	s := p.registry.VerificationStats()
	return PassthroughVerifications{OK: s.OK, Rejected: s.Rejected, Error: s.Error,
		Throttled: s.Throttled, CachedRejection: s.CachedRejection}
}
