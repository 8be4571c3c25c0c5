package auth

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtender/pgtender/config"
)

var allModes = []config.PassthroughAuth{
	config.PassthroughEnabled,
	config.PassthroughEnabledPlain,
	config.PassthroughEnabledAllowChange,
	config.PassthroughEnabledPlainAllowChange,
}

func allowsChange(mode config.PassthroughAuth) bool {
	return mode == config.PassthroughEnabledAllowChange || mode == config.PassthroughEnabledPlainAllowChange
}

// fakePostgres is a VerifyFunc backend: it accepts the current password of
// each user, counts calls, and can be made to fail or to block.
type fakePostgres struct {
	mu        sync.Mutex
	passwords map[string]string
	down      error         // when set, verify returns it
	gate      chan struct{} // when set, verify waits for it to close
	calls     atomic.Int64
	// seenStored records, per call, whether the registry already held the
	// password being verified (it must not: verify comes first).
	registry   *Registry
	seenStored atomic.Int64
}

func newFakePostgres(r *Registry, users ...string) *fakePostgres {
	p := &fakePostgres{passwords: map[string]string{}, registry: r}
	for i := 0; i+1 < len(users); i += 2 {
		p.passwords[users[i]] = users[i+1]
	}
	return p
}

func (p *fakePostgres) setPassword(user, password string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.passwords[user] = password
}

func (p *fakePostgres) verify(ctx context.Context, key Key, password string) error {
	p.calls.Add(1)
	if stored, ok := p.registry.Password(key); ok && stored == password {
		p.seenStored.Add(1)
	}
	p.mu.Lock()
	gate, down, want := p.gate, p.down, p.passwords[key.User]
	p.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if down != nil {
		return down
	}
	if password != want {
		return fmt.Errorf("FATAL: password authentication failed (SQLSTATE 28P01): %w", ErrRejected)
	}
	return nil
}

// waitFor polls cond until it holds or the test times out.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

var alice = Key{User: "alice", Database: "app"}

// newRegistry is NewRegistry, closed when the test ends. A throttled
// verification is refused at once unless opts say otherwise: the wait for
// a token runs on real time, which the tests' fake clocks do not advance
// (throttle_test.go tests the wait on real time).
func newRegistry(tb testing.TB, mode config.PassthroughAuth, opts ...Option) *Registry {
	r := NewRegistry(mode, append([]Option{WithThrottleWait(0)}, opts...)...)
	tb.Cleanup(r.Close)
	return r
}

// bare turns off the negative cache and the failure limiter, for tests of
// the registry's core rules that count verify calls.
var bare = []Option{WithNegativeCacheTTL(0), WithFailureLimits(Limit{}, Limit{})}

// macName is the MAC of (key, password) as a string, for comparisons.
func (r *Registry) macName(key Key, password string) string {
	mac := r.mac(key, password)
	return string(mac[:])
}

func TestRegistryVerifiesFirstThenFastPath(t *testing.T) {
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			r := newRegistry(t, mode)
			pg := newFakePostgres(r, "alice", "pencil")
			if _, ok := r.Password(alice); ok {
				t.Fatal("a new registry knows alice")
			}
			if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
				t.Fatalf("first login: %v", err)
			}
			if pg.calls.Load() != 1 || pg.seenStored.Load() != 0 {
				t.Fatalf("verify calls = %d (with the password already stored: %d), want 1 (0)", pg.calls.Load(), pg.seenStored.Load())
			}
			for range 10 {
				if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
					t.Fatalf("known password: %v", err)
				}
			}
			if pg.calls.Load() != 1 {
				t.Fatalf("the fast path called verify: %d calls", pg.calls.Load())
			}
			if got, ok := r.Password(alice); !ok || got != "pencil" {
				t.Fatalf("Password = %q, %v", got, ok)
			}
			// Another database is another key, verified on its own.
			other := Key{User: "alice", Database: "reports"}
			if _, ok := r.Password(other); ok {
				t.Fatal("alice@reports known before its first login")
			}
			if err := r.Authenticate(ctx, Login{Key: other, Password: "pencil"}, pg.verify); err != nil || pg.calls.Load() != 2 {
				t.Fatalf("alice@reports: err %v, calls %d", err, pg.calls.Load())
			}
			if got := r.Keys(); !slices.Equal(got, []Key{alice, other}) {
				t.Fatalf("Keys = %v", got)
			}
		})
	}
}

