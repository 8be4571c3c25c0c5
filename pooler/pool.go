package pooler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgtender/pgtender/config"
)

// poolKey names a pool: one per (user, database) as clients name them.
type poolKey struct {
	user, database string
}

func (k poolKey) String() string { return k.user + "@" + k.database }

// poolSettings is what a pool needs from the configuration. A reload that
// changes only sizes updates them in place; a change of anything a server
// connection depends on (endpoint, credentials, mode) replaces the pool.
type poolSettings struct {
	size            int
	minSize         int
	mode            config.PoolerMode
	idleTimeout     time.Duration
	serverLifetime  time.Duration
	checkoutTimeout time.Duration
	rollbackTimeout time.Duration
	// Health checks (healthCheck): at checkout, of a connection that has
	// not proved alive for healthcheckInterval; in the background
	// (Pooler.checkIdleConnections), of idle connections that have not for
	// idleHealthcheckInterval, from idleHealthcheckDelay after the pool
	// was made. Each must be answered within healthcheckTimeout. 0
	// intervals turn them off.
	healthcheckInterval     time.Duration
	healthcheckTimeout      time.Duration
	idleHealthcheckInterval time.Duration
	idleHealthcheckDelay    time.Duration
	// preparedStatements: clients' named prepared statements are renamed
	// (prepared.go), bounded per server connection by
	// preparedStatementsLimit (0: no bound).
	preparedStatements      bool
	preparedStatementsLimit int
}

// Pool holds the server connections of one (user, database). Acquire takes
// an idle connection, opens a new one while the pool is below its size, or
// waits in line (FIFO) for one to come back, up to checkout_timeout.
//
// mu guards idle, waiters, total, closed, paused and reconnectBefore;
// settings, counters and params are read without it.
type Pool struct {
	key       poolKey
	createdAt time.Time
	settings  atomic.Pointer[poolSettings]
	// connect opens a new authenticated server connection for this pool.
	connect func(ctx context.Context) (*ServerConn, error)

	mu      sync.Mutex
	idle    []*ServerConn // LIFO: the most recently used connection is warmest
	waiters []*poolWaiter // FIFO
	total   int           // open connections plus those being opened
	closed  bool
	// retired is closed, for readers without mu: a session looks at it
	// before each chunk it scans, to follow a pool a reload replaced
	// (session.followReplacedPool). removed: the reload that closed the
	// pool removed its database or user, so no pool replaces it and its
	// sessions end (session.endIfLeaving).
	retired, removed atomic.Bool
	// sweeping: a background health check of idle connections is running
	// (takeForIdleCheck).
	sweeping bool
	// reconnectBefore: connections opened before it are closed when they
	// come back rather than kept (reconnect).
	reconnectBefore time.Time
	// paused: the console's PAUSE holds the pool (pause). It gives clients
	// no connection and opens none; each connection that comes back is
	// closed, and clients wait in line until resume.
	paused bool

	// params is the ParameterStatus set sent to clients at login, as the
	// server connections opened last reported it (serverparams.go);
	// paramsMu serialises its writers.
	params   atomic.Pointer[[]serverParameter]
	paramsMu sync.Mutex

	// statements are the pool's prepared statements, renamed (prepared.go).
	statements statementRegistry

	// validSettings are the startup settings Postgres accepted
	// (checkStartupSettings).
	validSettings validSettings
	// sharedSettings are canonical startup settings built recently, which
	// the sessions that asked for the same ones share (settings.go).
	sharedSettings sharedSettings
	// customNames are the custom parameters ("app.tenant") any client of
	// the pool was seen to set (customSettings).
	customNames customSettings

	// endpoint is where and as whom the pool connects (without the
	// passthrough password); a reload that changes it replaces the pool.
	endpoint serverEndpoint

	growMu      sync.Mutex // guards growing, growBackoff, nextGrow
	growing     bool
	growBackoff time.Duration
	nextGrow    time.Time

	stats poolStats
}

// poolWaiter is a client waiting for a connection. The pool sends it a
// connection; capacityGranted to say that capacity is reserved for it and it
// should open a connection itself; or nil when the pool closed.
type poolWaiter struct {
	ch    chan *ServerConn // capacity 1: the pool never blocks handing over
	since time.Time        // when it started waiting, for maxwait
}

