package auth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtender/pgtender/config"
)

// fakeClock is a settable clock for tests.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestNegativeCacheRefusesWithoutPostgres(t *testing.T) {
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			clock := newFakeClock()
			r := newRegistry(t, mode, withClock(clock.Now), WithNegativeCacheTTL(10*time.Second))
			pg := newFakePostgres(r, "alice", "pencil")
			login := Login{Key: alice, Password: "crayon"}
			if err := r.Authenticate(ctx, login, pg.verify); !errors.Is(err, ErrPasswordMismatch) {
				t.Fatalf("wrong password: %v", err)
			}
			for range 100 {
				if err := r.Authenticate(ctx, login, pg.verify); !errors.Is(err, ErrPasswordMismatch) {
					t.Fatalf("wrong password again: %v", err)
				}
			}
			if got := pg.calls.Load(); got != 1 {
				t.Fatalf("verify calls = %d for 101 logins with one rejected password, want 1", got)
			}
			// Another wrong password is another pair.
			if err := r.Authenticate(ctx, Login{Key: alice, Password: "chalk"}, pg.verify); !errors.Is(err, ErrPasswordMismatch) || pg.calls.Load() != 2 {
				t.Fatalf("another wrong password: err %v, calls %d", err, pg.calls.Load())
			}
			// The right one is not blocked by them.
			if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
				t.Fatalf("right password: %v", err)
			}
			clock.Advance(10 * time.Second)
			if err := r.Authenticate(ctx, login, pg.verify); !errors.Is(err, ErrPasswordMismatch) {
				t.Fatalf("wrong password after the TTL: %v", err)
			}
			want := int64(4) // crayon, chalk, pencil, crayon again
			if !allowsChange(mode) {
				want = 3 // crayon is refused at once once pencil is known
			}
			if got := pg.calls.Load(); got != want {
				t.Fatalf("verify calls = %d, want %d", got, want)
			}
		})
	}
}

func TestNegativeCacheExpiresForAPasswordThatBecomesValid(t *testing.T) {
	// The role's password is changed to one that was just rejected: it is
	// refused until the TTL ends, and no longer.
	ctx := context.Background()
	clock := newFakeClock()
	r := newRegistry(t, config.PassthroughEnabledPlainAllowChange, withClock(clock.Now), WithNegativeCacheTTL(10*time.Second))
	pg := newFakePostgres(r, "alice", "old")
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "new"}, pg.verify); !errors.Is(err, ErrPasswordMismatch) {
		t.Fatalf("new password before the change: %v", err)
	}
	pg.setPassword("alice", "new")
	clock.Advance(9 * time.Second)
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "new"}, pg.verify); !errors.Is(err, ErrPasswordMismatch) || pg.calls.Load() != 1 {
		t.Fatalf("within the TTL: err %v, calls %d; want ErrPasswordMismatch without a call", err, pg.calls.Load())
	}
	clock.Advance(time.Second)
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "new"}, pg.verify); err != nil || pg.calls.Load() != 2 {
		t.Fatalf("after the TTL: err %v, calls %d; want admitted after a call", err, pg.calls.Load())
	}
}

func TestNegativeCacheRotationWave(t *testing.T) {
	// After a rotation, a wave of clients with the old password costs
	// Postgres one attempt, not one each.
	const wave = 1000
	ctx := context.Background()
	clock := newFakeClock()
	r := newRegistry(t, config.PassthroughEnabledPlainAllowChange, withClock(clock.Now))
	var joined atomic.Int64
	r.joinedFlight = func() { joined.Add(1) }
	pg := newFakePostgres(r, "alice", "old")
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "old"}, pg.verify); err != nil {
		t.Fatal(err)
	}
	pg.setPassword("alice", "new")
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "new"}, pg.verify); err != nil {
		t.Fatalf("new password: %v", err)
	}
	joined.Store(0)
	calls := pg.calls.Load()
	pg.gate = make(chan struct{})
	errs := make(chan error, wave)
	for range wave {
		go func() { errs <- r.Authenticate(ctx, Login{Key: alice, Password: "old"}, pg.verify) }()
	}
	waitFor(t, "the wave to wait on one verification", func() bool { return joined.Load() == wave })
	close(pg.gate)
	for range wave {
		if err := <-errs; !errors.Is(err, ErrPasswordMismatch) {
			t.Fatalf("old password: %v", err)
		}
	}
	for range wave { // the next wave: the negative cache answers
		if err := r.Authenticate(ctx, Login{Key: alice, Password: "old"}, pg.verify); !errors.Is(err, ErrPasswordMismatch) {
			t.Fatalf("old password, second wave: %v", err)
		}
	}
	if got := pg.calls.Load() - calls; got != 1 {
		t.Fatalf("verify calls = %d for two waves of %d old-password logins, want 1", got, wave)
	}
}