func TestRegistryWrongPasswordNeverAdmitted(t *testing.T) {
	wrongs := []string{"Pencil", "pencil ", "penci", "pencil\x00", "x", strings.Repeat("pencil", 100)}
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			r := newRegistry(t, mode, bare...)
			pg := newFakePostgres(r, "alice", "pencil")

			// Cold: every wrong password is asked about, refused, and
			// not remembered.
			for i, wrong := range wrongs {
				if err := r.Authenticate(ctx, Login{Key: alice, Password: wrong}, pg.verify); err != ErrPasswordMismatch {
					t.Fatalf("cold, password %q: err = %v, want ErrPasswordMismatch", wrong, err)
				}
				if got := pg.calls.Load(); got != int64(i+1) {
					t.Fatalf("cold, password %q: verify calls = %d, want %d", wrong, got, i+1)
				}
				if _, ok := r.Password(alice); ok {
					t.Fatal("a rejected password was stored")
				}
			}
			if err := r.Authenticate(ctx, Login{Key: alice, Password: ""}, pg.verify); err != ErrPasswordMismatch {
				t.Fatalf("empty password: %v", err)
			}

			// Warm: the right password is known; wrong ones still fail,
			// without asking Postgres unless the mode allows a change.
			if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
				t.Fatalf("right password: %v", err)
			}
			before := pg.calls.Load()
			for _, wrong := range wrongs {
				if err := r.Authenticate(ctx, Login{Key: alice, Password: wrong}, pg.verify); err != ErrPasswordMismatch {
					t.Fatalf("warm, password %q: err = %v, want ErrPasswordMismatch", wrong, err)
				}
			}
			wantCalls := before
			if allowsChange(mode) {
				wantCalls += int64(len(wrongs))
			}
			if got := pg.calls.Load(); got != wantCalls {
				t.Fatalf("warm: verify calls = %d, want %d", got, wantCalls)
			}
			if got, _ := r.Password(alice); got != "pencil" {
				t.Fatalf("a wrong password replaced the verified one: %q", got)
			}
			if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
				t.Fatalf("right password after wrong ones: %v", err)
			}
		})
	}
}

func TestRegistryPasswordChange(t *testing.T) {
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			r := newRegistry(t, mode)
			pg := newFakePostgres(r, "alice", "old")
			if err := r.Authenticate(ctx, Login{Key: alice, Password: "old"}, pg.verify); err != nil {
				t.Fatal(err)
			}
			pg.setPassword("alice", "new") // ALTER ROLE alice PASSWORD 'new'
			calls := pg.calls.Load()
			err := r.Authenticate(ctx, Login{Key: alice, Password: "new"}, pg.verify)
			if !allowsChange(mode) {
				if err != ErrPasswordMismatch || pg.calls.Load() != calls {
					t.Fatalf("changed password without allow_change: err %v, verify calls %d→%d; want ErrPasswordMismatch and no call",
						err, calls, pg.calls.Load())
				}
				// The old password keeps working: server connections
				// opened with it are still valid.
				if err := r.Authenticate(ctx, Login{Key: alice, Password: "old"}, pg.verify); err != nil {
					t.Fatalf("old password: %v", err)
				}
				return
			}
			if err != nil || pg.calls.Load() != calls+1 {
				t.Fatalf("changed password with allow_change: err %v, verify calls %d→%d", err, calls, pg.calls.Load())
			}
			if got, _ := r.Password(alice); got != "new" {
				t.Fatalf("Password = %q after the change, want new", got)
			}
			if err := r.Authenticate(ctx, Login{Key: alice, Password: "new"}, pg.verify); err != nil || pg.calls.Load() != calls+1 {
				t.Fatalf("new password, fast path: err %v, calls %d", err, pg.calls.Load())
			}
			// The old password is no longer what Postgres accepts.
			if err := r.Authenticate(ctx, Login{Key: alice, Password: "old"}, pg.verify); err != ErrPasswordMismatch {
				t.Fatalf("old password after the change: %v, want ErrPasswordMismatch", err)
			}
			if got, _ := r.Password(alice); got != "new" {
				t.Fatalf("Password = %q, want new", got)
			}
		})
	}
}

