package auth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/pgtender/pgtender/config"
)

// Key names a passthrough login: the role and the database it connects to.
type Key struct {
	User, Database string
}

// String is "user@database" (no secret is part of a Key).
func (k Key) String() string { return k.User + "@" + k.Database }

// Login is one passthrough login attempt, as Registry.Authenticate takes it.
type Login struct {
	Key Key
	// Password is what the client sent in its PasswordMessage.
	Password string
	// ClientAddr is the client's IP address, for the per-address limit on
	// failed verifications. The zero Addr (a Unix socket, or unknown)
	// is limited per user only.
	ClientAddr netip.Addr
}

// String names the login without its password.
func (l Login) String() string {
	if !l.ClientAddr.IsValid() {
		return l.Key.String()
	}
	return l.Key.String() + " from " + l.ClientAddr.String()
}

// GoString is String, so %#v does not print the password either.
func (l Login) GoString() string { return "auth.Login{" + l.String() + "}" }

var (
	// ErrRejected is what a VerifyFunc wraps when Postgres refused the
	// credentials (SQLSTATE 28P01 or 28000).
	ErrRejected = errors.New("auth: Postgres rejected the credentials")

	// ErrPasswordNotSent is what a VerifyFunc wraps when the password
	// certainly did not reach Postgres: no connection to it was made (the
	// dial failed, the caller gave up waiting for a connect slot, the
	// database is not configured). Such a verification gives its
	// failed-verification tokens back, like a success; any other failure
	// (a timeout after the startup exchange began, a broken connection)
	// keeps them, since Postgres may have logged a failed authentication.
	ErrPasswordNotSent = errors.New("auth: the password did not reach Postgres")

	// ErrThrottled is returned instead of asking Postgres when too many
	// verifications of the login's user or client address failed recently.
	// It wraps ErrPasswordMismatch, so the client gets FATAL 28P01 like
	// for any wrong password; the pooler can count it apart.
	ErrThrottled = fmt.Errorf("%w (too many failed attempts: not verified)", ErrPasswordMismatch)

	// ErrCachedRejection is returned instead of asking Postgres when
	// Postgres rejected the same (key, password) within the negative cache
	// TTL. It wraps ErrPasswordMismatch, so the client gets FATAL 28P01;
	// the pooler can log it apart.
	ErrCachedRejection = fmt.Errorf("%w (rejected by Postgres recently: not asked again)", ErrPasswordMismatch)
)

// VerificationStats counts what a Registry did on its slow path, since it
// was made. OK, Rejected and Error are round trips to Postgres (a
// verification shared by several clients counts once; background
// re-verifications count too); Throttled are verifications not made
// because a failed-verification bucket was empty (once per verification
// that would have been made); CachedRejection are logins refused from the
// negative cache. A login with the verified password (the fast path)
// counts nowhere.
type VerificationStats struct {
	OK, Rejected, Error        uint64
	Throttled, CachedRejection uint64
}

// verificationCounters are a Registry's VerificationStats as atomics.
type verificationCounters struct {
	ok, rejected, failed, throttled, cached atomic.Uint64
}

// count adds the outcome of one round trip to Postgres.
func (c *verificationCounters) count(err error) {
	switch {
	case err == nil:
		c.ok.Add(1)
	case errors.Is(err, ErrRejected):
		c.rejected.Add(1)
	default:
		c.failed.Add(1)
	}
}

// VerificationStats returns the registry's counters now.
func (r *Registry) VerificationStats() VerificationStats {
	c := &r.counters
	return VerificationStats{
		OK: c.ok.Load(), Rejected: c.rejected.Load(), Error: c.failed.Load(),
		Throttled: c.throttled.Load(), CachedRejection: c.cached.Load(),
	}
}

// VerifyFunc opens a real server connection to Postgres as key.User with
// password, and keeps it: the pooler's function puts it into the pool. It
// returns an error wrapping ErrRejected when Postgres refused the
// credentials, one wrapping ErrPasswordNotSent when no connection to
// Postgres was made, any other error when the outcome is unknown.
//
// The Registry calls it on behalf of every client waiting for the same
// (key, password), and in the background to re-verify a stored password,
// so its ctx is not any one client's: it carries the values of the
// triggering caller's context but not its cancellation or deadline (a
// background re-verification is canceled by Registry.Close). The function
// must bound itself (connect_timeout).
type VerifyFunc func(ctx context.Context, key Key, password string) error

// numShards is how many parts the registry's snapshot is split into. A
// write copies one shard, about keys/256 entries: 40 for 10,000 users.
const numShards = 256

