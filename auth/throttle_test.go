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

// TestThrottledRightPasswordWaitsForAToken: a fresh registry whose buckets
// wrong passwords emptied first (a restart, a misconfigured client on the
// same address). Right logins, concurrent with more wrong ones, must all
// be admitted: the right password is the most presented, takes the
// waiting place and the next token. Postgres still sees no more than the
// bucket allows.
func TestThrottledRightPasswordWaitsForAToken(t *testing.T) {
	limit := Limit{Burst: 2, Every: 200 * time.Millisecond}
	for _, mode := range []config.PassthroughAuth{config.PassthroughEnabledPlain, config.PassthroughEnabledPlainAllowChange} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			r := newRegistry(t, mode, WithFailureLimits(limit, limit), WithThrottleWait(time.Second))
			pg := newFakePostgres(r, "alice", "pencil")
			addr := netip.MustParseAddr("127.0.0.1")
			for i := range 2 * limit.Burst {
				err := r.Authenticate(ctx, Login{Key: alice, Password: fmt.Sprint("drain", i), ClientAddr: addr}, pg.verify)
				if !errors.Is(err, ErrPasswordMismatch) {
					t.Fatalf("draining: %v", err)
				}
			}
			start := time.Now()
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
			// The first right logins may come before the right password is
			// the most presented one; a few at most.
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

// TestThrottleWaitPlace: one verification per user waits; another in as
// high a demand is refused at once, one in higher demand takes the place;
// Close ends the wait.
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
	waitFor(t, "a verification to wait for a token", func() bool {
		r.limiter.mu.Lock()
		defer r.limiter.mu.Unlock()
		return r.limiter.waiting["alice"] != nil
	})
	// Presented once too: refused at once.
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "other"}, pg.verify); err != ErrThrottled {
		t.Fatalf("second candidate of the same demand: %v, want ErrThrottled", err)
	}
	// "other" again: demand 2 evicts "low".
	second := make(chan error, 1)
	go func() { second <- r.Authenticate(ctx, Login{Key: alice, Password: "other"}, pg.verify) }()
	if err := <-first; err != ErrThrottled {
		t.Fatalf("evicted verification: %v, want ErrThrottled", err)
	}
	r.Close()
	if err := <-second; err != ErrThrottled {
		t.Fatalf("waiting verification after Close: %v, want ErrThrottled", err)
	}
	if n := pg.calls.Load(); n != 1 {
		t.Fatalf("%d verify calls, want 1", n)
	}
}

func TestDemandCounter(t *testing.T) {
	var c demandCounter
	now := time.Unix(1000, 0)
	mac := func(i int) (m [32]byte) { m[0], m[1] = byte(i), byte(i>>8); return m }
	for want := 1; want <= 3; want++ {
		if got := c.present(mac(0), now); got != want {
			t.Fatalf("presentation %d counted %d", want, got)
		}
	}
	if got := c.present(mac(0), now.Add(demandWindow)); got != 1 {
		t.Fatalf("after the window: %d, want 1 (a new window)", got)
	}
	for i := 1; i < demandShardSize; i++ {
		c.present(mac(i), now)
	}
	later := now.Add(demandWindow / 2)
	if got := c.present(mac(demandShardSize), later); got != 1 {
		t.Fatalf("a new pair in a full shard: %d, want 1", got)
	}
	if got := c.present(mac(demandShardSize), later); got != 1 {
		t.Fatalf("a pair not kept in a full shard: %d, want 1 again", got)
	}
	if got := c.present(mac(0), later); got != 2 {
		t.Fatalf("a pair kept in a full shard: %d, want 2", got)
	}
	// Once the window of the old pairs is over, the sweep makes room.
	if got := c.present(mac(demandShardSize), now.Add(demandWindow+time.Second)); got != 1 || len(c.pairs) > 2 {
		t.Fatalf("after the sweep: %d, %d pairs kept", got, len(c.pairs))
	}
}