// TestRegistryStalePasswordDoesNotOverwriteNewer: under allow_change, a
// verification of A that Postgres accepted just before ALTER ROLE, and
// that ends after B was verified and stored, must not replace B.
func TestRegistryStalePasswordDoesNotOverwriteNewer(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, config.PassthroughEnabledPlainAllowChange, bare...)
	entered, release := make(chan struct{}), make(chan struct{})
	verify := func(ctx context.Context, key Key, password string) error {
		if password == "A" {
			close(entered)
			<-release // Postgres accepted A; ALTER ROLE ... PASSWORD 'B' follows
		}
		return nil
	}
	first := make(chan error, 1)
	go func() { first <- r.Authenticate(ctx, Login{Key: alice, Password: "A"}, verify) }()
	<-entered
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "B"}, verify); err != nil {
		t.Fatalf("B: %v", err)
	}
	close(release)
	if err := <-first; err != ErrPasswordMismatch {
		t.Fatalf("A, verified before B but finished after: %v, want ErrPasswordMismatch", err)
	}
	if got, _ := r.Password(alice); got != "B" {
		t.Fatalf("Password = %q, want B (the newer one)", got)
	}
}

func TestRegistrySingleflight(t *testing.T) {
	const n = 64
	ctx := context.Background()
	r := newRegistry(t, config.PassthroughEnabledPlain)
	var joined atomic.Int64
	r.joinedFlight = func() { joined.Add(1) }
	pg := newFakePostgres(r, "alice", "pencil")
	pg.gate = make(chan struct{})

	errs := make(chan error, n)
	for range n {
		go func() { errs <- r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify) }()
	}
	waitFor(t, "every login to wait on the verification", func() bool { return joined.Load() == n })
	close(pg.gate)
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("login: %v", err)
		}
	}
	if got := pg.calls.Load(); got != 1 {
		t.Fatalf("verify calls = %d for %d concurrent first logins, want 1", got, n)
	}
}

func TestRegistrySingleflightPerPassword(t *testing.T) {
	// A wrong password does not share the verification of the right one
	// (and so cannot ride on its success).
	ctx := context.Background()
	r := newRegistry(t, config.PassthroughEnabledPlain)
	var joined atomic.Int64
	r.joinedFlight = func() { joined.Add(1) }
	pg := newFakePostgres(r, "alice", "pencil")
	pg.gate = make(chan struct{})

	right, wrong := make(chan error, 1), make(chan error, 1)
	go func() { right <- r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify) }()
	go func() { wrong <- r.Authenticate(ctx, Login{Key: alice, Password: "pencil!"}, pg.verify) }()
	waitFor(t, "both logins to wait", func() bool { return joined.Load() == 2 })
	close(pg.gate)
	if err := <-right; err != nil {
		t.Fatalf("right password: %v", err)
	}
	if err := <-wrong; err != ErrPasswordMismatch {
		t.Fatalf("wrong password: %v, want ErrPasswordMismatch", err)
	}
	if got := pg.calls.Load(); got != 2 {
		t.Fatalf("verify calls = %d, want 2", got)
	}
}

func TestRegistryMACHasNoPlaintext(t *testing.T) {
	r := newRegistry(t, config.PassthroughEnabled)
	password := "correct horse battery staple"
	name := r.macName(alice, password)
	if strings.Contains(name, password) || strings.Contains(name, "horse") {
		t.Fatal("the MAC contains the password")
	}
	if name == r.macName(alice, password+"!") || name == r.macName(Key{User: "alice", Database: "app2"}, password) {
		t.Fatal("MACs collide")
	}
	// Concatenation ambiguity: ("ab","c") vs ("a","bc").
	if r.macName(Key{User: "ab", Database: "c"}, "p") == r.macName(Key{User: "a", Database: "bc"}, "p") {
		t.Fatal("MACs collide across the user/database boundary")
	}
	if newRegistry(t, config.PassthroughEnabled).macName(alice, password) == name {
		t.Fatal("two registries compute the same MAC: the HMAC key is not random")
	}
}

func TestRegistryVerifyErrorNotCached(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, config.PassthroughEnabled)
	pg := newFakePostgres(r, "alice", "pencil")
	refused := errors.New("dial tcp 10.0.0.1:5432: connection refused")
	pg.down = refused
	for i := range 3 {
		err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify)
		if !errors.Is(err, refused) || errors.Is(err, ErrPasswordMismatch) {
			t.Fatalf("Postgres down: err = %v, want the verify error", err)
		}
		if strings.Contains(err.Error(), "pencil") {
			t.Fatalf("error %q contains the password", err)
		}
		if pg.calls.Load() != int64(i+1) {
			t.Fatalf("verify calls = %d, want %d (an error must not be cached)", pg.calls.Load(), i+1)
		}
	}
	if _, ok := r.Password(alice); ok {
		t.Fatal("a password was stored although Postgres could not be asked")
	}
	pg.mu.Lock()
	pg.down = nil
	pg.mu.Unlock()
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
		t.Fatalf("Postgres back: %v", err)
	}
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "wrong"}, pg.verify); err != ErrPasswordMismatch {
		t.Fatalf("wrong password with Postgres back: %v", err)
	}
}