// Registry holds the passthrough passwords Postgres has accepted, per
// (user, database). It is safe for concurrent use.
//
// The snapshot is split into numShards shards, chosen by a seeded hash of
// the key. Readers load a shard's immutable map through an atomic pointer,
// so the common login, a known key with the known password, takes no lock
// and allocates nothing. Writers (a newly verified password, a refreshed
// or removed entry, Forget) copy one shard under that shard's mutex and
// publish the copy: a write costs O(keys/numShards), not O(keys). The read
// pointers sit in their own array, apart from the writers' mutexes, so
// taking a mutex does not disturb readers; but the array packs eight
// pointers to a 64-byte cache line, so publishing a shard also evicts that
// line from the caches of readers of its seven neighbours, once per write
// (writes are rare: a new user or password, a re-verification).
//
// In front of the verification (the slow path) sit a negative cache of
// passwords Postgres rejected and a limiter of failed verifications per
// user and per client address; behind the fast path, a background
// re-verification of entries older than the reverify interval. See
// Authenticate.
//
// Measured on the 2-core development VM (AMD EPYC, Go 1.26, go test
// -bench -benchmem -count 5, medians, 2026-12-02 after the review fixes;
// re-verification on, its default):
//
//	BenchmarkRegistryFastPath-2                       174 ns/op     0 B/op   0 allocs/op
//	BenchmarkRegistryFastPathParallel-2               114 ns/op     0 B/op   0 allocs/op
//	BenchmarkRegistryWrite10k/readers=0-2           14582 ns/op  3953 B/op  19 allocs/op
//	BenchmarkRegistryWrite10k/readers=1-2           10563 ns/op  3967 B/op  19 allocs/op  38 reads/op
//
// The fast path has 1,000 users, the parallel one 10,000 (readers share
// nothing they write, so two CPUs log in at once without contention), the
// write 10,000 (readers=1: a goroutine logs in on the fast path meanwhile).
// Most of the fast path is the SHA-256 of the presented password. A write
// (a verified password change) copied the whole map before sharding: 1.9
// ms/op on the same registry.
type Registry struct {
	allowChange bool
	opts        options

	// seed picks a key's shard; macKey keys the HMAC that names a
	// (key, password) for the shared verification (flight.go) and the
	// negative cache, so neither holds the plaintext or an unsalted hash
	// of it.
	seed   maphash.Seed
	macKey [32]byte

	snaps  [numShards]atomic.Pointer[snapshot]
	shards [numShards]shard

	flights  flightGroup
	limiter  limiter
	counters verificationCounters

	// Background re-verifications: tracked so Close can end them.
	bgMu     sync.Mutex
	bgClosed bool
	bgWG     sync.WaitGroup
	bgCtx    context.Context
	bgCancel context.CancelFunc
	bgSlots  chan struct{} // one per running check, maxConcurrentReverifies

	// The fast path's clock for due times: nanoseconds since base,
	// advanced every coarseTick by a ticker (see fastNow).
	base       time.Time
	coarse     atomic.Int64
	coarseTick time.Duration

	// joinedFlight, when set by a test, is called by Authenticate once it
	// waits on a flight (leader or follower).
	joinedFlight func()
}

// shard is the writers' side of one shard of the snapshot.
type shard struct {
	// mu serializes writers; epoch counts removals (Forget, MarkStale, a
	// failed re-verification) so a verification that was in flight when
	// its key was removed does not store it again.
	mu    sync.Mutex
	epoch uint64

	negative negativeCache
}

// snapshot is one immutable generation of a shard.
type snapshot struct {
	entries map[Key]*entry
}

// entry is a verified password. Only checking changes once it is
// published; a refreshed entry is a new entry.
type entry struct {
	password string
	// digest is sha256(password): the fast path compares digests, so the
	// comparison is constant-time whatever the lengths.
	digest [sha256.Size]byte
	// verified is when the verification that stored the password, or
	// last confirmed it, began.
	verified time.Time
	// due is when the password is to be checked against Postgres again,
	// on the registry's clock (see fastNow); 0 when re-verification is
	// off.
	due int64
	// checking is set while a background re-verification of this entry
	// runs, so there is at most one per key.
	checking atomic.Bool
}

