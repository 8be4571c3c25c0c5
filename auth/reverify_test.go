package auth

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtender/pgtender/config"
)

const testInterval = time.Minute

// warmRegistry is a registry with a fake clock and reverify interval
// testInterval, in which alice has logged in with "pencil".
func warmRegistry(t *testing.T, mode config.PassthroughAuth) (*Registry, *fakePostgres, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	r := newRegistry(t, mode, withClock(clock.Now), WithReverifyInterval(testInterval))
	pg := newFakePostgres(r, "alice", "pencil")
	if err := r.Authenticate(context.Background(), Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
		t.Fatal(err)
	}
	return r, pg, clock
}

func (r *Registry) entryOf(key Key) *entry {
	return r.snaps[r.shardIndex(key)].Load().entries[key]
}

func TestReverifyAcceptedRefreshes(t *testing.T) {
	ctx := context.Background()
	r, pg, clock := warmRegistry(t, config.PassthroughEnabled)
	first := r.entryOf(alice)
	clock.Advance(testInterval - time.Second)
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil || pg.calls.Load() != 1 {
		t.Fatalf("before the interval: err %v, calls %d; want no re-verification", err, pg.calls.Load())
	}
	clock.Advance(time.Second)
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
		t.Fatalf("due login: %v", err)
	}
	waitFor(t, "the entry to be refreshed", func() bool { return r.entryOf(alice) != first })
	e := r.entryOf(alice)
	if pg.calls.Load() != 2 || !e.verified.Equal(clock.Now()) || e.due != r.since(clock.Now().Add(testInterval)) || e.password != "pencil" {
		t.Fatalf("after re-verification: calls %d, verified %v, due %v", pg.calls.Load(), e.verified, e.due)
	}
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil || pg.calls.Load() != 2 {
		t.Fatalf("fresh again: err %v, calls %d", err, pg.calls.Load())
	}
}

func TestReverifyRejectedRemoves(t *testing.T) {
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			r, pg, clock := warmRegistry(t, mode)
			pg.setPassword("alice", "changed") // ALTER ROLE, no client knows it yet
			clock.Advance(testInterval)
			// Admitted from the snapshot while the check runs…
			if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
				t.Fatalf("due login: %v", err)
			}
			waitFor(t, "the entry to be removed", func() bool { _, ok := r.Password(alice); return !ok })
			// …and refused after it, from the negative cache.
			calls := pg.calls.Load()
			for range 10 {
				if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != ErrCachedRejection {
					t.Fatalf("old password after the check: %v", err)
				}
			}
			if pg.calls.Load() != calls {
				t.Fatalf("the rejected password went to Postgres again: %d calls, want %d", pg.calls.Load(), calls)
			}
			// The new password is a first password, in every mode.
			if err := r.Authenticate(ctx, Login{Key: alice, Password: "changed"}, pg.verify); err != nil {
				t.Fatalf("new password: %v", err)
			}
		})
	}
}

func TestReverifyTransientErrorKeeps(t *testing.T) {
	ctx := context.Background()
	r, pg, clock := warmRegistry(t, config.PassthroughEnabled)
	pg.mu.Lock()
	pg.down = errors.New("dial tcp: connection refused")
	pg.mu.Unlock()
	first := r.entryOf(alice)
	clock.Advance(testInterval)
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
		t.Fatalf("due login: %v", err)
	}
	waitFor(t, "the check to finish", func() bool { return r.entryOf(alice) != first })
	if pg.calls.Load() != 2 {
		t.Fatalf("calls = %d, want 2", pg.calls.Load())
	}
	// Kept, admitting, and not re-checked at once on every login.
	for range 10 {
		if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
			t.Fatalf("login with Postgres down: %v", err)
		}
	}
	if pg.calls.Load() != 2 {
		t.Fatalf("calls = %d right after a failed check, want 2", pg.calls.Load())
	}
	if e := r.entryOf(alice); !e.verified.Equal(first.verified) {
		t.Fatal("a failed check refreshed the verification time")
	}
	// Postgres is back: the next use after the retry delay checks again.
	pg.mu.Lock()
	pg.down = nil
	pg.mu.Unlock()
	second := r.entryOf(alice)
	clock.Advance(reverifyRetryDelay)
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the retry", func() bool { return r.entryOf(alice) != second })
	if e := r.entryOf(alice); pg.calls.Load() != 3 || !e.verified.Equal(clock.Now()) {
		t.Fatalf("retry: calls %d, verified %v", pg.calls.Load(), e.verified)
	}
}