func TestRegistryCallerCancelDoesNotCancelVerification(t *testing.T) {
	r := newRegistry(t, config.PassthroughEnabled)
	var joined atomic.Int64
	r.joinedFlight = func() { joined.Add(1) }
	pg := newFakePostgres(r, "alice", "pencil")
	pg.gate = make(chan struct{})

	ctx, cancel := context.WithCancel(context.Background())
	leader := make(chan error, 1)
	go func() { leader <- r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify) }()
	follower := make(chan error, 1)
	go func() {
		follower <- r.Authenticate(context.Background(), Login{Key: alice, Password: "pencil"}, pg.verify)
	}()
	waitFor(t, "both logins to wait", func() bool { return joined.Load() == 2 })

	cancel() // the first client gives up
	if err := <-leader; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled login: %v, want context.Canceled", err)
	}
	close(pg.gate)
	if err := <-follower; err != nil {
		t.Fatalf("the other login failed with the first one's cancellation: %v", err)
	}
	if _, ok := r.Password(alice); !ok || pg.calls.Load() != 1 {
		t.Fatalf("stored %v, verify calls %d; want stored after one call", ok, pg.calls.Load())
	}
}

func TestRegistryCanceledBeforeVerification(t *testing.T) {
	r := newRegistry(t, config.PassthroughEnabled)
	pg := newFakePostgres(r, "alice", "pencil")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled login: %v, want context.Canceled", err)
	}
	if pg.calls.Load() != 0 {
		t.Fatal("verified a password for a client that was already gone")
	}
}

func TestRegistryForget(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, config.PassthroughEnabled)
	pg := newFakePostgres(r, "alice", "pencil", "bob", "builder")
	bob := Key{User: "bob", Database: "app"}
	for _, k := range []Key{alice, bob} {
		if err := r.Authenticate(ctx, Login{Key: k, Password: pg.passwords[k.User]}, pg.verify); err != nil {
			t.Fatal(err)
		}
	}
	r.Forget(alice)
	r.Forget(Key{User: "nobody"}) // unknown: no-op
	if got := r.Keys(); !slices.Equal(got, []Key{bob}) {
		t.Fatalf("Keys after Forget = %v", got)
	}
	if _, ok := r.Password(alice); ok {
		t.Fatal("Password of a forgotten key")
	}
	// Forgotten: the next login is verified again, even in a mode
	// without allow_change (a new password is a first password).
	pg.setPassword("alice", "new")
	calls := pg.calls.Load()
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "new"}, pg.verify); err != nil || pg.calls.Load() != calls+1 {
		t.Fatalf("login after Forget: err %v, calls %d→%d", err, calls, pg.calls.Load())
	}
}

func TestRegistryForgetDuringVerification(t *testing.T) {
	r := newRegistry(t, config.PassthroughEnabled)
	var joined atomic.Int64
	r.joinedFlight = func() { joined.Add(1) }
	pg := newFakePostgres(r, "alice", "pencil")
	pg.gate = make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- r.Authenticate(context.Background(), Login{Key: alice, Password: "pencil"}, pg.verify) }()
	waitFor(t, "the login to wait", func() bool { return joined.Load() == 1 })
	r.Forget(alice) // e.g. a reload removed the user
	close(pg.gate)
	if err := <-done; err != nil {
		t.Fatalf("login verified by Postgres: %v", err)
	}
	if _, ok := r.Password(alice); ok {
		t.Fatal("a verification in flight during Forget stored the key again")
	}
}

