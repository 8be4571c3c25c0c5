package pooler

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/pooler/wire"
)

// Unit tests of Pool with server connections over net.Pipe: no Postgres,
// only the pool's bookkeeping (waiters, capacity, timeouts, maintenance).

// pipeConns opens fake server connections for a pool and counts them.
type pipeConns struct {
	t       testing.TB
	opened  atomic.Int64
	closed  atomic.Int64
	drained sync.WaitGroup
	// fail, when set, is returned by the next connect calls.
	mu    sync.Mutex
	fail  error
	block chan struct{} // when set, connect waits for it to close
	conns []net.Conn
	// answer, set before the first connect, makes the far end answer
	// each simple Query (a health check) with EmptyQueryResponse and
	// ReadyForQuery, counted in queries; while stalled, it reads them and
	// answers nothing, as over a network path that stopped carrying data.
	answer  bool
	stalled atomic.Bool
	queries atomic.Int64
}

func newPipeConns(t testing.TB) *pipeConns {
	pc := &pipeConns{t: t}
	t.Cleanup(func() {
		// Connections a test left checked out end here.
		pc.mu.Lock()
		for _, c := range pc.conns {
			c.Close()
		}
		pc.mu.Unlock()
		pc.drained.Wait()
	})
	return pc
}

// connect is a Pool connect func.
func (pc *pipeConns) connect(ctx context.Context) (*ServerConn, error) {
	pc.mu.Lock()
	fail, block := pc.fail, pc.block
	pc.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if fail != nil {
		return nil, fail
	}
	client, server := net.Pipe()
	pc.drained.Add(1)
	go func() {
		// The far end reads what the pool writes (Terminate) until the
		// connection is closed.
		defer pc.drained.Done()
		defer server.Close()
		if pc.answer {
			pc.answerQueries(server)
			return
		}
		_, _ = io.Copy(io.Discard, server)
	}()
	pc.mu.Lock()
	pc.conns = append(pc.conns, client)
	pc.mu.Unlock()
	id := pc.opened.Add(1)
	now := time.Now()
	sc := &ServerConn{
		conn:      &countingConn{Conn: client, closed: &pc.closed},
		buf:       make([]byte, 64),
		processID: uint32(id),
		createdAt: now,
		idleSince: now,
		aliveAt:   now,
	}
	sc.scanner.Inspect = inspectServerMessage
	return sc, nil
}

// answerQueries is the far end of a connection for pc.answer.
func (pc *pipeConns) answerQueries(server net.Conn) {
	header := make([]byte, 5)
	for {
		if _, err := io.ReadFull(server, header); err != nil {
			return
		}
		body := make([]byte, int(binary.BigEndian.Uint32(header[1:]))-4)
		if _, err := io.ReadFull(server, body); err != nil {
			return
		}
		if header[0] != wire.MsgQuery {
			continue
		}
		pc.queries.Add(1)
		if pc.stalled.Load() {
			continue
		}
		reply := []byte{'I', 0, 0, 0, 4, wire.MsgReadyForQuery, 0, 0, 0, 5, wire.TxIdle}
		if _, err := server.Write(reply); err != nil {
			return
		}
	}
}

func (pc *pipeConns) open() int64 { return pc.opened.Load() - pc.closed.Load() }

// countingConn counts Close calls (once per connection).
type countingConn struct {
	net.Conn
	once   sync.Once
	closed *atomic.Int64
}

func (c *countingConn) Close() error {
	c.once.Do(func() { c.closed.Add(1) })
	return c.Conn.Close()
}

func testPool(t testing.TB, settings poolSettings) (*Pool, *pipeConns) {
	pc := newPipeConns(t)
	if settings.mode == "" {
		settings.mode = config.PoolerModeTransaction
	}
	pool := newPool(poolKey{user: "u", database: "d"}, settings, pc.connect)
	t.Cleanup(func() {
		pool.close()
	})
	return pool, pc
}

func mustAcquire(t testing.TB, pool *Pool) *ServerConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	sc, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return sc
}

type acquired struct {
	sc  *ServerConn
	err error
}

