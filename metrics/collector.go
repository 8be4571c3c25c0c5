package metrics

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pgtender/pgtender/pooler"
)

// Source is what the collector reads at scrape time. *pooler.Pooler
// implements it; tests use a fake.
type Source interface {
	PoolStats() []pooler.PoolStats
	ClientCount() int64
	ClientParking() pooler.ClientParking
	ListenSockets() []pooler.ListenSocket
	PassthroughVerifications() pooler.PassthroughVerifications
	CancelRequests() pooler.CancelRequests
	ClientTimeouts() pooler.ClientTimeouts
	ClientProtocolErrors() pooler.ClientProtocolErrors
	ServerTargets() []pooler.ServerTarget
}

var _ Source = (*pooler.Pooler)(nil)

// procNetstat is where the kernel's TcpExt counters of the process's network
// namespace are.
const procNetstat = "/proc/net/netstat"

// poolMetric is one per-pool family: its description and how to read it
// from a snapshot.
type poolMetric struct {
	desc      *prometheus.Desc
	valueType prometheus.ValueType
	value     func(*pooler.PoolStats) float64
}

// Collector is a prometheus.Collector over the pooler: pool figures, the
// client count and the kernel's accept-queue and conntrack drop figures,
// all read from their source when scraped. Nothing is kept between
// scrapes, so an idle endpoint costs nothing.
type Collector struct {
	source        Source
	log           *zap.Logger
	netstatPath   string
	conntrackPath string

	pool          []poolMetric
	checkoutWait  *prometheus.Desc
	clients       *prometheus.Desc
	parked, parks *prometheus.Desc
	parkReleases  *prometheus.Desc
	verifications *prometheus.Desc
	cancels       *prometheus.Desc
	timeouts      *prometheus.Desc
	protocolErrs  *prometheus.Desc

	serverReachable, serverConnects *prometheus.Desc

	queueLength, queueCapacity *prometheus.Desc
	overflows, drops           *prometheus.Desc

	conntrackDrops, conntrackEarlyDrops, conntrackInsertFailed *prometheus.Desc

	// Unreadable kernel figures are left out of the scrape and logged the
	// first time only, so a kernel without them does not fill the log.
	tcpInfoWarned, netstatWarned, conntrackWarned atomic.Bool
}

