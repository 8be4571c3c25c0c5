package auth

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/pgtender/pgtender/config"
)

func TestRegistryWrongPasswordFlood(t *testing.T) {
	// 1,000 concurrent logins with distinct wrong passwords for one user,
	// from 10 addresses, interleaved with logins with the right password:
	// Postgres sees at most the user's burst of attempts, every wrong one
	// gets 28P01, every right one is admitted.
	const flood = 1000
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			clock := newFakeClock() // frozen: no refill during the flood
			r := newRegistry(t, mode, withClock(clock.Now))
			pg := newFakePostgres(r, "alice", "pencil")
			if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
				t.Fatal(err)
			}
			calls := pg.calls.Load()
			var wg sync.WaitGroup
			var mu sync.Mutex
			throttled := 0
			for i := range flood {
				addr := netip.AddrFrom4([4]byte{10, 0, 0, byte(i % 10)})
				wg.Go(func() {
					err := r.Authenticate(ctx, Login{Key: alice, Password: fmt.Sprint("guess", i), ClientAddr: addr}, pg.verify)
					if !errors.Is(err, ErrPasswordMismatch) {
						t.Errorf("wrong password %d: %v", i, err)
					}
					if err == ErrThrottled {
						mu.Lock()
						throttled++
						mu.Unlock()
					}
				})
				wg.Go(func() {
					if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil", ClientAddr: addr}, pg.verify); err != nil {
						t.Errorf("right password during the flood: %v", err)
					}
				})
			}
			wg.Wait()
			got := pg.calls.Load() - calls
			if !allowsChange(mode) {
				// A known key with another password is refused at once.
				if got != 0 || throttled != 0 {
					t.Fatalf("without allow_change: %d verify calls, %d throttled; want 0, 0", got, throttled)
				}
				return
			}
			if burst := int64(DefaultFailureLimit.Burst); got > burst {
				t.Fatalf("%d verify calls for %d wrong passwords, want at most %d", got, flood, burst)
			}
			if throttled < flood-DefaultFailureLimit.Burst {
				t.Fatalf("%d throttled, want at least %d", throttled, flood-DefaultFailureLimit.Burst)
			}
		})
	}
}

func TestRegistryColdWrongPasswordFlood(t *testing.T) {
	// The same flood against a user no one has logged in as yet.
	const flood = 1000
	ctx := context.Background()
	clock := newFakeClock()
	r := newRegistry(t, config.PassthroughEnabledPlain, withClock(clock.Now))
	pg := newFakePostgres(r, "alice", "pencil")
	var wg sync.WaitGroup
	for i := range flood {
		wg.Go(func() {
			if err := r.Authenticate(ctx, Login{Key: alice, Password: fmt.Sprint("guess", i)}, pg.verify); !errors.Is(err, ErrPasswordMismatch) {
				t.Errorf("wrong password: %v", err)
			}
		})
	}
	wg.Wait()
	if got := pg.calls.Load(); got > int64(DefaultFailureLimit.Burst) {
		t.Fatalf("%d verify calls, want at most %d", got, DefaultFailureLimit.Burst)
	}
	// The documented price: the right password, not yet verified, is
	// refused while the user's bucket is empty…
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != ErrThrottled {
		t.Fatalf("right password with an empty bucket: %v, want ErrThrottled", err)
	}
	// …and admitted once it has refilled by one.
	clock.Advance(DefaultFailureLimit.Every)
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
		t.Fatalf("right password after a refill: %v", err)
	}
	// From then on the fast path admits it whatever the bucket says.
	for range 10 {
		_ = r.Authenticate(ctx, Login{Key: alice, Password: "guess"}, pg.verify)
		if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
			t.Fatalf("verified password: %v", err)
		}
	}
}