// capacityGranted is the signal value telling a waiter to open a connection.
var capacityGranted = new(ServerConn)

// serverParameter is one ParameterStatus value.
type serverParameter struct {
	name, value string
	key         string // settingKey(name), made once rather than at every login
}

// poolStats are the pool's counters, read by metrics and the admin console.
type poolStats struct {
	// stripes are the counters transactions move (poolCounters);
	// assignments there counts the server connections the pool gave
	// clients (server_assignment_count), pgtender's own checkouts (login
	// parameters, settings checks) not counted.
	stripes          []poolCounters
	checkoutTimeouts atomic.Int64
	serverConnects   atomic.Int64
	// logins counts the clients logged in to the pool (SHOW STATS's
	// client_login_count).
	logins atomic.Uint64
	// pinnedClients counts clients whose server connection is pinned to
	// them (sessionPins).
	pinnedClients atomic.Int64
	// statementParses counts Parses of renamed statements sent to server
	// connections; statementsEvicted the statements pgtender closed on a
	// server connection to stay within prepared_statements_limit.
	statementParses   atomic.Uint64
	statementsEvicted atomic.Uint64
	// healthChecks counts the health checks run (healthCheck), and
	// healthCheckFailures those that failed and closed their connection;
	// beingChecked is how many are running now (sv_tested).
	healthChecks        atomic.Uint64
	healthCheckFailures atomic.Uint64
	beingChecked        atomic.Int64
}

func newPool(key poolKey, settings poolSettings, connect func(ctx context.Context) (*ServerConn, error)) *Pool {
	p := &Pool{key: key, connect: connect, createdAt: time.Now()}
	p.stats.stripes = newCounterStripes()
	p.settings.Store(&settings)
	return p
}

// TryAcquireIdle returns an idle server connection, or nil when none is
// idle, without waiting. It is the fast path a client takes before it pays
// for a deadline (a timer) to wait with. A connection due for a health
// check (checkDue) is left to Acquire, whose checkout context bounds it.
func (p *Pool) TryAcquireIdle() *ServerConn {
	return p.tryAcquireIdle(nil, p.stats.stripe(0))
}

// tryAcquireIdle takes idle connections from the most recently used until
// one passes the peek (idleAndAlive) and, when due, a health check bounded
// by ctx; it closes the others and gives their capacity to the first
// waiter. With a nil ctx it checks nothing, and stops at a connection due
// for a check. The checkout is counted in counters, the caller's stripe.
func (p *Pool) tryAcquireIdle(ctx context.Context, counters *poolCounters) *ServerConn {
	settings := p.settings.Load()
	var now time.Time
	if settings.healthcheckInterval > 0 {
		now = time.Now()
	}
	p.mu.Lock()
	for !p.closed && !p.paused && len(p.idle) > 0 {
		n := len(p.idle)
		sc := p.idle[n-1]
		due := settings.healthcheckInterval > 0 && now.Sub(sc.aliveAt) >= settings.healthcheckInterval
		if due && ctx == nil {
			break
		}
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		if sc.idleAndAlive() && (!due || p.checkAtCheckout(ctx, sc, settings.healthcheckTimeout)) {
			counters.checkoutWait.observe(0)
			return sc
		}
		sc.close()
		p.mu.Lock()
		p.total--
		p.handOffCapacityLocked()
	}
	p.mu.Unlock()
	return nil
}

// checkAtCheckout health-checks sc, idle and not proved alive for
// healthcheck_interval, before it goes to a client (PgBouncer's
// server_check_delay, PgDog's healthcheck_interval): a connection that
// passes the peek may still be dead without a word (the network path, a
// NAT or a firewall in between, or the host went away). The check is
// bounded by timeout and by ctx, the checkout's (checkout_timeout, the
// client leaving or canceling, shutdown), so that several dead idle
// connections cost a client no more than its checkout. The caller closes
// one that fails.
func (p *Pool) checkAtCheckout(ctx context.Context, sc *ServerConn, timeout time.Duration) bool {
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	return p.healthCheck(ctx, sc, timeout) == nil
}