// NewCollector returns a collector over source whose metric names are
// prefixed by namespace (verbatim, as NewLoginRecorder). log may be nil.
func NewCollector(namespace string, source Source, log *zap.Logger) *Collector {
	if log == nil {
		log = zap.NewNop()
	}
	poolLabels := []string{"user", "database"}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(namespace+name, help, poolLabels, nil)
	}
	gauge := func(name, help string, value func(*pooler.PoolStats) float64) poolMetric {
		return poolMetric{desc(name, help), prometheus.GaugeValue, value}
	}
	// PgDog's names are kept, so dashboards written for PgDog work. Its
	// cumulative total_* figures (and sv_total, a current count) are
	// exposed untyped: promtool check metrics rejects a counter whose name
	// does not end in _total, any typed family ending in _count, and a
	// gauge ending in _total, but applies none of these rules to untyped
	// families. rate() and increase() work on them as on counters. See
	// docs/metrics.md.
	untyped := func(name, help string, value func(*pooler.PoolStats) float64) poolMetric {
		return poolMetric{desc(name, help), prometheus.UntypedValue, value}
	}
	c := &Collector{
		source:        source,
		log:           log,
		netstatPath:   procNetstat,
		conntrackPath: procConntrackStat,
		pool: []poolMetric{
			gauge("cl_active", "Clients linked to a server connection.",
				func(s *pooler.PoolStats) float64 { return float64(s.ClientsActive) }),
			gauge("cl_waiting", "Clients waiting for a server connection.",
				func(s *pooler.PoolStats) float64 { return float64(s.ClientsWaiting) }),
			gauge("cl_pinned", "Clients whose server connection is pinned to them in transaction mode: their session holds a LISTEN, an advisory lock, a temporary table, a WITH HOLD cursor, a SQL PREPAREd statement, or a custom parameter set under a name pgtender cannot see.",
				func(s *pooler.PoolStats) float64 { return float64(s.ClientsPinned) }),
			gauge("prepared_statements", "Distinct prepared statements of the pool's clients, renamed to pool-wide names (prepared_statements = \"extended\").",
				func(s *pooler.PoolStats) float64 { return float64(s.PreparedStatements) }),
			{desc("prepared_statement_parses_total", "Parses of renamed prepared statements sent to server connections: a client's own, or pgtender's before a Bind or Describe on a connection that lacked the statement."),
				prometheus.CounterValue, func(s *pooler.PoolStats) float64 { return float64(s.StatementParses) }},
			{desc("prepared_statements_evicted_total", "Prepared statements closed on a server connection to stay within prepared_statements_limit."),
				prometheus.CounterValue, func(s *pooler.PoolStats) float64 { return float64(s.StatementsEvicted) }},
			gauge("sv_active", "Server connections linked to a client whose statement or transaction is in progress.",
				func(s *pooler.PoolStats) float64 { return float64(s.ServersActive) }),
			gauge("sv_idle", "Server connections idle in the pool, ready to be taken.",
				func(s *pooler.PoolStats) float64 { return float64(s.ServersIdle) }),
			gauge("sv_idle_xact", "Server connections linked to a client that is idle inside a transaction.",
				func(s *pooler.PoolStats) float64 { return float64(s.ServersIdleInTransaction) }),
			gauge("sv_tested", "Server connections running a health check (healthcheck_interval at checkout, idle_healthcheck_interval in the background).",
				func(s *pooler.PoolStats) float64 { return float64(s.ServersTested) }),
			{desc("server_health_checks_total", "Health checks run on idle server connections (an empty query answered within healthcheck_timeout), at checkout or in the background."),
				prometheus.CounterValue, func(s *pooler.PoolStats) float64 { return float64(s.HealthChecks) }},
			{desc("server_health_check_failures_total", "Health checks that failed (no answer within healthcheck_timeout, an error, a closed connection); each closed its server connection before a client got it."),
				prometheus.CounterValue, func(s *pooler.PoolStats) float64 { return float64(s.HealthCheckFailures) }},
			untyped("sv_total", "Server connections open or being opened (a current count, not a counter).",
				func(s *pooler.PoolStats) float64 { return float64(s.ServersTotal) }),
			gauge("maxwait", "How long the oldest client waiting for a server connection has waited, in seconds (0 when none waits).",
				func(s *pooler.PoolStats) float64 { return s.MaxWait.Seconds() }),
			untyped("total_xact_count", "Transactions completed (the server connection went back to idle); cumulative.",
				func(s *pooler.PoolStats) float64 { return float64(s.Transactions) }),
			untyped("total_query_count", "Requests answered (simple Query, extended-protocol Sync, FunctionCall); cumulative.",
				func(s *pooler.PoolStats) float64 { return float64(s.Queries) }),
			untyped("total_received", "Bytes received from clients; cumulative.",
				func(s *pooler.PoolStats) float64 { return float64(s.BytesReceived) }),
			untyped("total_sent", "Bytes sent to clients; cumulative.",
				func(s *pooler.PoolStats) float64 { return float64(s.BytesSent) }),
			untyped("total_wait_time", "Time clients spent waiting for a server connection, in seconds; cumulative.",
				func(s *pooler.PoolStats) float64 { return s.WaitTime.Seconds() }),
			untyped("total_server_connections", "Server connections opened; cumulative.",
				func(s *pooler.PoolStats) float64 { return float64(s.ServerConnections) }),
			{desc("checkout_timeouts_total", "Clients that gave up waiting for a server connection after checkout_timeout."),
				prometheus.CounterValue, func(s *pooler.PoolStats) float64 { return float64(s.CheckoutTimeouts) }},
		},
		checkoutWait: desc("checkout_wait_seconds",
			"Time a client waited for a server connection, per checkout (a connection taken at once falls in the first bucket)."),
		clients: prometheus.NewDesc(namespace+"clients", "Client connections open, logged in or not.", nil, nil),
		parked: prometheus.NewDesc(namespace+"clients_parked",
			"Logged-in clients idle with no server connection that pgtender holds without a goroutine of their own (parked), part of clients.", nil, nil),
		parks: prometheus.NewDesc(namespace+"client_parks_total",
			"Times an idle client was parked; each request of a parked client resumes it.", nil, nil),
		parkReleases: prometheus.NewDesc(namespace+"client_park_memory_releases_total",
			"Times the memory that parked clients' goroutines freed was returned to the operating system (a forced collection), after many clients parked.", nil, nil),
		verifications: prometheus.NewDesc(namespace+"passthrough_verifications_total",
			"What the passthrough registry did with a password it had not verified: a round trip to Postgres (result ok, rejected, error), "+
				"none because a failed-verification limit was reached (throttled), or a refusal from the negative cache (cached_rejection).",
			[]string{"result"}, nil),
		cancels: prometheus.NewDesc(namespace+"cancel_requests_total",
			"CancelRequests received, by what became of them: forwarded to the backend serving the client (forwarded), "+
				"none sent because the client had no server connection (no_server), forwarding failed (error), "+
				"dropped because the key named no live client (unknown_key), "+
				"or took the client out of the queue it waited in for a server connection (while_waiting).",
			[]string{"result"}, nil),
		timeouts: prometheus.NewDesc(namespace+"client_timeouts_total",
			"Clients disconnected because a timeout ran out, by timeout: write (the client took none of pgtender's output within client_write_timeout), "+
				"idle_in_transaction (the client held a transaction open and sent nothing for client_idle_in_transaction_timeout), "+
				"query (a request was not answered within query_timeout).",
			[]string{"timeout"}, nil),
		protocolErrs: prometheus.NewDesc(namespace+"client_protocol_errors_total",
			"Logged-in clients disconnected with 08P01 because pgtender could not follow their messages, by reason: "+
				"malformed (a length word outside the protocol's bounds), too_large (a message longer than max_message_size), "+
				"unknown_type (a message of a type a logged-in client may not send).",
			[]string{"reason"}, nil),

		serverReachable: prometheus.NewDesc(namespace+"server_reachable",
			"1 while the Postgres server at this address answers pgtender's connects, 0 while it is down: new server connections to it then fail at once "+
				"and one probe at a time, with backoff, checks whether it is back.",
			[]string{"server"}, nil),
		serverConnects: prometheus.NewDesc(namespace+"server_connects_total",
			"Server connections pgtender tried to open, by how they ended: opened (ok), answered and refused (refused: credentials, database, TLS), "+
				"no answer or Postgres not accepting connections now (unreachable), not run to its end (abandoned: shutdown, or no connect slot within the caller's wait), "+
				"or failed at once without a connect because the server was down (not_attempted).",
			[]string{"server", "result"}, nil),

		queueLength: prometheus.NewDesc(namespace+"listen_queue_length",
			"Connections in a listening socket's accept queue: handshake completed, not yet accepted by pgtender (TCP_INFO tcpi_unacked). "+
				"The kernel queues one more than the capacity before it overflows.",
			[]string{"worker", "address"}, nil),
		queueCapacity: prometheus.NewDesc(namespace+"listen_queue_capacity",
			"Capacity of a listening socket's accept queue: listen_backlog as capped by net.core.somaxconn (TCP_INFO tcpi_sacked).",
			[]string{"worker", "address"}, nil),
		overflows: prometheus.NewDesc(namespace+"listen_overflows_total",
			"Times a listening socket's accept queue was full when a connection arrived (TcpExt ListenOverflows). "+
				"Counted for the whole network namespace, every process's listening sockets, not pgtender's alone.",
			nil, nil),
		drops: prometheus.NewDesc(namespace+"listen_drops_total",
			"Connection attempts dropped by listening sockets, overflows included (TcpExt ListenDrops). "+
				"Counted for the whole network namespace, every process's listening sockets, not pgtender's alone.",
			nil, nil),
		conntrackDrops: prometheus.NewDesc(namespace+"conntrack_drops_total",
			"Packets the kernel's connection tracking dropped because it could not track them, mostly a full table (nf_conntrack_max): "+
				"the drop column of /proc/net/stat/nf_conntrack, summed over CPUs. For the whole network namespace; absent where the kernel does not track connections.",
			nil, nil),
		conntrackEarlyDrops: prometheus.NewDesc(namespace+"conntrack_early_drops_total",
			"Tracking entries of not yet established connections the kernel evicted to make room in a full conntrack table: "+
				"the early_drop column of /proc/net/stat/nf_conntrack, summed over CPUs. For the whole network namespace; absent where the kernel does not track connections.",
			nil, nil),
		conntrackInsertFailed: prometheus.NewDesc(namespace+"conntrack_insert_failed_total",
			"Packets the kernel dropped because their new conntrack entry clashed with one inserted at the same moment (a race, or a NAT port clash): "+
				"the insert_failed column of /proc/net/stat/nf_conntrack, summed over CPUs. For the whole network namespace; absent where the kernel does not track connections.",
			nil, nil),
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.pool {
		ch <- m.desc
	}
	ch <- c.checkoutWait
	ch <- c.clients
	ch <- c.parked
	ch <- c.parks
	ch <- c.parkReleases
	ch <- c.verifications
	ch <- c.cancels
	ch <- c.timeouts
	ch <- c.protocolErrs
	ch <- c.serverReachable
	ch <- c.serverConnects
	ch <- c.queueLength
	ch <- c.queueCapacity
	ch <- c.overflows
	ch <- c.drops
	ch <- c.conntrackDrops
	ch <- c.conntrackEarlyDrops
	ch <- c.conntrackInsertFailed
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.clients, prometheus.GaugeValue, float64(c.source.ClientCount()))
	parking := c.source.ClientParking()
	ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(parking.Parked))
	ch <- prometheus.MustNewConstMetric(c.parks, prometheus.CounterValue, float64(parking.Parks))
	ch <- prometheus.MustNewConstMetric(c.parkReleases, prometheus.CounterValue, float64(parking.MemoryReleases))
	c.collectPools(ch)
	c.collectVerifications(ch)
	c.collectCancels(ch)
	c.collectTimeouts(ch)
	c.collectProtocolErrors(ch)
	c.collectServers(ch)
	c.collectListenQueues(ch)
	c.collectNetstat(ch)
	c.collectConntrack(ch)
}