// NewRegistry returns an empty registry for mode, with the defaults
// (DefaultReverifyInterval, DefaultNegativeCacheTTL, DefaultFailureLimit
// per user and per address) changed by opts. The modes ending in
// _allow_change let a client replace its verified password by another one
// Postgres accepts; the others keep the first verified password until it
// is removed (Forget, MarkStale, a failed re-verification). The registry
// does not check that mode enables passthrough: the pooler only consults
// it when it does.
//
// Callers must call Close when done, to end background re-verifications.
func NewRegistry(mode config.PassthroughAuth, opts ...Option) *Registry {
	r := &Registry{
		allowChange: mode == config.PassthroughEnabledAllowChange ||
			mode == config.PassthroughEnabledPlainAllowChange,
		opts: defaultOptions(),
		seed: maphash.MakeSeed(),
	}
	for _, opt := range opts {
		opt(&r.opts)
	}
	if _, err := rand.Read(r.macKey[:]); err != nil {
		// crypto/rand.Read does not fail on supported platforms (Go 1.24+).
		panic("auth: reading random bytes: " + err.Error())
	}
	empty := &snapshot{entries: map[Key]*entry{}}
	for i := range r.snaps {
		r.snaps[i].Store(empty)
	}
	r.limiter.init(r.opts.userLimit, r.opts.addrLimit)
	r.bgCtx, r.bgCancel = context.WithCancel(context.Background())
	r.bgSlots = make(chan struct{}, maxConcurrentReverifies)
	r.base = r.opts.now()
	if r.opts.reverifyInterval > 0 && !r.opts.clockInjected {
		r.startCoarseClock(max(min(coarseClockTick, r.opts.reverifyInterval/4), time.Millisecond))
	}
	return r
}

// Close cancels the background re-verifications in flight, stops the
// coarse clock, and waits for them to return. Authenticate keeps working afterwards, without starting
// new ones.
func (r *Registry) Close() {
	r.bgMu.Lock()
	r.bgClosed = true
	r.bgMu.Unlock()
	r.bgCancel()
	r.bgWG.Wait()
}

// Authenticate admits login, or says why not:
//
//   - the verified password of login.Key: nil at once (no lock, no
//     allocation). If the entry is older than the reverify interval, a
//     background re-verification starts (see reverify);
//   - an empty password: ErrPasswordMismatch (Postgres refuses those);
//   - another password for a known key, in a mode without allow_change:
//     ErrPasswordMismatch, without asking Postgres;
//   - a (key, password) Postgres rejected within the negative cache TTL:
//     ErrCachedRejection (wrapping ErrPasswordMismatch), without asking
//     Postgres;
//   - an unknown key, or another password under *_allow_change: verify is
//     called first, and the password is stored only if Postgres accepted
//     it (and no password whose verification began later was stored
//     meanwhile). Concurrent calls for the same key and password share one
//     verify. Before it, the verification takes a token from the
//     failed-verification buckets of the user and of the client address;
//     without one every caller sharing it gets ErrThrottled within about
//     joinGrace, unless no verification waits for the user's next token
//     or it has more callers waiting on it than the one that does: then
//     it takes that place and waits, up to the throttle wait
//     (DefaultThrottleWait unless set; throttle.go). A rejection keeps
//     the tokens and is remembered in the negative cache; a success, or an
//     error wrapping ErrPasswordNotSent, gives them back; any other error
//     keeps them (the password may have reached Postgres). An error
//     wrapping ErrRejected becomes ErrPasswordMismatch; any other verify
//     error is returned (wrapped, with the key) and nothing is remembered,
//     so the next login asks again.
//
// So a flood of wrong passwords costs Postgres a bounded number of
// attempts, and never delays a client presenting the verified password.
// The price: while a user's bucket is empty, a correct password that still
// needs verifying (a first login after a restart, a new password under
// allow_change) waits for the next token, up to a refill period, when more
// clients present it at once than any guess; presented by one client at a
// time, it is refused (ErrThrottled) like a guess until a token is free.
// Verification attempts are limited; the fast path always works.
//
// When ctx ends first, Authenticate returns ctx's error while the shared
// verification carries on for the other callers.
//
// verify is kept by the verification and the background check, so it
// escapes: pass a func value made once (a field set to p.verifyPassthrough
// at startup), not a method value written at the call, which would cost
// the fast path an allocation per login.
func (r *Registry) Authenticate(ctx context.Context, login Login, verify VerifyFunc) error {
	if done, err := r.AuthenticateCached(ctx, login, verify); done {
		return err
	}
	return r.verifyAndStore(ctx, r.shardIndex(login.Key), login, verify)
}