// goAcquire starts an Acquire bounded by timeout and waits until it is in
// the pool's waiter list (the pool must be exhausted).
func goAcquire(t testing.TB, pool *Pool, timeout time.Duration) <-chan acquired {
	t.Helper()
	before := pool.snapshot().Waiting
	ch := make(chan acquired, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		sc, err := pool.Acquire(ctx)
		ch <- acquired{sc, err}
	}()
	waitFor(t, "the Acquire to wait in line", func() bool { return pool.snapshot().Waiting == before+1 })
	return ch
}

// TestPoolWaitersServedFIFO: connections coming back go to waiters in the
// order they started waiting, handed over directly.
func TestPoolWaitersServedFIFO(t *testing.T) {
	pool, pc := testPool(t, poolSettings{size: 1})
	sc := mustAcquire(t, pool)
	var waiters []<-chan acquired
	for range 4 {
		waiters = append(waiters, goAcquire(t, pool, waitTimeout))
	}
	held := sc
	for i, w := range waiters {
		pool.Release(held)
		got := recvWithin(t, w, "waiter to be served")
		if got.err != nil {
			t.Fatalf("waiter %d: %v", i, got.err)
		}
		if got.sc != sc {
			t.Fatalf("waiter %d got connection %d, want the released %d", i, got.sc.processID, sc.processID)
		}
		for j, later := range waiters[i+1:] {
			if !notYet(later) {
				t.Fatalf("waiter %d served before waiter %d", i+1+j, i)
			}
		}
		held = got.sc
	}
	pool.Release(held)
	if st := pool.snapshot(); st.Idle != 1 || st.Total != 1 || st.Waiting != 0 {
		t.Errorf("pool %+v, want 1 idle of 1, no waiters", st)
	}
	if n := pc.opened.Load(); n != 1 {
		t.Errorf("opened %d connections, want 1", n)
	}
}

// TestPoolReleaseHandsOverDirectly: a connection released while a client
// waits goes to that client without passing through the idle list.
func TestPoolReleaseHandsOverDirectly(t *testing.T) {
	pool, _ := testPool(t, poolSettings{size: 1})
	sc := mustAcquire(t, pool)
	w := goAcquire(t, pool, waitTimeout)
	pool.Release(sc)
	if st := pool.snapshot(); st.Idle != 0 || st.Waiting != 0 {
		t.Errorf("pool %+v right after the hand-over, want nothing idle and nobody waiting", st)
	}
	got := recvWithin(t, w, "waiter")
	if got.err != nil || got.sc != sc {
		t.Fatalf("waiter got %v, %v; want the released connection", got.sc, got.err)
	}
	pool.Release(got.sc)
}

// TestPoolAcquireTimesOut: Acquire gives up when its context ends, with
// ErrCheckoutTimeout, and leaves the waiter list.
func TestPoolAcquireTimesOut(t *testing.T) {
	pool, _ := testPool(t, poolSettings{size: 1})
	sc := mustAcquire(t, pool)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := pool.Acquire(ctx)
	if !errors.Is(err, ErrCheckoutTimeout) {
		t.Fatalf("Acquire on an exhausted pool: %v, want ErrCheckoutTimeout", err)
	}
	if elapsed := time.Since(start); elapsed < 50*time.Millisecond || elapsed > 5*time.Second {
		t.Errorf("Acquire gave up after %v, want about 50ms", elapsed)
	}
	if st := pool.snapshot(); st.Waiting != 0 || st.Total != 1 {
		t.Errorf("pool %+v after the timeout, want no waiters and 1 connection", st)
	}
	if n := pool.stats.checkoutTimeouts.Load(); n != 1 {
		t.Errorf("checkout timeouts counted %d, want 1", n)
	}
	// A context that already ended fails at once.
	_, err = pool.Acquire(ctx)
	if !errors.Is(err, ErrCheckoutTimeout) {
		t.Errorf("Acquire with an ended context: %v, want ErrCheckoutTimeout", err)
	}
	pool.Release(sc)
	got := mustAcquire(t, pool)
	if got != sc {
		t.Error("the pool did not keep its connection across the timeouts")
	}
	pool.Release(got)
}