func TestRegistryLimiterRefill(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	r := newRegistry(t, config.PassthroughEnabledPlain, withClock(clock.Now),
		WithNegativeCacheTTL(0), WithFailureLimits(Limit{Burst: 3, Every: 2 * time.Second}, Limit{}))
	pg := newFakePostgres(r, "alice", "pencil")
	login := Login{Key: alice, Password: "wrong"}
	for range 10 {
		_ = r.Authenticate(ctx, login, pg.verify)
	}
	if got := pg.calls.Load(); got != 3 {
		t.Fatalf("verify calls = %d, want the burst, 3", got)
	}
	clock.Advance(time.Second) // half a token
	if err := r.Authenticate(ctx, login, pg.verify); err != ErrThrottled || pg.calls.Load() != 3 {
		t.Fatalf("half a token later: err %v, calls %d", err, pg.calls.Load())
	}
	clock.Advance(time.Second) // one token
	if err := r.Authenticate(ctx, login, pg.verify); err != ErrPasswordMismatch || pg.calls.Load() != 4 {
		t.Fatalf("a token later: err %v, calls %d; want one more verification, rejected", err, pg.calls.Load())
	}
	if err := r.Authenticate(ctx, login, pg.verify); err != ErrThrottled {
		t.Fatalf("token spent: %v", err)
	}
	clock.Advance(time.Hour) // full again, never more than the burst
	for range 10 {
		_ = r.Authenticate(ctx, login, pg.verify)
	}
	if got := pg.calls.Load(); got != 7 {
		t.Fatalf("verify calls = %d, want 4 + a burst of 3", got)
	}
}

func TestRegistryLimiterPerAddress(t *testing.T) {
	// One address guessing at many users is limited by the address; other
	// addresses are not.
	ctx := context.Background()
	clock := newFakeClock()
	r := newRegistry(t, config.PassthroughEnabledPlain, withClock(clock.Now))
	var users []string
	for i := range 20 {
		users = append(users, fmt.Sprint("user", i), "right")
	}
	pg := newFakePostgres(r, users...)
	attacker := netip.MustParseAddr("192.0.2.1")
	for i := range 20 {
		key := Key{User: fmt.Sprint("user", i), Database: "app"}
		_ = r.Authenticate(ctx, Login{Key: key, Password: "wrong", ClientAddr: attacker}, pg.verify)
	}
	if got, want := pg.calls.Load(), int64(DefaultFailureLimit.Burst); got != want {
		t.Fatalf("one address, 20 users: %d verify calls, want %d", got, want)
	}
	victim := Key{User: "user19", Database: "app"}
	if err := r.Authenticate(ctx, Login{Key: victim, Password: "right", ClientAddr: attacker}, pg.verify); err != ErrThrottled {
		t.Fatalf("the throttled address: %v, want ErrThrottled", err)
	}
	if err := r.Authenticate(ctx, Login{Key: victim, Password: "right", ClientAddr: netip.MustParseAddr("192.0.2.2")}, pg.verify); err != nil {
		t.Fatalf("another address: %v", err)
	}
}

func TestRegistryLimiterCountsOnlyRejections(t *testing.T) {
	// Successful verifications and Postgres being unreachable (the
	// password never sent) give their tokens back.
	ctx := context.Background()
	clock := newFakeClock()
	r := newRegistry(t, config.PassthroughEnabledPlain, withClock(clock.Now))
	addr := netip.MustParseAddr("2001:db8::1")
	var users []string
	for i := range 50 {
		users = append(users, fmt.Sprint("user", i), "right")
	}
	pg := newFakePostgres(r, users...)
	for i := range 50 {
		key := Key{User: fmt.Sprint("user", i), Database: "app"}
		if err := r.Authenticate(ctx, Login{Key: key, Password: "right", ClientAddr: addr}, pg.verify); err != nil {
			t.Fatalf("login %d: %v", i, err)
		}
	}
	down := fmt.Errorf("dial: connection refused: %w", ErrPasswordNotSent)
	pg.mu.Lock()
	pg.down = down
	pg.mu.Unlock()
	bob := Key{User: "bob", Database: "app"}
	for range 50 {
		if err := r.Authenticate(ctx, Login{Key: bob, Password: "any", ClientAddr: addr}, pg.verify); !errors.Is(err, down) {
			t.Fatalf("Postgres down: %v", err)
		}
	}
	if got := pg.calls.Load(); got != 100 {
		t.Fatalf("verify calls = %d, want 100 (nothing throttled)", got)
	}
}

