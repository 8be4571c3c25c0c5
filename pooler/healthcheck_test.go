package pooler

import (
	"context"
	"testing"
	"time"
)

// Health checks of idle server connections (Pool.checkAtCheckout at checkout,
// Pool.takeForIdleCheck and Pool.checkIdle in the background), against
// fake server connections that answer the empty query or stall.

// answeringPool is a pool whose connections answer health checks.
func answeringPool(t *testing.T, settings poolSettings) (*Pool, *pipeConns) {
	t.Helper()
	pool, pc := testPool(t, settings)
	pc.answer = true
	return pool, pc
}

// provedAliveLongAgo makes sc due for any health check.
func provedAliveLongAgo(sc *ServerConn) { sc.aliveAt = time.Now().Add(-time.Hour) }

func TestHealthCheckAtCheckout(t *testing.T) {
	pool, pc := answeringPool(t, poolSettings{size: 1, healthcheckInterval: time.Minute, healthcheckTimeout: 200 * time.Millisecond})

	first := mustAcquire(t, pool)
	pool.Release(first)
	if sc := pool.TryAcquireIdle(); sc != first {
		t.Fatalf("TryAcquireIdle = %v, want the connection just released", sc)
	} else {
		pool.Release(sc)
	}
	if n := pc.queries.Load(); n != 0 {
		t.Fatalf("a connection released just now was checked (%d queries); it proved alive when its transaction ended", n)
	}

	// Due for a check: the fast path leaves it to Acquire, which checks it
	// under the checkout's context.
	provedAliveLongAgo(first)
	if sc := pool.TryAcquireIdle(); sc != nil {
		t.Fatal("TryAcquireIdle handed out a connection due for a health check")
	}
	if n, idle := pc.queries.Load(), pool.snapshot().Idle; n != 0 || idle != 1 {
		t.Fatalf("after TryAcquireIdle: %d queries, %d idle; want the connection left idle, unchecked", n, idle)
	}
	sc := mustAcquire(t, pool)
	if sc != first {
		t.Fatalf("Acquire = %v, want the idle connection, which answers its check", sc)
	}
	if n := pc.queries.Load(); n != 1 {
		t.Fatalf("the server got %d queries, want 1 health check for a connection not proved alive for healthcheck_interval", n)
	}
	if time.Since(sc.aliveAt) > time.Minute {
		t.Error("the passed check did not record the connection as alive")
	}
	pool.Release(sc)

	// The path stalls: the check goes unanswered, the connection is closed
	// and the client gets a new one.
	pc.stalled.Store(true)
	provedAliveLongAgo(first)
	second := mustAcquire(t, pool)
	if second == first {
		t.Fatal("Acquire handed over the connection whose check went unanswered")
	}
	if got := pool.stats.healthChecks.Load(); got != 2 {
		t.Errorf("healthChecks = %d, want 2", got)
	}
	if got := pool.stats.healthCheckFailures.Load(); got != 1 {
		t.Errorf("healthCheckFailures = %d, want 1", got)
	}
	if got := pc.closed.Load(); got != 1 {
		t.Errorf("%d connections closed, want 1: the one that failed its check", got)
	}
	if got := pool.snapshot().Total; got != 1 {
		t.Errorf("total = %d, want 1 (the failed connection's capacity given back)", got)
	}
	pool.Release(second)
}

// TestFailedCheckoutCheckServesAWaiter: a client that waits for the pool
// while another's checkout check runs gets the capacity the failed check
// frees, not a checkout timeout.
func TestFailedCheckoutCheckServesAWaiter(t *testing.T) {
	pool, pc := answeringPool(t, poolSettings{size: 1, healthcheckInterval: time.Minute, healthcheckTimeout: 300 * time.Millisecond})
	sc := mustAcquire(t, pool)
	pool.Release(sc)
	provedAliveLongAgo(sc)
	pc.stalled.Store(true)
	checking := make(chan acquired, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got, err := pool.Acquire(ctx)
		checking <- acquired{got, err}
	}()
	waitFor(t, "the checkout check to run", func() bool { return pool.stats.beingChecked.Load() == 1 })
	waiter := goAcquire(t, pool, 5*time.Second)
	// The waiter was first in line when the check failed: it gets the
	// freed capacity (a new connection), and the checking client the
	// connection once the waiter releases it.
	w := <-waiter
	if w.err != nil {
		t.Fatalf("the waiting client: %v; want a connection opened with the failed check's capacity", w.err)
	}
	if w.sc == sc {
		t.Fatal("the waiting client got the connection that failed its check")
	}
	pool.Release(w.sc)
	c := <-checking
	if c.err != nil || c.sc != w.sc {
		t.Fatalf("the checking client: %v, %v; want the connection the waiter released", c.sc, c.err)
	}
	pool.Release(c.sc)
}

// TestCheckoutChecksAreBoundedByTheCheckout: dead idle connections cost a
// client at most its checkout's deadline, however many there are.
func TestCheckoutChecksAreBoundedByTheCheckout(t *testing.T) {
	pool, pc := answeringPool(t, poolSettings{size: 3, healthcheckInterval: time.Minute, healthcheckTimeout: time.Hour})
	conns := []*ServerConn{mustAcquire(t, pool), mustAcquire(t, pool), mustAcquire(t, pool)}
	for _, sc := range conns {
		pool.Release(sc)
		provedAliveLongAgo(sc)
	}
	pc.stalled.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		sc, err := pool.Acquire(ctx)
		if err == nil {
			pool.Release(sc)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			// The checks ran out of the checkout's time one after the
			// other; a new connection (which is not checked) served it.
			t.Logf("served by a new connection after the checks failed")
		}
	case <-time.After(waitTimeout):
		t.Fatal("a checkout with a 300 ms deadline was still checking dead connections after 10 s (healthcheck_timeout is an hour)")
	}
}