func TestReverifyOnePerKey(t *testing.T) {
	const logins = 100
	ctx := context.Background()
	r, pg, clock := warmRegistry(t, config.PassthroughEnabled)
	pg.gate = make(chan struct{})
	clock.Advance(testInterval)
	var wg sync.WaitGroup
	for range logins {
		wg.Go(func() {
			// Admitted at once although the check is blocked.
			if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
				t.Errorf("login: %v", err)
			}
		})
	}
	wg.Wait()
	waitFor(t, "the check to start", func() bool { return pg.calls.Load() == 2 })
	close(pg.gate)
	waitFor(t, "the check to finish", func() bool { return r.entryOf(alice).verified.Equal(clock.Now()) })
	if got := pg.calls.Load(); got != 2 {
		t.Fatalf("verify calls = %d for %d due logins, want 1 + 1", got, logins)
	}
}

func TestReverifyOff(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	r := newRegistry(t, config.PassthroughEnabled, withClock(clock.Now), WithReverifyInterval(0))
	pg := newFakePostgres(r, "alice", "pencil")
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
		t.Fatal(err)
	}
	clock.Advance(24 * 365 * time.Hour)
	for range 10 {
		if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
			t.Fatal(err)
		}
	}
	if pg.calls.Load() != 1 {
		t.Fatalf("verify calls = %d with re-verification off, want 1", pg.calls.Load())
	}
}

func TestReverifyNewerPasswordWins(t *testing.T) {
	// Under allow_change, a new password verified while the old one is
	// being re-verified is not removed by the old one's rejection.
	ctx := context.Background()
	r, pg, clock := warmRegistry(t, config.PassthroughEnabledPlainAllowChange)
	pg.setPassword("alice", "new")
	gate := make(chan struct{})
	var checks sync.WaitGroup
	checks.Add(1)
	slowCheck := func(ctx context.Context, key Key, password string) error {
		defer checks.Done()
		<-gate
		return pg.verify(ctx, key, password)
	}
	clock.Advance(testInterval)
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, slowCheck); err != nil {
		t.Fatal(err)
	}
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "new"}, pg.verify); err != nil {
		t.Fatalf("new password: %v", err)
	}
	close(gate)
	checks.Wait()
	r.Close() // waits for the check to apply its outcome
	if got, ok := r.Password(alice); !ok || got != "new" {
		t.Fatalf("Password = %q, %v; want new", got, ok)
	}
}

func TestReverifyClose(t *testing.T) {
	// Close cancels a check in flight and waits for it; the entry stays
	// and logins go on without starting new checks.
	ctx := context.Background()
	r, pg, clock := warmRegistry(t, config.PassthroughEnabled)
	pg.gate = make(chan struct{}) // never opened: only cancellation ends it
	clock.Advance(testInterval)
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the check to start", func() bool { return pg.calls.Load() == 2 })
	r.Close()
	if _, ok := r.Password(alice); !ok {
		t.Fatal("Close removed the entry")
	}
	clock.Advance(testInterval)
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
		t.Fatal(err)
	}
	if pg.calls.Load() != 2 {
		t.Fatal("a closed registry started a check")
	}
}

func TestMarkStale(t *testing.T) {
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			r, pg, _ := warmRegistry(t, mode)
			pg.setPassword("alice", "new")
			// The pool opened a connection with an old password while a
			// newer one is stored: nothing is removed.
			if allowsChange(mode) {
				if err := r.Authenticate(ctx, Login{Key: alice, Password: "new"}, pg.verify); err != nil {
					t.Fatal(err)
				}
				if r.MarkStale(alice, "pencil") {
					t.Fatal("MarkStale removed a newer password")
				}
				if got, _ := r.Password(alice); got != "new" {
					t.Fatalf("Password = %q, want new", got)
				}
				pg.setPassword("alice", "newer")
			}
			current, _ := r.Password(alice)
			if !r.MarkStale(alice, current) {
				t.Fatal("MarkStale of the stored password reported false")
			}
			if _, ok := r.Password(alice); ok {
				t.Fatal("the stale entry is still there")
			}
			if r.MarkStale(alice, current) {
				t.Fatal("a second MarkStale reported true")
			}
			calls := pg.calls.Load()
			if err := r.Authenticate(ctx, Login{Key: alice, Password: current}, pg.verify); err != ErrCachedRejection || pg.calls.Load() != calls {
				t.Fatalf("stale password: err %v, calls %d→%d; want refused from the negative cache", err, calls, pg.calls.Load())
			}
			pg.mu.Lock()
			want := pg.passwords["alice"]
			pg.mu.Unlock()
			if err := r.Authenticate(ctx, Login{Key: alice, Password: want}, pg.verify); err != nil {
				t.Fatalf("the current password: %v", err)
			}
		})
	}
}

