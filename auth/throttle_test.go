package auth

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtender/pgtender/config"
)

// TestThrottledRightPasswordWaitsForAToken: a fresh registry whose buckets
// wrong passwords emptied first (a restart, a misconfigured client on the
// same address). Right logins, concurrent with more wrong ones, must all
// be admitted: the right password has the most clients waiting on its
// verification, takes the waiting place and the next token. Postgres still sees no more than the
// bucket allows.
func TestThrottledRightPasswordWaitsForAToken(t *testing.T) {
	limit := Limit{Burst: 2, Every: 200 * time.Millisecond}
	for _, mode := range []config.PassthroughAuth{config.PassthroughEnabledPlain, config.PassthroughEnabledPlainAllowChange} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			r := newRegistry(t, mode, WithFailureLimits(limit, limit), WithThrottleWait(time.Second))
			pg := newFakePostgres(r, "alice", "pencil")
			addr := netip.MustParseAddr("127.0.0.1")
			// The buckets refill from their first use, in the drain, so the
			// refill periods of the run are counted from before it.
			start := time.Now()
			for i := range 2 * limit.Burst {
				err := r.Authenticate(ctx, Login{Key: alice, Password: fmt.Sprint("drain", i), ClientAddr: addr}, pg.verify)
				if !errors.Is(err, ErrPasswordMismatch) {
					t.Fatalf("draining: %v", err)
				}
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			var rightRefused, wrongThrottled int
			for i := range 200 {
				wg.Go(func() {
					err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil", ClientAddr: addr}, pg.verify)
					if err != nil {
						mu.Lock()
						rightRefused++
						mu.Unlock()
					}
				})
				wg.Go(func() {
					err := r.Authenticate(ctx, Login{Key: alice, Password: fmt.Sprint("guess", i), ClientAddr: addr}, pg.verify)
					switch {
					case err == ErrThrottled:
						mu.Lock()
						wrongThrottled++
						mu.Unlock()
					case !errors.Is(err, ErrPasswordMismatch):
						t.Errorf("wrong password: %v", err)
					}
				})
				time.Sleep(time.Millisecond)
			}
			wg.Wait()
			elapsed := time.Since(start)
			t.Logf("%d right logins refused, %d wrong throttled, %d verify calls, %v", rightRefused, wrongThrottled, pg.calls.Load(), elapsed)
			// The first right logins may be refused before more clients
			// wait on the right password than on a guess; a few at most.
			if rightRefused > 5 {
				t.Errorf("%d right logins refused, want at most 5", rightRefused)
			}
			if _, ok := r.Password(alice); !ok {
				t.Fatal("the right password was never verified")
			}
			// Attempts: the drain, then at most the burst again plus one per
			// refill period of the run, plus the right one.
			if max := int64(2*limit.Burst) + int64(elapsed/limit.Every) + 1 + 1; pg.calls.Load() > max {
				t.Errorf("%d verify calls, want at most %d", pg.calls.Load(), max)
			}
		})
	}
}

// TestThrottleWaitPlace: one verification per user waits; another with as
// many logins waiting on it is refused after joinGrace, one with more takes
// the place; Close ends the wait.
func TestThrottleWaitPlace(t *testing.T) {
	limit := Limit{Burst: 1, Every: time.Hour} // no refill within the test
	r := NewRegistry(config.PassthroughEnabledPlain, WithFailureLimits(limit, Limit{}), WithThrottleWait(time.Minute))
	pg := newFakePostgres(r, "alice", "pencil")
	ctx := context.Background()
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "drain"}, pg.verify); !errors.Is(err, ErrPasswordMismatch) {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { first <- r.Authenticate(ctx, Login{Key: alice, Password: "low"}, pg.verify) }()
	waitFor(t, "a verification to wait for a token", func() bool { return r.waiterOf("alice") != nil })
	// One login waits on it too: refused.
	start := time.Now()
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "other"}, pg.verify); err != ErrThrottled {
		t.Fatalf("second candidate with as many logins: %v, want ErrThrottled", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the refused candidate took %v, want about joinGrace", d)
	}
	// Two logins wait on "other": it evicts "low".
	second := make(chan error, 2)
	for range 2 {
		go func() { second <- r.Authenticate(ctx, Login{Key: alice, Password: "other"}, pg.verify) }()
	}
	if err := <-first; err != ErrThrottled {
		t.Fatalf("evicted verification: %v, want ErrThrottled", err)
	}
	r.Close()
	for range 2 {
		if err := <-second; err != ErrThrottled {
			t.Fatalf("waiting verification after Close: %v, want ErrThrottled", err)
		}
	}
	if n := pg.calls.Load(); n != 1 {
		t.Fatalf("%d verify calls, want 1", n)
	}
}

// waiterOf is the verification holding user's waiting place, or nil.
func (r *Registry) waiterOf(user string) *tokenWaiter {
	r.limiter.mu.Lock()
	defer r.limiter.mu.Unlock()
	return r.limiter.waiting[user]
}

// TestThrottleWaiterLeavesWithItsClients: when every login waiting on the
// verification in the waiting place gives up, it leaves the place and asks
// Postgres nothing, even once a token comes.
func TestThrottleWaiterLeavesWithItsClients(t *testing.T) {
	limit := Limit{Burst: 1, Every: 100 * time.Millisecond}
	r := newRegistry(t, config.PassthroughEnabledPlain, WithFailureLimits(limit, Limit{}), WithThrottleWait(time.Minute))
	pg := newFakePostgres(r, "alice", "pencil")
	if err := r.Authenticate(context.Background(), Login{Key: alice, Password: "drain"}, pg.verify); !errors.Is(err, ErrPasswordMismatch) {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify) }()
	waitFor(t, "a verification to wait for a token", func() bool { return r.waiterOf("alice") != nil })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled login: %v", err)
	}
	waitFor(t, "the waiter to leave", func() bool { return r.waiterOf("alice") == nil })
	time.Sleep(2 * limit.Every) // a token comes meanwhile
	if n := pg.calls.Load(); n != 1 {
		t.Fatalf("%d verify calls, want 1 (the drain): the abandoned waiter asked Postgres", n)
	}
	// The token is still there for the next verification.
	if err := r.Authenticate(context.Background(), Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
		t.Fatalf("next login: %v", err)
	}
}