// AuthenticateCached is Authenticate's fast path, which never waits: done
// is false when the login needs the slow path (a verification, the
// negative cache), which Authenticate then takes. A caller that would
// bound the wait of the slow path with a context of its own (a deadline,
// a timer) makes it only then; ctx is used here for its values alone, by
// the background check of a verification that is due.
func (r *Registry) AuthenticateCached(ctx context.Context, login Login, verify VerifyFunc) (done bool, err error) {
	if login.Password == "" {
		return true, ErrPasswordMismatch
	}
	i := r.shardIndex(login.Key)
	if e, found := r.snaps[i].Load().entries[login.Key]; found {
		if e.matches(login.Password) {
			if e.due != 0 {
				r.maybeReverify(ctx, i, login.Key, e, verify)
			}
			return true, nil
		}
		if !r.allowChange {
			return true, ErrPasswordMismatch
		}
	}
	return false, nil
}

// shardIndex picks key's shard with a seeded hash, without allocating.
// The parts are hashed apart and combined with an odd multiplier, so
// ("ab", "c") and ("a", "bc"), or (x, y) and (y, x), share a shard only
// by chance. (One maphash.Hash over both parts costs half as much again.)
func (r *Registry) shardIndex(key Key) int {
	h := maphash.String(r.seed, key.User) ^ maphash.String(r.seed, key.Database)*0x9e3779b97f4a7c15
	return int(h % numShards)
}

// matches compares password with e's in constant time, without allocating.
func (e *entry) matches(password string) bool {
	digest := sha256.Sum256(stringBytes(password))
	return subtle.ConstantTimeCompare(digest[:], e.digest[:]) == 1
}

// stringBytes views s as bytes without copying; the bytes must not be
// modified (sha256 only reads them).
func stringBytes(s string) []byte {
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// verifyAndStore is the slow path: the negative cache, then one shared,
// rate-limited verification per (key, password), then a copy-on-write
// store.
func (r *Registry) verifyAndStore(ctx context.Context, i int, login Login, verify VerifyFunc) error {
	key, password := login.Key, login.Password
	if err := ctx.Err(); err != nil {
		// The client is gone: do not open a server connection for it.
		return fmt.Errorf("auth: before verifying %s: %w", key, context.Cause(ctx))
	}
	sh := &r.shards[i]
	mac := r.mac(key, password)
	now := r.opts.now()
	if sh.negative.rejected(mac, now) {
		r.counters.cached.Add(1)
		return ErrCachedRejection
	}
	sh.mu.Lock()
	epoch := sh.epoch
	sh.mu.Unlock()

	detached := context.WithoutCancel(ctx)
	f := r.flights.join(mac, func(f *flight) error {
		if !r.limiter.reserve(key.User, login.ClientAddr, r.opts.now()) &&
			!r.awaitToken(key.User, login.ClientAddr, f) {
			r.counters.throttled.Add(1)
			return ErrThrottled
		}
		started := r.opts.now()
		err := verify(detached, key, password)
		r.counters.count(err)
		if errors.Is(err, ErrRejected) {
			// Keep the tokens: this is the failure they limit.
			sh.negative.add(mac, r.opts.now(), r.opts.negativeTTL)
			return err
		}
		if err != nil && !errors.Is(err, ErrPasswordNotSent) {
			// Keep the tokens too: the password may have reached Postgres
			// (a timeout after the startup message), which then logged a
			// failure the bucket bound must count.
			return err
		}
		r.limiter.refund(key.User, login.ClientAddr, r.opts.now())
		if err != nil {
			return err
		}
		return r.store(i, key, password, epoch, started)
	})
	defer r.flights.leave(mac, f)
	if r.joinedFlight != nil {
		r.joinedFlight()
	}

	select {
	case <-f.done:
		switch {
		case f.err == nil:
			return nil
		case f.err == ErrThrottled:
			return ErrThrottled
		case errors.Is(f.err, ErrPasswordMismatch), errors.Is(f.err, ErrRejected):
			return ErrPasswordMismatch
		default:
			return fmt.Errorf("auth: verifying the password of %s against Postgres: %w", key, f.err)
		}
	case <-ctx.Done():
		return fmt.Errorf("auth: waiting for the verification of %s: %w", key, context.Cause(ctx))
	}
}

// store publishes password as key's verified password, verified at
// started, unless the shard lost a key since epoch (then the caller is
// admitted, as Postgres accepted the password, but nothing is remembered:
// a reload may have removed the key). Without allow_change, a password
// that another login verified and stored first wins, and this one gets
// ErrPasswordMismatch. With allow_change, so does a password whose
// verification began before the stored one's: Postgres accepted it, then
// the password changed (ALTER ROLE) and the new one was verified and
// stored while this verification was finishing; storing it would put the
// old password back until a re-verification.
func (r *Registry) store(i int, key Key, password string, epoch uint64, started time.Time) error {
	sh := &r.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.epoch != epoch {
		return nil
	}
	if e, ok := r.snaps[i].Load().entries[key]; ok {
		if e.matches(password) {
			return nil
		}
		if !r.allowChange || e.verified.After(started) {
			return ErrPasswordMismatch
		}
	}
	r.replaceLocked(i, key, r.newEntry(password, started))
	return nil
}

// newEntry is a verified password, due for re-verification one interval
// after verified (never when re-verification is off).
func (r *Registry) newEntry(password string, verified time.Time) *entry {
	e := &entry{password: password, digest: sha256.Sum256([]byte(password)), verified: verified}
	if r.opts.reverifyInterval > 0 {
		e.due = r.since(verified.Add(r.opts.reverifyInterval))
	}
	return e
}

// replaceLocked publishes a copy of shard i with key set to e, or removed
// when e is nil. The shard's mu must be held.
func (r *Registry) replaceLocked(i int, key Key, e *entry) {
	// maps.Clone copies the table as it is, without rehashing each key.
	entries := maps.Clone(r.snaps[i].Load().entries)
	if e == nil {
		delete(entries, key)
	} else {
		entries[key] = e
	}
	r.snaps[i].Store(&snapshot{entries: entries})
}

// removeLocked removes key from shard i if its entry is still e (any
// entry when e is nil), and counts the removal in the shard's epoch so a
// verification in flight does not store the key again. It reports whether
// it removed anything. The shard's mu must be held.
func (r *Registry) removeLocked(i int, key Key, e *entry) bool {
	cur, ok := r.snaps[i].Load().entries[key]
	if !ok || (e != nil && cur != e) {
		return false
	}
	r.shards[i].epoch++
	r.replaceLocked(i, key, nil)
	return true
}

// mac is an HMAC of (key, password) under a per-registry random key: it
// names the shared verification and the negative cache entry of the pair without
// holding the plaintext. Lengths are encoded so distinct (user, database,
// password) triples cannot collide by concatenation.
func (r *Registry) mac(key Key, password string) [sha256.Size]byte {
	mac := hmac.New(sha256.New, r.macKey[:])
	var n [8]byte
	for _, part := range [...]string{key.User, key.Database, password} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		mac.Write(n[:])
		mac.Write(stringBytes(part))
	}
	var sum [sha256.Size]byte
	mac.Sum(sum[:0])
	return sum
}