// TestPoolAcquireCanceledIsNotATimeout: a wait ended by cancellation (the
// pooler's context, canceled by Shutdown) is not a checkout timeout: the
// session maps context.Canceled to 57P03 "pool closed", but Acquire turns
// every ended context into ErrCheckoutTimeout, so a client waiting when the
// pooler shuts down can be told 53300 "within checkout_timeout", and the
// timeout counter (a metric) counts shutdowns.
func TestPoolAcquireCanceledIsNotATimeout(t *testing.T) {
	pool, _ := testPool(t, poolSettings{size: 1})
	sc := mustAcquire(t, pool)
	defer pool.Release(sc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan acquired, 1)
	go func() {
		sc, err := pool.Acquire(ctx)
		done <- acquired{sc, err}
	}()
	waitFor(t, "the Acquire to wait in line", func() bool { return pool.snapshot().Waiting == 1 })
	cancel()
	got := recvWithin(t, done, "the canceled Acquire")
	if errors.Is(got.err, ErrCheckoutTimeout) || !errors.Is(got.err, context.Canceled) {
		t.Errorf("canceled Acquire: %v, want an error wrapping context.Canceled, not ErrCheckoutTimeout", got.err)
	}
	if n := pool.stats.checkoutTimeouts.Load(); n != 0 {
		t.Errorf("checkout timeouts counted %d for a cancellation", n)
	}
}

// TestPoolDiscardLetsWaiterOpenReplacement: discarding a broken connection
// frees its capacity for the first waiter, who opens a new one.
func TestPoolDiscardLetsWaiterOpenReplacement(t *testing.T) {
	pool, pc := testPool(t, poolSettings{size: 1})
	sc := mustAcquire(t, pool)
	w := goAcquire(t, pool, waitTimeout)
	pool.Discard(sc)
	got := recvWithin(t, w, "waiter")
	if got.err != nil {
		t.Fatalf("waiter: %v", got.err)
	}
	if got.sc == sc {
		t.Fatal("waiter got the discarded connection")
	}
	if pc.opened.Load() != 2 || pc.closed.Load() != 1 {
		t.Errorf("opened %d, closed %d; want 2 and 1", pc.opened.Load(), pc.closed.Load())
	}
	if st := pool.snapshot(); st.Total != 1 {
		t.Errorf("pool %+v, want 1 connection", st)
	}
	pool.Release(got.sc)
}

// TestPoolConnectFailureHandsCapacityOn: when opening a connection fails,
// its reserved capacity goes to the next waiter instead of being lost.
func TestPoolConnectFailureHandsCapacityOn(t *testing.T) {
	pool, pc := testPool(t, poolSettings{size: 1})
	block := make(chan struct{})
	refused := errors.New("connection refused")
	pc.mu.Lock()
	pc.block, pc.fail = block, refused
	pc.mu.Unlock()

	first := make(chan acquired, 1)
	go func() {
		sc, err := pool.Acquire(context.Background())
		first <- acquired{sc, err}
	}()
	waitFor(t, "the first Acquire to start connecting", func() bool { return pool.snapshot().Total == 1 })
	second := goAcquire(t, pool, waitTimeout)

	// The first connect fails; the second succeeds.
	pc.mu.Lock()
	pc.block, pc.fail = nil, nil
	pc.mu.Unlock()
	close(block)
	if got := recvWithin(t, first, "first Acquire"); !errors.Is(got.err, refused) {
		t.Fatalf("first Acquire: %v, want the connect error", got.err)
	}
	got := recvWithin(t, second, "second Acquire")
	if got.err != nil {
		t.Fatalf("second Acquire: %v", got.err)
	}
	if st := pool.snapshot(); st.Total != 1 || st.Waiting != 0 {
		t.Errorf("pool %+v, want 1 connection, nobody waiting", st)
	}
	pool.Release(got.sc)
}