// TestThrottleWaiterGetsTheNextToken: while a verification waits for the
// user's next token, a stream of other verifications (one login each) does
// not take it; the waiter does, about when it is due.
func TestThrottleWaiterGetsTheNextToken(t *testing.T) {
	limit := Limit{Burst: 1, Every: 150 * time.Millisecond}
	r := newRegistry(t, config.PassthroughEnabledPlain, WithFailureLimits(limit, Limit{}), WithThrottleWait(time.Second))
	pg := newFakePostgres(r, "alice", "pencil")
	ctx := context.Background()
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "drain"}, pg.verify); !errors.Is(err, ErrPasswordMismatch) {
		t.Fatal(err)
	}
	// Guesses verified before the right password: there must be none.
	var guessesFirst atomic.Int64
	verify := func(ctx context.Context, key Key, password string) error {
		if password == "pencil" {
			guessesFirst.Store(pg.calls.Load() - 1)
		}
		return pg.verify(ctx, key, password)
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, verify) }()
	waitFor(t, "a verification to wait for a token", func() bool { return r.waiterOf("alice") != nil })
	stop := floodGuesses(r, pg, 4, netip.Addr{})
	err := <-done
	elapsed := time.Since(start)
	stop()
	if err != nil {
		t.Fatalf("the waiting right password: %v", err)
	}
	if elapsed > limit.Every+200*time.Millisecond {
		t.Errorf("admitted after %v, want about %v", elapsed, limit.Every)
	}
	if n := guessesFirst.Load(); n != 0 {
		t.Fatalf("%d guesses verified before the waiting right password: they took its token", n)
	}
}

// floodGuesses has clients log in as alice from addr with distinct wrong
// passwords, one client each, back to back, until the returned stop.
func floodGuesses(r *Registry, pg *fakePostgres, clients int, addr netip.Addr) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range clients {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				r.Authenticate(context.Background(), Login{Key: alice, Password: fmt.Sprint("guess", g, "-", i), ClientAddr: addr}, pg.verify)
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

// TestThrottleDistinctGuessesDoNotLockOut: a flood of distinct guesses,
// each presented once (which filled the former per-shard demand table
// and left the right password at demand 1), does not keep out the right
// password presented by several clients at once.
func TestThrottleDistinctGuessesDoNotLockOut(t *testing.T) {
	limit := Limit{Burst: 2, Every: 200 * time.Millisecond}
	r := newRegistry(t, config.PassthroughEnabledPlain, WithFailureLimits(limit, limit), WithThrottleWait(time.Second))
	pg := newFakePostgres(r, "alice", "pencil")
	ctx := context.Background()
	addr := netip.MustParseAddr("192.0.2.1")
	defer floodGuesses(r, pg, 16, addr)()
	waitFor(t, "the guesses to empty the buckets", func() bool { return r.VerificationStats().Throttled > 300 })
	start := time.Now()
	var right sync.WaitGroup
	var admitted atomic.Int32
	for range 16 {
		right.Go(func() {
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				if r.Authenticate(ctx, Login{Key: alice, Password: "pencil", ClientAddr: addr}, pg.verify) == nil {
					admitted.Add(1)
					return
				}
			}
		})
	}
	right.Wait()
	if n := admitted.Load(); n != 16 {
		t.Fatalf("%d of 16 clients with the right password admitted within 3 s", n)
	}
	t.Logf("all admitted within %v", time.Since(start))
}

// TestLimiterReserveYieldsToWaiter: while a verification of a user waits
// for a token, reserve takes none for that user, unless the waiter is held
// back by its own address's bucket; other users are not affected.
func TestLimiterReserveYieldsToWaiter(t *testing.T) {
	limit := Limit{Burst: 1, Every: time.Second}
	now := time.Unix(1000, 0)
	var l limiter
	l.init(limit, limit)
	waiterAddr := netip.MustParseAddr("192.0.2.1")
	other := netip.MustParseAddr("192.0.2.2")
	w := &tokenWaiter{flight: &flight{}, evicted: make(chan struct{})}
	w.addr, w.hasAddr = addrKey(waiterAddr)
	l.waiting["alice"] = w
	if l.reserve("alice", other, now) {
		t.Fatal("reserve took alice's token while a verification of alice waits for it")
	}
	if !l.reserve("bob", other, now) {
		t.Fatal("a waiter for alice held back bob")
	}
	// The waiter's address is drained (by bob, say): it cannot use a token
	// of alice now, so it does not hold the others back.
	if !l.reserve("carol", waiterAddr, now) {
		t.Fatal("draining the waiter's address")
	}
	if !l.reserve("alice", netip.MustParseAddr("198.51.100.1"), now) {
		t.Fatal("a waiter held back by its own address refused alice from another one")
	}
	// The waiter itself reserves regardless.
	l.mu.Lock()
	ok, _ := l.reserveLocked("dave", waiterAddr, now.Add(limit.Every))
	l.mu.Unlock()
	if !ok {
		t.Fatal("the waiter's own reserve was refused")
	}
}