// healthCheck runs sc's health check and counts it. On success sc has
// proved alive now; on failure the caller closes it (its reply may be
// half read).
func (p *Pool) healthCheck(ctx context.Context, sc *ServerConn, timeout time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err // not a check: the caller is giving up (shutdown, a client gone)
	}
	p.stats.beingChecked.Add(1)
	err := sc.check(ctx, timeout)
	p.stats.beingChecked.Add(-1)
	p.stats.healthChecks.Add(1)
	if err != nil {
		p.stats.healthCheckFailures.Add(1)
		return err
	}
	sc.aliveAt = time.Now()
	return nil
}

// Acquire returns a server connection for the caller's exclusive use; the
// caller must give it back with Release or Discard. It waits at most until
// ctx ends and returns ErrCheckoutTimeout (or ErrPoolClosed) then.
func (p *Pool) Acquire(ctx context.Context) (*ServerConn, error) {
	return p.acquire(ctx, p.stats.stripe(0))
}

// acquire is Acquire counting the checkout in counters, the caller's
// stripe.
func (p *Pool) acquire(ctx context.Context, counters *poolCounters) (*ServerConn, error) {
	for {
		if sc := p.tryAcquireIdle(ctx, counters); sc != nil {
			return sc, nil
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrPoolClosed
		}
		if p.paused {
			break // in line until resume
		}
		if len(p.idle) > 0 {
			p.mu.Unlock() // one came back meanwhile
			continue
		}
		if p.total < p.settings.Load().size {
			p.total++
			p.mu.Unlock()
			start := time.Now()
			sc, err := p.open(ctx)
			if err == nil {
				counters.checkoutWait.observe(time.Since(start))
			}
			return sc, err
		}
		break
	}
	start := time.Now()
	waiter := &poolWaiter{ch: make(chan *ServerConn, 1), since: start}
	p.waiters = append(p.waiters, waiter)
	p.mu.Unlock()

	defer func() {
		waited := time.Since(start)
		counters.waitNanos.Add(int64(waited))
		counters.checkoutWait.observe(waited)
	}()
	select {
	case sc := <-waiter.ch:
		switch sc {
		case nil:
			return nil, ErrPoolClosed
		case capacityGranted:
			return p.open(ctx)
		}
		return sc, nil
	case <-ctx.Done():
		// A deadline is checkout_timeout; a cancellation is shutdown.
		failure := ErrCheckoutTimeout
		if errors.Is(ctx.Err(), context.Canceled) {
			failure = ctx.Err()
		} else {
			p.stats.checkoutTimeouts.Add(1)
		}
		p.mu.Lock()
		for i, w := range p.waiters {
			if w == waiter {
				p.waiters = append(p.waiters[:i], p.waiters[i+1:]...)
				p.mu.Unlock()
				return nil, failure
			}
		}
		p.mu.Unlock()
		// The pool handed us something just as we gave up: pass it on.
		switch sc := <-waiter.ch; sc {
		case nil:
		case capacityGranted:
			p.mu.Lock()
			p.total--
			p.handOffCapacityLocked()
			p.mu.Unlock()
		default:
			p.Release(sc)
		}
		return nil, failure
	}
}

// open opens a connection for capacity already counted in total.
func (p *Pool) open(ctx context.Context) (*ServerConn, error) {
	sc, err := p.connect(ctx)
	if errors.Is(err, errConnectGoesOn) {
		// The connect keeps the capacity until it ends, then hands the
		// connection to the pool (connectFinished) or gives the capacity
		// back (connectFailed), so that a server that stalls never has
		// more connects from this pool in flight than its size.
		return nil, fmt.Errorf("%w: opening a server connection: %w", ErrCheckoutTimeout, err)
	}
	if err != nil {
		p.mu.Lock()
		p.total--
		p.handOffCapacityLocked()
		p.mu.Unlock()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			return nil, fmt.Errorf("%w: opening a server connection: %w", ErrCheckoutTimeout, err)
		}
		return nil, err
	}
	p.adopt(sc)
	return sc, nil
}