// TestPoolCloseWakesWaiters: closing the pool fails every waiter and every
// later Acquire with ErrPoolClosed, and connections given back are closed.
func TestPoolCloseWakesWaiters(t *testing.T) {
	pool, pc := testPool(t, poolSettings{size: 2})
	a, b := mustAcquire(t, pool), mustAcquire(t, pool)
	pool.Release(b)
	b = mustAcquire(t, pool)
	w1, w2 := goAcquire(t, pool, waitTimeout), goAcquire(t, pool, waitTimeout)
	pool.close()
	for i, w := range []<-chan acquired{w1, w2} {
		if got := recvWithin(t, w, "waiter"); !errors.Is(got.err, ErrPoolClosed) {
			t.Errorf("waiter %d: %v, want ErrPoolClosed", i, got.err)
		}
	}
	if _, err := pool.Acquire(context.Background()); !errors.Is(err, ErrPoolClosed) {
		t.Errorf("Acquire after close: %v, want ErrPoolClosed", err)
	}
	pool.Release(a)
	pool.Discard(b)
	if st := pool.snapshot(); st.Total != 0 || st.Idle != 0 {
		t.Errorf("pool %+v after every connection came back, want empty", st)
	}
	if n := pc.open(); n != 0 {
		t.Errorf("%d connections left open", n)
	}
}

// TestPoolMaintain: idle connections past idle_timeout are closed down to
// min_pool_size (keeping the most recently used); connections past
// server_lifetime are closed whatever the minimum, and maintain reports how
// many are missing.
func TestPoolMaintain(t *testing.T) {
	pool, pc := testPool(t, poolSettings{size: 3, minSize: 1, idleTimeout: time.Minute, serverLifetime: time.Hour})
	scs := []*ServerConn{mustAcquire(t, pool), mustAcquire(t, pool), mustAcquire(t, pool)}
	for _, sc := range scs {
		pool.Release(sc)
	}
	now := time.Now()
	if missing := pool.maintain(now.Add(30 * time.Second)); missing != 0 {
		t.Errorf("maintain before idle_timeout reported %d missing", missing)
	}
	if st := pool.snapshot(); st.Idle != 3 {
		t.Fatalf("pool %+v before idle_timeout, want 3 idle", st)
	}

	if missing := pool.maintain(now.Add(2 * time.Minute)); missing != 0 {
		t.Errorf("maintain reported %d missing, want 0 (min_pool_size kept)", missing)
	}
	if st := pool.snapshot(); st.Idle != 1 || st.Total != 1 {
		t.Fatalf("pool %+v after idle_timeout, want 1 idle of 1", st)
	}
	if pc.closed.Load() != 2 {
		t.Errorf("closed %d connections, want 2", pc.closed.Load())
	}
	if kept := mustAcquire(t, pool); kept != scs[2] {
		t.Errorf("kept connection %d, want the most recently released %d", kept.processID, scs[2].processID)
	} else {
		pool.Release(kept)
	}

	// Past server_lifetime even the minimum goes, and is reported missing.
	if missing := pool.maintain(now.Add(2 * time.Hour)); missing != 1 {
		t.Errorf("maintain after server_lifetime reported %d missing, want 1", missing)
	}
	if st := pool.snapshot(); st.Total != 0 {
		t.Errorf("pool %+v after server_lifetime, want empty", st)
	}

	// openIdle opens one connection towards the minimum, and none once it
	// is reached.
	for range 2 {
		if err := pool.openIdle(context.Background(), 1); err != nil {
			t.Fatalf("openIdle: %v", err)
		}
	}
	if st := pool.snapshot(); st.Idle != 1 || st.Total != 1 {
		t.Errorf("pool %+v after openIdle, want 1 idle", st)
	}
	if missing := pool.maintain(time.Now()); missing != 0 {
		t.Errorf("maintain after grow reported %d missing", missing)
	}
}