func (c *Collector) collectVerifications(ch chan<- prometheus.Metric) {
	v := c.source.PassthroughVerifications()
	collectResults(ch, c.verifications, []resultCount{{"ok", v.OK}, {"rejected", v.Rejected}, {"error", v.Error},
		{"throttled", v.Throttled}, {"cached_rejection", v.CachedRejection}})
}

func (c *Collector) collectCancels(ch chan<- prometheus.Metric) {
	v := c.source.CancelRequests()
	collectResults(ch, c.cancels, []resultCount{{"forwarded", v.Forwarded}, {"no_server", v.NoServer},
		{"error", v.Error}, {"unknown_key", v.UnknownKey}, {"while_waiting", v.WhileWaiting}})
}

func (c *Collector) collectTimeouts(ch chan<- prometheus.Metric) {
	v := c.source.ClientTimeouts()
	collectResults(ch, c.timeouts, []resultCount{{"write", v.Write}, {"idle_in_transaction", v.IdleInTransaction}, {"query", v.Query}})
}

func (c *Collector) collectProtocolErrors(ch chan<- prometheus.Metric) {
	v := c.source.ClientProtocolErrors()
	collectResults(ch, c.protocolErrs, []resultCount{{"malformed", v.Malformed}, {"too_large", v.TooLarge}, {"unknown_type", v.UnknownType}})
}