func TestHealthCheckAtCheckoutTurnedOff(t *testing.T) {
	pool, pc := answeringPool(t, poolSettings{size: 1, healthcheckTimeout: time.Second})
	sc := mustAcquire(t, pool)
	pool.Release(sc)
	provedAliveLongAgo(sc)
	if got := mustAcquire(t, pool); got != sc {
		t.Fatalf("TryAcquireIdle = %v, want the idle connection", got)
	}
	if n := pc.queries.Load(); n != 0 {
		t.Errorf("healthcheck_interval = 0 still checked (%d queries)", n)
	}
	pool.Release(sc)
}

func TestIdleHealthCheckKeepsOrderAndIdleClock(t *testing.T) {
	pool, pc := answeringPool(t, poolSettings{size: 3, idleHealthcheckInterval: time.Minute, healthcheckTimeout: time.Second})
	conns := []*ServerConn{mustAcquire(t, pool), mustAcquire(t, pool), mustAcquire(t, pool)}
	for _, sc := range conns {
		pool.Release(sc)
		time.Sleep(time.Millisecond) // distinct idleSince, in release order
	}
	middle := conns[1]
	idleSince := middle.idleSince
	provedAliveLongAgo(middle)

	due := pool.takeForIdleCheck(time.Now(), time.Minute)
	if len(due) != 1 || due[0] != middle {
		t.Fatalf("takeForIdleCheck took %d connections, want only the one not proved alive for the interval", len(due))
	}
	if got := pool.snapshot().Idle; got != 2 {
		t.Errorf("idle = %d during the check, want 2: a connection being checked is not handed out", got)
	}
	if failed, err := pool.checkIdle(context.Background(), due, time.Second); failed != 0 {
		t.Fatalf("checkIdle: %d failed (%v), want 0", failed, err)
	}
	if n := pc.queries.Load(); n != 1 {
		t.Errorf("the server got %d queries, want 1", n)
	}
	pool.mu.Lock()
	order := append([]*ServerConn(nil), pool.idle...)
	pool.mu.Unlock()
	if len(order) != 3 || order[0] != conns[0] || order[1] != middle || order[2] != conns[2] {
		t.Errorf("idle order after the check is not the release order: the checked connection moved")
	}
	if !middle.idleSince.Equal(idleSince) {
		t.Errorf("the check moved idleSince from %v to %v: idle_timeout would never close a checked connection", idleSince, middle.idleSince)
	}
	if time.Since(middle.aliveAt) > time.Minute {
		t.Error("the passed check did not record the connection as alive")
	}
	if due := pool.takeForIdleCheck(time.Now(), time.Minute); len(due) != 0 {
		t.Errorf("a second sweep right after took %d connections, want 0", len(due))
	}
}

// TestIdleHealthCheckClosesConnectionsOnAStalledPath: every due connection
// is checked at once, and each that gets no answer within the timeout is
// closed; a sweep does not start while one runs.
func TestIdleHealthCheckClosesConnectionsOnAStalledPath(t *testing.T) {
	pool, pc := answeringPool(t, poolSettings{size: 3})
	conns := []*ServerConn{mustAcquire(t, pool), mustAcquire(t, pool), mustAcquire(t, pool)}
	for _, sc := range conns {
		pool.Release(sc)
		provedAliveLongAgo(sc)
	}
	pc.stalled.Store(true)
	due := pool.takeForIdleCheck(time.Now(), time.Minute)
	if len(due) != 3 {
		t.Fatalf("takeForIdleCheck took %d, want 3", len(due))
	}
	type result struct {
		failed int
		err    error
	}
	done := make(chan result, 1)
	go func() {
		failed, err := pool.checkIdle(context.Background(), due, 2*time.Second)
		done <- result{failed, err}
	}()
	waitFor(t, "all three checks to run at once", func() bool { return pool.stats.beingChecked.Load() == 3 })
	if again := pool.takeForIdleCheck(time.Now(), 0); again != nil {
		t.Errorf("a second sweep started while one runs (took %d)", len(again))
	}
	r := <-done
	if r.failed != 3 || r.err == nil || !isTimeout(r.err) {
		t.Fatalf("checkIdle = %d failed, first %v; want 3 timeouts", r.failed, r.err)
	}
	if got := pc.closed.Load(); got != 3 {
		t.Errorf("%d connections closed, want 3", got)
	}
	snap := pool.snapshot()
	if snap.Idle != 0 || snap.Total != 0 {
		t.Errorf("after the sweep idle = %d, total = %d; want 0 and 0", snap.Idle, snap.Total)
	}
	if got := pool.stats.healthCheckFailures.Load(); got != 3 {
		t.Errorf("healthCheckFailures = %d, want 3", got)
	}
	if got := pool.stats.beingChecked.Load(); got != 0 {
		t.Errorf("beingChecked = %d after the sweep, want 0", got)
	}
}

// TestIdleHealthCheckEndsAtShutdown: a check waiting on a stalled path ends
// when its context does, not at its timeout.
func TestIdleHealthCheckEndsAtShutdown(t *testing.T) {
	pool, pc := answeringPool(t, poolSettings{size: 1})
	sc := mustAcquire(t, pool)
	pool.Release(sc)
	provedAliveLongAgo(sc)
	pc.stalled.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		failed, _ := pool.checkIdle(ctx, pool.takeForIdleCheck(time.Now(), time.Minute), time.Hour)
		done <- failed
	}()
	waitFor(t, "the check to wait", func() bool { return pc.queries.Load() == 1 })
	cancel()
	select {
	case failed := <-done:
		if failed != 1 {
			t.Errorf("failed = %d, want 1", failed)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the check outlived its context")
	}
}