// adopt makes a newly opened server connection one of the pool's: it is
// counted, and its ParameterStatus set becomes the one clients get.
func (p *Pool) adopt(sc *ServerConn) {
	p.stats.serverConnects.Add(1)
	sc.pool = p
	p.storeParams(sc)
}

// connectFinished takes a connection whose connect outlived the caller
// that counted its capacity (open).
func (p *Pool) connectFinished(sc *ServerConn) {
	p.adopt(sc)
	p.Release(sc)
}

// connectFailed gives back the capacity of a connect that outlived its
// caller and failed.
func (p *Pool) connectFailed() {
	p.mu.Lock()
	p.total--
	p.handOffCapacityLocked()
	p.mu.Unlock()
}

// openIdle opens one connection in the background and puts it in the pool,
// if the pool holds fewer than limit (counting those being opened): the
// maintenance loop's growth towards min_pool_size (Pooler.growPool), and
// the probe of a down server, whose limit is the pool's size
// (Pooler.probeDownServers).
func (p *Pool) openIdle(ctx context.Context, limit int) error {
	p.mu.Lock()
	if p.closed || p.paused || p.total >= limit {
		p.mu.Unlock()
		return nil
	}
	p.total++
	p.mu.Unlock()
	sc, err := p.open(ctx)
	if err != nil {
		return err
	}
	p.Release(sc)
	return nil
}

// handOffCapacityLocked gives freed capacity to the first waiter, who opens
// a connection itself. p.mu must be held.
func (p *Pool) handOffCapacityLocked() {
	if len(p.waiters) == 0 || p.closed || p.paused || p.total >= p.settings.Load().size {
		return
	}
	waiter := p.waiters[0]
	p.waiters = p.waiters[1:]
	p.total++
	waiter.ch <- capacityGranted
}

// Release gives a clean server connection (outside any transaction, at a
// message boundary) back to the pool.
func (p *Pool) Release(sc *ServerConn) {
	settings := p.settings.Load()
	now := time.Now()
	if settings.serverLifetime > 0 && now.Sub(sc.createdAt) > settings.serverLifetime {
		p.Discard(sc)
		return
	}
	sc.aliveAt = now
	p.putBack(sc, now)
}

// putBack gives sc to the first waiter, or makes it idle since idleSince:
// now for a connection a client released, or the time it went idle for
// one a background health check took out (returnChecked). The idle list is
// kept in idleSince order, so that the most recently used connection is
// taken first and the others can age out by idle_timeout.
func (p *Pool) putBack(sc *ServerConn, idleSince time.Time) {
	p.mu.Lock()
	if p.closed || p.paused || p.total > p.settings.Load().size {
		p.total--
		p.mu.Unlock()
		sc.close()
		return
	}
	if sc.createdAt.Before(p.reconnectBefore) {
		// Replaced by a RECONNECT: a waiter opens a new one instead.
		p.total--
		p.handOffCapacityLocked()
		p.mu.Unlock()
		sc.close()
		return
	}
	if len(p.waiters) > 0 {
		waiter := p.waiters[0]
		p.waiters = p.waiters[1:]
		p.mu.Unlock()
		waiter.ch <- sc
		return
	}
	sc.idleSince = idleSince
	i := len(p.idle)
	for i > 0 && p.idle[i-1].idleSince.After(idleSince) {
		i--
	}
	p.idle = slices.Insert(p.idle, i, sc)
	p.mu.Unlock()
}

// takeForIdleCheck takes out of the idle list, for a background health
// check, the connections that have not proved alive for interval, unless a
// check of this pool is running already; they stay counted in total.
// The caller must pass them to checkIdle.
func (p *Pool) takeForIdleCheck(now time.Time, interval time.Duration) []*ServerConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.sweeping {
		return nil
	}
	var due []*ServerConn
	kept := p.idle[:0]
	for _, sc := range p.idle {
		if now.Sub(sc.aliveAt) >= interval {
			due = append(due, sc)
			continue
		}
		kept = append(kept, sc)
	}
	clear(p.idle[len(kept):])
	p.idle = kept
	p.sweeping = len(due) > 0
	return due
}