// TestPoolReleasePastLifetimeDiscards: a connection older than
// server_lifetime is closed when it comes back, and a waiter opens a fresh
// one.
func TestPoolReleasePastLifetimeDiscards(t *testing.T) {
	pool, pc := testPool(t, poolSettings{size: 1, serverLifetime: time.Hour})
	sc := mustAcquire(t, pool)
	sc.createdAt = time.Now().Add(-2 * time.Hour)
	w := goAcquire(t, pool, waitTimeout)
	pool.Release(sc)
	got := recvWithin(t, w, "waiter")
	if got.err != nil || got.sc == sc {
		t.Fatalf("waiter got %v, %v; want a new connection", got.sc, got.err)
	}
	if pc.closed.Load() != 1 {
		t.Errorf("closed %d connections, want the old one", pc.closed.Load())
	}
	pool.Release(got.sc)
}

// TestPoolAcquireSkipsDeadIdleConnection: an idle connection whose server
// went away (readable EOF) is closed at checkout and replaced.
func TestPoolAcquireSkipsDeadIdleConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var peers []net.Conn
	defer func() {
		for _, c := range peers {
			c.Close()
		}
	}()
	opened := 0
	connect := func(ctx context.Context) (*ServerConn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			return nil, err
		}
		peer, err := ln.Accept()
		if err != nil {
			conn.Close()
			return nil, err
		}
		peers = append(peers, peer)
		opened++
		sc := &ServerConn{conn: conn, buf: make([]byte, 64), processID: uint32(opened), createdAt: time.Now()}
		sc.scanner.Inspect = inspectServerMessage
		return sc, nil
	}
	pool := newPool(poolKey{user: "u", database: "d"}, poolSettings{size: 1, mode: config.PoolerModeTransaction}, connect)
	defer pool.close()
	sc := mustAcquire(t, pool)
	pool.Release(sc)
	if again := mustAcquire(t, pool); again != sc {
		t.Fatal("a live idle connection was not reused")
	}
	pool.Release(sc)

	peers[0].Close() // the server ends the idle session
	waitFor(t, "the close to be readable", func() bool { return !sc.idleAndAlive() })
	fresh := mustAcquire(t, pool)
	if fresh == sc {
		t.Fatal("Acquire returned an idle connection whose server had closed it")
	}
	if st := pool.snapshot(); st.Total != 1 {
		t.Errorf("pool %+v, want 1 connection", st)
	}
	pool.Release(fresh)
}

// TestPoolAccountingUnderContention: many clients acquiring with short
// timeouts, releasing and discarding at random never push the pool past
// its size, lose capacity, or leak connections.
func TestPoolAccountingUnderContention(t *testing.T) {
	const size = 3
	pool, pc := testPool(t, poolSettings{size: size})
	var wg sync.WaitGroup
	var inUse, maxInUse atomic.Int64
	var served atomic.Int64
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 200 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(2000))*time.Microsecond)
				sc, err := pool.Acquire(ctx)
				cancel()
				if err != nil {
					if !errors.Is(err, ErrCheckoutTimeout) {
						t.Errorf("Acquire: %v", err)
						return
					}
					continue
				}
				served.Add(1)
				n := inUse.Add(1)
				for {
					m := maxInUse.Load()
					if n <= m || maxInUse.CompareAndSwap(m, n) {
						break
					}
				}
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				}
				inUse.Add(-1)
				if rng.IntN(5) == 0 {
					pool.Discard(sc)
				} else {
					pool.Release(sc)
				}
			}
		}()
	}
	wg.Wait()
	if served.Load() == 0 {
		t.Fatal("no Acquire succeeded")
	}
	if m := maxInUse.Load(); m > size {
		t.Errorf("%d connections in use at once, pool size %d", m, size)
	}
	st := pool.snapshot()
	if st.Waiting != 0 || st.Total != st.Idle || st.Total > size {
		t.Errorf("pool %+v at rest, want no waiters and every connection idle (at most %d)", st, size)
	}
	if n := pc.open(); n != int64(st.Total) {
		t.Errorf("%d connections open, pool counts %d", n, st.Total)
	}
	// All the capacity is still usable.
	var scs []*ServerConn
	for range size {
		scs = append(scs, mustAcquire(t, pool))
	}
	for _, sc := range scs {
		pool.Release(sc)
	}
}