func TestNegativeCacheBounded(t *testing.T) {
	// A flood of distinct wrong passwords, with the limiter off, cannot
	// grow the negative cache beyond its bound.
	ctx := context.Background()
	clock := newFakeClock()
	r := newRegistry(t, config.PassthroughEnabled, withClock(clock.Now), WithFailureLimits(Limit{}, Limit{}))
	verify := func(context.Context, Key, string) error { return ErrRejected }
	for i := range 40_000 {
		key := Key{User: fmt.Sprintf("u%d", i%500), Database: "app"}
		if err := r.Authenticate(ctx, Login{Key: key, Password: fmt.Sprint("wrong", i)}, verify); !errors.Is(err, ErrPasswordMismatch) {
			t.Fatal(err)
		}
	}
	total := 0
	for i := range r.shards {
		n := r.shards[i].negative.len()
		if n > negativeCacheShardSize {
			t.Fatalf("shard %d remembers %d pairs, more than %d", i, n, negativeCacheShardSize)
		}
		total += n
	}
	if total == 0 || total > numShards*negativeCacheShardSize {
		t.Fatalf("negative cache holds %d pairs", total)
	}
}

func TestNegativeCacheRing(t *testing.T) {
	var c negativeCache
	now := time.Unix(1000, 0)
	mac := func(i int) (m [sha256.Size]byte) {
		m[0], m[1] = byte(i), byte(i>>8)
		return m
	}
	for i := range negativeCacheShardSize + 1 {
		c.add(mac(i), now, time.Minute)
	}
	if c.rejected(mac(0), now) {
		t.Fatal("the oldest pair was not evicted when the shard was full")
	}
	for i := 1; i <= negativeCacheShardSize; i++ {
		if !c.rejected(mac(i), now) {
			t.Fatalf("pair %d was evicted", i)
		}
	}
	// Renewing pair 1, the oldest, evicts its own old record and keeps it.
	later := now.Add(time.Second)
	c.add(mac(1), later, time.Minute)
	for i := 1; i <= negativeCacheShardSize; i++ {
		if !c.rejected(mac(i), later) {
			t.Fatalf("pair %d was evicted by the renewal of pair 1", i)
		}
	}
	c.add(mac(100), later, time.Minute)
	if c.rejected(mac(2), later) || !c.rejected(mac(1), later) {
		t.Fatal("the next add should evict pair 2, now the oldest, and keep renewed pair 1")
	}
	// Renewing a pair that is not the oldest leaves its old record in the
	// ring; when that record reaches the head, evicting it must not drop
	// the renewal (even at the same instant, so with the same expiry).
	// The ring is now 3…64, 1, 100.
	c.add(mac(10), later, time.Minute) // evicts 3; ring 4…64, 1, 100, 10
	for i := range 7 {                 // evicts 4…9 and the old record of 10
		c.add(mac(300+i), later, time.Minute)
	}
	if !c.rejected(mac(10), later) || c.rejected(mac(9), later) || !c.rejected(mac(11), later) {
		t.Fatal("the old record of pair 10 evicted its renewal, or eviction went out of order")
	}
	// Expiry, and expired records are dropped on the next add.
	end := later.Add(time.Minute)
	if c.rejected(mac(1), later.Add(time.Minute)) || c.rejected(mac(3), end) {
		t.Fatal("a pair outlived its TTL")
	}
	c.add(mac(9999), end, time.Minute)
	if c.n != 1 || c.len() != 1 {
		t.Fatalf("after expiry: %d records, %d pairs; want 1, 1", c.n, c.len())
	}
	c.add(mac(1), end, 0) // TTL 0: off
	if c.rejected(mac(1), end) {
		t.Fatal("a pair was remembered with TTL 0")
	}
}