// checkIdle health-checks the connections takeForIdleCheck took out, all
// at once, each bounded by timeout, so that a stalled network path costs
// one timeout, not one per connection. A connection that passes goes back
// to the idle list where it was (its idle_timeout clock keeps running);
// one that fails is closed. It returns how many failed, and the first
// failure.
//
// The background check finds the connections that died without a word (a
// network path, NAT or firewall that dropped them, a host that went away)
// before a client gets one: the peek at checkout cannot tell them from
// idle ones. PgDog's idle check (pgdog/src/backend/pool/monitor.rs) checks
// one connection per pool and interval; this checks each, so that none is
// found dead by a client.
func (p *Pool) checkIdle(ctx context.Context, due []*ServerConn, timeout time.Duration) (failed int, first error) {
	defer func() {
		p.mu.Lock()
		p.sweeping = false
		p.mu.Unlock()
	}()
	errs := make([]error, len(due))
	var checks sync.WaitGroup
	for i, sc := range due {
		checks.Add(1)
		go func() {
			defer checks.Done()
			if errs[i] = p.healthCheck(ctx, sc, timeout); errs[i] != nil {
				p.Discard(sc)
				return
			}
			if lifetime := p.settings.Load().serverLifetime; lifetime > 0 && time.Since(sc.createdAt) > lifetime {
				p.Discard(sc) // as Release does: it may go to a waiter next
				return
			}
			p.putBack(sc, sc.idleSince)
		}()
	}
	checks.Wait()
	for _, err := range errs {
		if err == nil {
			continue
		}
		if failed++; first == nil {
			first = err
		}
	}
	return failed, first
}

// Discard closes a server connection that must not be reused (broken,
// dirty, or past its lifetime) and lets a waiter open a replacement.
func (p *Pool) Discard(sc *ServerConn) {
	sc.close()
	p.mu.Lock()
	p.total--
	p.handOffCapacityLocked()
	p.mu.Unlock()
}

// Add puts a connection opened outside the pool (the one that verified a
// passthrough password) into it, or closes it when the pool is full.
func (p *Pool) Add(sc *ServerConn) {
	p.mu.Lock()
	if p.closed || p.paused || p.total >= p.settings.Load().size {
		p.mu.Unlock()
		sc.close()
		return
	}
	p.total++
	p.mu.Unlock()
	p.adopt(sc)
	p.Release(sc)
}

// parameters returns the ParameterStatus set for a client login, opening a
// server connection first when the pool has never had one.
func (p *Pool) parameters(ctx context.Context) ([]serverParameter, error) {
	if params := p.params.Load(); params != nil {
		return *params, nil
	}
	sc, err := p.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	p.Release(sc)
	if params := p.params.Load(); params != nil {
		return *params, nil
	}
	return nil, nil
}

// maintain closes connections idle longer than idle_timeout (keeping
// min_pool_size) or older than server_lifetime, and reports how many
// connections the pool should open to get back to min_pool_size.
func (p *Pool) maintain(now time.Time) (missing int) {
	settings := p.settings.Load()
	var expired []*ServerConn
	p.mu.Lock()
	kept := p.idle[:0]
	for i, sc := range p.idle {
		// The idle slice is LIFO, so the oldest idle connections come first.
		tooIdle := settings.idleTimeout > 0 && now.Sub(sc.idleSince) > settings.idleTimeout && p.total > settings.minSize
		tooOld := settings.serverLifetime > 0 && now.Sub(sc.createdAt) > settings.serverLifetime
		if tooIdle || tooOld || p.closed {
			expired = append(expired, sc)
			p.total--
			p.idle[i] = nil
			continue
		}
		kept = append(kept, sc)
	}
	for i := len(kept); i < len(p.idle); i++ {
		p.idle[i] = nil
	}
	p.idle = kept
	if !p.closed && !p.paused && p.total < settings.minSize {
		missing = settings.minSize - p.total
	}
	p.mu.Unlock()
	for _, sc := range expired {
		sc.close()
	}
	return missing
}

// resize applies new settings; capacity a larger size frees goes to the
// clients already waiting.
func (p *Pool) resize(settings poolSettings) {
	p.settings.Store(&settings)
	p.mu.Lock()
	p.grantCapacityLocked()
	p.mu.Unlock()
}