// TestPoolReconnect: RECONNECT closes the idle connections at once, and
// one in use when it comes back, handing its capacity to a waiter, who
// opens a new connection; a connection opened after it is kept.
func TestPoolReconnect(t *testing.T) {
	pool, pc := testPool(t, poolSettings{size: 2})
	inUse, idle := mustAcquire(t, pool), mustAcquire(t, pool)
	pool.Release(idle)
	time.Sleep(time.Millisecond) // the mark must come after the connections' creation
	if closed := pool.reconnect(time.Now()); closed != 1 {
		t.Fatalf("reconnect closed %d idle connections, want 1", closed)
	}
	if st := pool.snapshot(); st.Idle != 0 || st.Total != 1 {
		t.Fatalf("after reconnect: %+v, want the one in use only", st)
	}
	// The pool is below its size again: a checkout opens a new connection.
	fresh := mustAcquire(t, pool)
	if fresh == idle || fresh == inUse {
		t.Fatal("a checkout after RECONNECT got an old connection")
	}
	w := goAcquire(t, pool, waitTimeout)
	pool.Release(inUse) // old: closed, its capacity to the waiter
	got := recvWithin(t, w, "second waiter")
	if got.err != nil || got.sc == inUse {
		t.Fatalf("waiter got %v, %v; want a new connection", got.sc, got.err)
	}
	pool.Release(got.sc)
	pool.Release(fresh)
	if st := pool.snapshot(); st.Idle != 2 || st.Total != 2 {
		t.Errorf("new connections back: %+v, want 2 idle", st)
	}
	if pc.opened.Load() != 4 || pc.closed.Load() != 2 {
		t.Errorf("opened %d, closed %d; want 4 and 2", pc.opened.Load(), pc.closed.Load())
	}
}

// TestPoolPause: a pause closes the idle connections at once and each
// busy one when it comes back, gives waiters nothing (not even capacity a
// closed connection freed) and opens nothing for min_pool_size; resume
// gives the waiters capacity to open new connections.
func TestPoolPause(t *testing.T) {
	pool, pc := testPool(t, poolSettings{size: 2, minSize: 2})
	inUse, idle := mustAcquire(t, pool), mustAcquire(t, pool)
	pool.Release(idle)
	for _, sc := range pool.pause() {
		sc.close()
	}
	if st := pool.snapshot(); st.Idle != 0 || st.Total != 1 || pool.drained() {
		t.Fatalf("after pause: %+v, drained %v; want the one in use only", st, pool.drained())
	}
	if missing := pool.maintain(time.Now()); missing != 0 {
		t.Errorf("maintain wants %d connections opened while paused, want 0", missing)
	}
	if err := pool.openIdle(context.Background(), 2); err != nil || pc.opened.Load() != 2 {
		t.Errorf("openIdle while paused: %v, opened %d; want nothing opened", err, pc.opened.Load())
	}
	if sc := pool.TryAcquireIdle(); sc != nil {
		t.Fatal("TryAcquireIdle gave a connection while paused")
	}
	// Below its size, a paused pool still makes a client wait.
	w := goAcquire(t, pool, waitTimeout)
	pool.Release(inUse)
	if st := pool.snapshot(); st.Total != 0 || st.Waiting != 1 || !pool.drained() {
		t.Fatalf("the last connection back: %+v; want it closed and the waiter still waiting", st)
	}
	select {
	case got := <-w:
		t.Fatalf("a waiter was served while paused: %v, %v", got.sc, got.err)
	case <-time.After(20 * time.Millisecond):
	}
	pool.resume()
	got := recvWithin(t, w, "waiter after resume")
	if got.err != nil || got.sc == inUse || got.sc == idle {
		t.Fatalf("waiter got %v, %v; want a new connection", got.sc, got.err)
	}
	pool.Release(got.sc)
	if pc.opened.Load() != 3 || pc.closed.Load() != 2 {
		t.Errorf("opened %d, closed %d; want 3 and 2", pc.opened.Load(), pc.closed.Load())
	}
}