// TestRegistryLimiterKeepsTokensAfterUnknownOutcome: a verification that
// failed after the password may have reached Postgres (a timeout during
// the startup exchange) keeps its tokens, so the failures Postgres logs
// stay within the bucket bound.
func TestRegistryLimiterKeepsTokensAfterUnknownOutcome(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	r := newRegistry(t, config.PassthroughEnabledPlain, withClock(clock.Now))
	pg := newFakePostgres(r, "alice", "pencil")
	timeout := errors.New("receive message: i/o timeout")
	pg.mu.Lock()
	pg.down = timeout
	pg.mu.Unlock()
	for i := range DefaultFailureLimit.Burst {
		if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); !errors.Is(err, timeout) {
			t.Fatalf("attempt %d: %v, want the timeout", i, err)
		}
	}
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != ErrThrottled {
		t.Fatalf("after %d timeouts: %v, want ErrThrottled", DefaultFailureLimit.Burst, err)
	}
	if got := pg.calls.Load(); got != int64(DefaultFailureLimit.Burst) {
		t.Fatalf("verify calls = %d, want %d", got, DefaultFailureLimit.Burst)
	}
}

func TestAddrKey(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"192.0.2.1", "192.0.2.1"},
		{"::ffff:192.0.2.1", "192.0.2.1"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::"},
		{"2001:db8:1:2::ffff", "2001:db8:1:2::"},
		{"fe80::1%eth0", "fe80::"},
	} {
		got, ok := addrKey(netip.MustParseAddr(tt.in))
		if !ok || got != netip.MustParseAddr(tt.want) {
			t.Errorf("addrKey(%s) = %v, %v; want %s", tt.in, got, ok, tt.want)
		}
	}
	if _, ok := addrKey(netip.Addr{}); ok {
		t.Error("the zero Addr has a bucket")
	}
}

func TestLimiterBoundedMemory(t *testing.T) {
	var l limiter
	l.init(Limit{Burst: 2, Every: time.Second}, Limit{Burst: 2, Every: time.Second})
	now := time.Unix(1000, 0)
	// Fill the user kind with draining buckets.
	for i := range limiterMaxKeys {
		if !l.reserve(fmt.Sprint("u", i), netip.Addr{}, now) {
			t.Fatalf("reserve %d refused", i)
		}
	}
	if len(l.users.tat) != limiterMaxKeys {
		t.Fatalf("%d buckets", len(l.users.tat))
	}
	// Full of draining buckets: a new key is refused (fail closed).
	if l.reserve("newcomer", netip.Addr{}, now) {
		t.Fatal("a new key was admitted beyond limiterMaxKeys buckets")
	}
	// Once they have refilled, a sweep drops them all.
	later := now.Add(limiterSweepEvery)
	if !l.reserve("newcomer", netip.Addr{}, later) {
		t.Fatal("a new key was refused after the buckets refilled")
	}
	if len(l.users.tat) != 1 {
		t.Fatalf("%d buckets after the sweep, want 1", len(l.users.tat))
	}
	// A refund of a bucket's only token deletes it.
	l.refund("newcomer", netip.Addr{}, later)
	if len(l.users.tat) != 0 {
		t.Fatalf("%d buckets after the refund, want 0", len(l.users.tat))
	}
}

func TestVerificationStats(t *testing.T) {
	// Each slow-path outcome is counted once, under its own name; the fast
	// path counts nowhere.
	ctx := context.Background()
	clock := newFakeClock()
	r := newRegistry(t, config.PassthroughEnabledPlainAllowChange, withClock(clock.Now),
		WithFailureLimits(Limit{Burst: 2, Every: time.Second}, Limit{}))
	pg := newFakePostgres(r, "alice", "pencil")
	login := func(password string) error {
		return r.Authenticate(ctx, Login{Key: alice, Password: password}, pg.verify)
	}
	steps := []struct {
		password string
		want     error
	}{
		{"pencil", nil},                 // ok: a round trip
		{"pencil", nil},                 // fast path: not counted
		{"guess1", ErrPasswordMismatch}, // rejected: a round trip
		{"guess1", ErrCachedRejection},  // from the negative cache
		{"guess2", ErrPasswordMismatch}, // rejected: the bucket is empty now
		{"guess3", ErrThrottled},        // throttled
		{"guess2", ErrCachedRejection},  // from the negative cache
		{"pencil", nil},                 // fast path, whatever the bucket
	}
	for i, step := range steps {
		if err := login(step.password); err != step.want {
			t.Fatalf("step %d (%s): err %v, want %v", i, step.password, err, step.want)
		}
	}
	want := VerificationStats{OK: 1, Rejected: 2, Throttled: 1, CachedRejection: 2}
	if got := r.VerificationStats(); got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
}