// grantCapacityLocked hands capacity to waiters for as long as there are
// waiters and the pool is below its size. p.mu must be held.
func (p *Pool) grantCapacityLocked() {
	for len(p.waiters) > 0 && !p.closed && !p.paused && p.total < p.settings.Load().size {
		p.handOffCapacityLocked()
	}
}

// Background growth backs off from minGrowBackoff doubling to
// maxGrowBackoff after each failure.
const (
	minGrowBackoff = time.Second
	maxGrowBackoff = time.Minute
)

// growAllowed reports whether a background grow may start now, and marks
// one as running if so.
func (p *Pool) growAllowed(now time.Time) bool {
	p.growMu.Lock()
	defer p.growMu.Unlock()
	if p.growing || now.Before(p.nextGrow) {
		return false
	}
	p.growing = true
	return true
}

// growDone records the end of a background grow and its backoff.
func (p *Pool) growDone(now time.Time, err error) {
	p.growMu.Lock()
	defer p.growMu.Unlock()
	p.growing = false
	if err == nil {
		p.growBackoff = 0
		return
	}
	p.growBackoff = min(max(2*p.growBackoff, minGrowBackoff), maxGrowBackoff)
	p.nextGrow = now.Add(p.growBackoff)
}

// close stops the pool: idle connections are closed now, linked ones when
// they come back, and waiters get ErrPoolClosed.
func (p *Pool) close() {
	p.mu.Lock()
	p.closed = true
	p.retired.Store(true)
	idle := p.takeIdleLocked()
	waiters := p.waiters
	p.waiters = nil
	p.mu.Unlock()
	for _, sc := range idle {
		sc.close()
	}
	for _, w := range waiters {
		w.ch <- nil
	}
}

// reconnect replaces the pool's server connections without failing a
// client, as PgBouncer's RECONNECT does: the idle ones are closed now, and
// those in use are closed when their client gives them back (putBack);
// new ones are opened as clients need them. It returns how many idle
// connections it closed.
func (p *Pool) reconnect(now time.Time) int {
	p.mu.Lock()
	p.reconnectBefore = now
	idle := p.takeIdleLocked()
	p.mu.Unlock()
	for _, sc := range idle {
		sc.close()
	}
	return len(idle)
}

// takeIdleLocked empties the idle list and uncounts its connections, which
// the caller closes (outside p.mu). p.mu must be held.
func (p *Pool) takeIdleLocked() []*ServerConn {
	idle := p.idle
	p.idle = nil
	p.total -= len(idle)
	return idle
}

// pause holds the pool for PAUSE, as PgBouncer's pause mode does
// (src/janitor.c, per_loop_pause): no client is given a connection and
// none is opened; the idle connections are taken out now, for the caller
// to close, and the others are closed as their clients give them back
// (putBack), so that the pool holds no connection once the transactions
// in flight have ended (drained). Clients that want one wait in line,
// their checkout_timeout running, until resume.
func (p *Pool) pause() []*ServerConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
	return p.takeIdleLocked()
}

// resume ends a pause: the clients waiting get capacity to open
// connections, up to the pool's size.
func (p *Pool) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = false
	p.grantCapacityLocked()
}

// drained reports whether the pool holds no server connection, open or
// being opened: a paused pool is so once its last client gave its
// connection back.
func (p *Pool) drained() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total == 0
}

// poolSnapshot is a pool's occupancy at one moment, for tests and logs;
// Pooler.PoolStats is the full picture metrics and the admin console read.
type poolSnapshot struct {
	User, Database string
	Mode           config.PoolerMode
	Size           int
	Idle           int
	Total          int
	Waiting        int
}

// snapshot returns the pool's occupancy now.
func (p *Pool) snapshot() poolSnapshot {
	settings := p.settings.Load()
	p.mu.Lock()
	defer p.mu.Unlock()
	return poolSnapshot{
		User: p.key.user, Database: p.key.database, Mode: settings.mode, Size: settings.size,
		Idle: len(p.idle), Total: p.total, Waiting: len(p.waiters),
	}
}