func TestReverifyBounded(t *testing.T) {
	// More due entries than slots: the checks beyond the bound are not
	// started (the logins are admitted all the same) and happen on a
	// later use.
	const users = maxConcurrentReverifies + 4
	ctx := context.Background()
	clock := newFakeClock()
	r := newRegistry(t, config.PassthroughEnabled, withClock(clock.Now), WithReverifyInterval(testInterval))
	var calls atomic.Int64
	gate := make(chan struct{})
	verify := func(ctx context.Context, _ Key, _ string) error {
		if calls.Add(1) > users { // the first logins are not gated
			select {
			case <-gate:
			case <-ctx.Done():
			}
		}
		return nil
	}
	keys := make([]Key, users)
	for i := range keys {
		keys[i] = Key{User: fmt.Sprint("user", i), Database: "app"}
		if err := r.Authenticate(ctx, Login{Key: keys[i], Password: "pencil"}, verify); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(testInterval)
	for _, key := range keys {
		if err := r.Authenticate(ctx, Login{Key: key, Password: "pencil"}, verify); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the checks to start", func() bool { return calls.Load() == users+maxConcurrentReverifies })
	close(gate)
	waitFor(t, "the checks to finish", func() bool { return len(r.bgSlots) == 0 })
	if got := calls.Load(); got != users+maxConcurrentReverifies {
		t.Fatalf("verify calls = %d, want %d + at most %d checks", got, users, maxConcurrentReverifies)
	}
	// The others are checked on their next use.
	for _, key := range keys {
		if err := r.Authenticate(ctx, Login{Key: key, Password: "pencil"}, verify); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the remaining checks", func() bool { return calls.Load() == 2*users })
}

// TestReverifyBusyTakesNoLock: with every re-verification slot busy, a
// login with a due entry is admitted without taking bgMu (held here for
// the whole test), and the entry is checked on a later use.
func TestReverifyBusyTakesNoLock(t *testing.T) {
	r, pg, clock := warmRegistry(t, config.PassthroughEnabled)
	clock.Advance(testInterval)
	for range maxConcurrentReverifies {
		r.bgSlots <- struct{}{}
	}
	r.bgMu.Lock()
	done := make(chan error, 1)
	go func() { done <- r.Authenticate(context.Background(), Login{Key: alice, Password: "pencil"}, pg.verify) }()
	select {
	case err := <-done:
		r.bgMu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		r.bgMu.Unlock()
		<-done
		t.Fatal("a due login with every slot busy waited for bgMu")
	}
	if r.entryOf(alice).checking.Load() {
		t.Fatal("the entry is marked checking though no check started")
	}
	for range maxConcurrentReverifies {
		<-r.bgSlots
	}
	if err := r.Authenticate(context.Background(), Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the check on a later use", func() bool { return pg.calls.Load() == 2 })
}

func TestReverifyCoarseClock(t *testing.T) {
	// The production clock: a short interval makes the ticker tick every
	// interval/4, and a due entry is checked on a use soon after.
	ctx := context.Background()
	r := newRegistry(t, config.PassthroughEnabled, WithReverifyInterval(40*time.Millisecond))
	if r.coarseTick != 10*time.Millisecond {
		t.Fatalf("coarse tick = %v, want 10ms", r.coarseTick)
	}
	pg := newFakePostgres(r, "alice", "pencil")
	login := Login{Key: alice, Password: "pencil"}
	if err := r.Authenticate(ctx, login, pg.verify); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a use to re-verify", func() bool {
		if err := r.Authenticate(ctx, login, pg.verify); err != nil {
			t.Fatal(err)
		}
		return pg.calls.Load() >= 2
	})
	if NewRegistry(config.PassthroughEnabled, WithReverifyInterval(0)).coarseTick != 0 {
		t.Fatal("a coarse clock runs with re-verification off")
	}
}