func (c *Collector) collectServers(ch chan<- prometheus.Metric) {
	for _, target := range c.source.ServerTargets() {
		reachable := 0.0
		if target.Reachable {
			reachable = 1
		}
		ch <- prometheus.MustNewConstMetric(c.serverReachable, prometheus.GaugeValue, reachable, target.Address)
		for _, r := range []resultCount{{"ok", target.OK}, {"refused", target.Refused}, {"unreachable", target.Unreachable},
			{"abandoned", target.Abandoned}, {"not_attempted", target.NotAttempted}} {
			ch <- prometheus.MustNewConstMetric(c.serverConnects, prometheus.CounterValue, float64(r.n), target.Address, r.result)
		}
	}
}

// resultCount is one series of a counter with one label (result, timeout).
type resultCount struct {
	result string
	n      uint64
}

// collectResults sends every series of a counter with one label, zeros
// included, so each exists from the first scrape.
func collectResults(ch chan<- prometheus.Metric, desc *prometheus.Desc, counts []resultCount) {
	for _, r := range counts {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(r.n), r.result)
	}
}

func (c *Collector) collectPools(ch chan<- prometheus.Metric) {
	for _, stats := range c.source.PoolStats() {
		for _, m := range c.pool {
			ch <- prometheus.MustNewConstMetric(m.desc, m.valueType, m.value(&stats), stats.User, stats.Database)
		}
		wait := stats.CheckoutWait
		buckets := make(map[float64]uint64, len(wait.Bounds))
		for i, bound := range wait.Bounds {
			if i < len(wait.Cumulative) {
				buckets[bound] = wait.Cumulative[i]
			}
		}
		ch <- prometheus.MustNewConstHistogram(c.checkoutWait, wait.Count, wait.SumSeconds, buckets, stats.User, stats.Database)
	}
}