func TestRegistryConcurrentFirstPasswordsWithoutChange(t *testing.T) {
	// Without allow_change, of two different passwords verified at the
	// same time (Postgres accepts both, e.g. mid-rotation), the first
	// stored wins and the other is refused.
	r := newRegistry(t, config.PassthroughEnabled)
	var joined atomic.Int64
	r.joinedFlight = func() { joined.Add(1) }
	first, second := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	verify := func(_ context.Context, _ Key, password string) error {
		calls.Add(1)
		if password == "one" {
			<-first
		} else {
			<-second
		}
		return nil
	}
	one, two := make(chan error, 1), make(chan error, 1)
	go func() { one <- r.Authenticate(context.Background(), Login{Key: alice, Password: "one"}, verify) }()
	go func() { two <- r.Authenticate(context.Background(), Login{Key: alice, Password: "two"}, verify) }()
	waitFor(t, "both logins to wait", func() bool { return joined.Load() == 2 })
	close(first)
	if err := <-one; err != nil {
		t.Fatalf("first verified password: %v", err)
	}
	close(second)
	if err := <-two; err != ErrPasswordMismatch {
		t.Fatalf("second verified password: %v, want ErrPasswordMismatch", err)
	}
	if got, _ := r.Password(alice); got != "one" {
		t.Fatalf("Password = %q, want one", got)
	}
}

// TestRegistryConcurrentUse mixes every operation under -race.
func TestRegistryConcurrentUse(t *testing.T) {
	ctx := context.Background()
	r := newRegistry(t, config.PassthroughEnabledAllowChange)
	verify := func(_ context.Context, key Key, password string) error {
		if password != "pw-"+key.User {
			return ErrRejected
		}
		return nil
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				key := Key{User: fmt.Sprintf("u%d", (g+i)%5), Database: "db"}
				password := "pw-" + key.User
				if i%7 == 0 {
					password = "wrong"
				}
				err := r.Authenticate(ctx, Login{Key: key, Password: password}, verify)
				if (password == "wrong") != (err != nil) || (err != nil && !errors.Is(err, ErrPasswordMismatch)) {
					t.Errorf("%s with %q: %v", key, password, err)
					return
				}
				switch i % 10 {
				case 3:
					r.Forget(key)
				case 5:
					_ = r.Keys()
				case 8:
					if got, ok := r.Password(key); ok && got != "pw-"+key.User {
						t.Errorf("Password(%s) = %q", key, got)
					}
				}
			}
		})
	}
	wg.Wait()
}

func TestRegistryFastPathAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	ctx := context.Background()
	r := newRegistry(t, config.PassthroughEnabled)
	verify := func(context.Context, Key, string) error { return nil }
	password := strings.Repeat("long password ", 10) // longer than any stack buffer for []byte(s)
	if err := r.Authenticate(ctx, Login{Key: alice, Password: password}, verify); err != nil {
		t.Fatal(err)
	}
	key := Key{User: strings.Clone(alice.User), Database: strings.Clone(alice.Database)}
	if allocs := testing.AllocsPerRun(1000, func() {
		if err := r.Authenticate(ctx, Login{Key: key, Password: password}, verify); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Fatalf("fast path allocates %v times per login, want 0", allocs)
	}
	wrong := strings.Repeat("wrong password ", 10)
	if allocs := testing.AllocsPerRun(1000, func() {
		if err := r.Authenticate(ctx, Login{Key: key, Password: wrong}, verify); err != ErrPasswordMismatch {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Fatalf("refusing a changed password allocates %v times, want 0", allocs)
	}
}

func TestRegistryFastPathAllocsWhileReverifying(t *testing.T) {
	// A due entry whose check is already running costs the fast path a
	// clock read and an atomic, still no allocation.
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	ctx := context.Background()
	clock := newFakeClock()
	r := newRegistry(t, config.PassthroughEnabled, withClock(clock.Now), WithReverifyInterval(time.Minute))
	pg := newFakePostgres(r, "alice", "pencil")
	if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
		t.Fatal(err)
	}
	pg.gate = make(chan struct{})
	clock.Advance(time.Minute)
	login := Login{Key: alice, Password: "pencil"}
	// A method value made at each call escapes, and would be the one
	// allocation: make it once, as the pooler must.
	verify := VerifyFunc(pg.verify)
	if err := r.Authenticate(ctx, login, verify); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the check to start", func() bool { return pg.calls.Load() == 2 })
	if allocs := testing.AllocsPerRun(1000, func() {
		if err := r.Authenticate(ctx, login, verify); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Fatalf("fast path of a due entry allocates %v times per login, want 0", allocs)
	}
	close(pg.gate)
}

func TestRegistryShards(t *testing.T) {
	// Keys spread over the shards, and a write replaces only its own.
	ctx := context.Background()
	r := newRegistry(t, config.PassthroughEnabledAllowChange, bare...)
	verify := func(context.Context, Key, string) error { return nil }
	const users = 10_000
	var want []Key
	for i := range users {
		key := Key{User: fmt.Sprintf("user%05d", i), Database: "app"}
		want = append(want, key)
		if err := r.Authenticate(ctx, Login{Key: key, Password: "a"}, verify); err != nil {
			t.Fatal(err)
		}
	}
	largest := 0
	for i := range r.snaps {
		n := len(r.snaps[i].Load().entries)
		if n == 0 {
			t.Fatalf("shard %d is empty with %d keys", i, users)
		}
		largest = max(largest, n)
	}
	if mean := users / numShards; largest > 2*mean {
		t.Fatalf("largest shard holds %d keys, mean %d: the hash does not spread", largest, mean)
	}
	if got := r.Keys(); !slices.Equal(got, want) {
		t.Fatalf("Keys() has %d keys, want %d sorted", len(got), len(want))
	}

	var before [numShards]*snapshot
	for i := range r.snaps {
		before[i] = r.snaps[i].Load()
	}
	changed := want[1234]
	if err := r.Authenticate(ctx, Login{Key: changed, Password: "b"}, verify); err != nil {
		t.Fatal(err)
	}
	for i := range r.snaps {
		if replaced := r.snaps[i].Load() != before[i]; replaced != (i == r.shardIndex(changed)) {
			t.Fatalf("shard %d replaced: %v (the changed key is in shard %d)", i, replaced, r.shardIndex(changed))
		}
	}
	if got, _ := r.Password(changed); got != "b" {
		t.Fatalf("Password = %q, want b", got)
	}
	// Same key, same shard, whatever the registry; the seed differs
	// between registries so the spread cannot be aimed at.
	if r.shardIndex(changed) != r.shardIndex(Key{User: strings.Clone(changed.User), Database: "app"}) {
		t.Fatal("shardIndex is not a function of the key")
	}
	// ("ab", "c") and ("a", "bc") are different keys of the same shard
	// only by chance.
	same := 0
	for i := range 64 {
		u := fmt.Sprint("u", i)
		if r.shardIndex(Key{User: u + "x", Database: "y"}) == r.shardIndex(Key{User: u, Database: "xy"}) {
			same++
		}
	}
	if same > 8 {
		t.Fatalf("%d of 64 boundary-shifted keys share a shard", same)
	}
}

func TestLoginStringHasNoPassword(t *testing.T) {
	login := Login{Key: alice, Password: "correct horse", ClientAddr: netip.MustParseAddr("192.0.2.1")}
	for _, s := range []string{login.String(), fmt.Sprint(login), fmt.Sprintf("%v %+v %#v %s", login, login, login, login)} {
		if strings.Contains(s, "horse") {
			t.Fatalf("%q shows the password", s)
		}
	}
	if got := login.String(); got != "alice@app from 192.0.2.1" {
		t.Fatalf("String() = %q", got)
	}
}

// TestRegistryAuthenticateCached: the fast path answers for a verified
// password, and for a different one where passwords cannot change, and
// otherwise leaves the login to Authenticate, without verifying anything.
func TestRegistryAuthenticateCached(t *testing.T) {
	for _, mode := range allModes {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			r := newRegistry(t, mode)
			pg := newFakePostgres(r, "alice", "pencil")
			if done, err := r.AuthenticateCached(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); done {
				t.Fatalf("before any verification: done with %v", err)
			}
			if done, err := r.AuthenticateCached(ctx, Login{Key: alice, Password: ""}, pg.verify); !done || err != ErrPasswordMismatch {
				t.Fatalf("an empty password: done %v, %v; want done, ErrPasswordMismatch", done, err)
			}
			if err := r.Authenticate(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); err != nil {
				t.Fatal(err)
			}
			if done, err := r.AuthenticateCached(ctx, Login{Key: alice, Password: "pencil"}, pg.verify); !done || err != nil {
				t.Fatalf("the verified password: done %v, %v; want done, nil", done, err)
			}
			done, err := r.AuthenticateCached(ctx, Login{Key: alice, Password: "eraser"}, pg.verify)
			if allowsChange(mode) {
				if done {
					t.Fatalf("another password where it may change: done with %v, want it left to Authenticate", err)
				}
			} else if !done || err != ErrPasswordMismatch {
				t.Fatalf("another password: done %v, %v; want done, ErrPasswordMismatch", done, err)
			}
			if pg.calls.Load() != 1 {
				t.Fatalf("verify called %d times, want 1 (Authenticate's)", pg.calls.Load())
			}
		})
	}
}