// Password returns the verified password of key, for the pool to open
// further server connections.
func (r *Registry) Password(key Key) (string, bool) {
	e, ok := r.snaps[r.shardIndex(key)].Load().entries[key]
	if !ok {
		return "", false
	}
	return e.password, true
}

// Forget removes key, e.g. when a reload removes its user. The next login
// of key is verified against Postgres again; verifications already in
// flight for keys of the same shard (key's included) admit their callers
// but do not store the password.
func (r *Registry) Forget(key Key) {
	i := r.shardIndex(key)
	sh := &r.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	// Count the Forget even when the key is not stored yet: its first
	// verification may be in flight.
	if !r.removeLocked(i, key, nil) {
		sh.epoch++
	}
}

// MarkStale tells the registry that Postgres refused password for key
// (28P01) when the pool opened a server connection with it on its own, to
// keep min_pool_size or replace a connection. If password is still key's
// verified password, the entry is removed and MarkStale reports true: the
// pool should stop opening connections for key until Password(key) returns
// a password again (the next client login verifies one against Postgres
// first). It reports false when the registry holds another password, or
// none: a newer password was verified meanwhile (the pool may use it), or
// the entry was already removed. Either way the pair goes into the
// negative cache.
func (r *Registry) MarkStale(key Key, password string) bool {
	i := r.shardIndex(key)
	sh := &r.shards[i]
	// Postgres refused the pair, whether or not it is still the stored
	// one. Cached before the removal, so no login in between asks again.
	sh.negative.add(r.mac(key, password), r.opts.now(), r.opts.negativeTTL)
	sh.mu.Lock()
	e, ok := r.snaps[i].Load().entries[key]
	removed := ok && e.matches(password) && r.removeLocked(i, key, e)
	sh.mu.Unlock()
	return removed
}

// Keys lists the keys with a verified password, sorted by user then
// database.
func (r *Registry) Keys() []Key {
	var keys []Key
	for i := range r.snaps {
		for k := range r.snaps[i].Load().entries {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b Key) int {
		if c := strings.Compare(a.User, b.User); c != 0 {
			return c
		}
		return strings.Compare(a.Database, b.Database)
	})
	return keys
}
