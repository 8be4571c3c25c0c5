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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/pgtender/pgtender/config"
	"golang.org/x/sync/singleflight"
)

// Key names a passthrough login: the role and the database it connects to.
type Key struct {
	User, Database string
}

// String is "user@database" (no secret is part of a Key).
func (k Key) String() string { return k.User + "@" + k.Database }

// ErrRejected is what a VerifyFunc wraps when Postgres refused the
// credentials (SQLSTATE 28P01 or 28000).
var ErrRejected = errors.New("auth: Postgres rejected the credentials")

// VerifyFunc opens a real server connection to Postgres as key.User with
// password, and keeps it: the pooler's function puts it into the pool. It
// returns an error wrapping ErrRejected when Postgres refused the
// credentials, any other error when Postgres could not be asked.
//
// The Registry calls it on behalf of every client waiting for the same
// (key, password), so its ctx is not any one client's: it carries the
// values of the first caller's context but not its cancellation or
// deadline. The function must bound itself (connect_timeout).
type VerifyFunc func(ctx context.Context, key Key, password string) error

// Registry holds the passthrough passwords Postgres has accepted, per
// (user, database). It is safe for concurrent use.
//
// Readers load an immutable snapshot through an atomic pointer, so the
// common login, a known key with the known password, takes no lock and
// allocates nothing. Writers (a newly verified password, Forget) copy the
// snapshot under mu and publish the copy. Copying is O(keys) per write,
// which is cheap next to the Postgres round trip each write follows.
//
// Where later features go: per-entry state (verification time for periodic
// re-verification, failure counts) belongs in entry, which is immutable and
// replaced, never mutated; negative caching and the failed-login limiter sit
// in front of the slow path in Authenticate, before the singleflight.
type Registry struct {
	allowChange bool

	snap atomic.Pointer[snapshot]

	// mu serializes writers; epoch counts Forget calls so a verification
	// that was in flight when its key was forgotten does not store it again.
	mu    sync.Mutex
	epoch uint64

	flights singleflight.Group
	// flightKey keys the HMAC that names a flight, so the singleflight
	// key identifies (key, password) without containing the password or
	// an unsalted hash of it.
	flightKey [32]byte

	// joinedFlight, when set by a test, is called by Authenticate once it
	// waits on a flight (leader or follower).
	joinedFlight func()
}

// snapshot is one immutable generation of the registry.
type snapshot struct {
	entries map[Key]*entry
}

// entry is a verified password. It is never modified once published.
type entry struct {
	password string
	// digest is sha256(password): the fast path compares digests, so the
	// comparison is constant-time whatever the lengths.
	digest [sha256.Size]byte
}

// NewRegistry returns an empty registry for mode. The modes ending in
// _allow_change let a client replace its verified password by another one
// Postgres accepts; the others keep the first verified password until
// Forget. The registry does not check that mode enables passthrough: the
// pooler only consults it when it does.
func NewRegistry(mode config.PassthroughAuth) *Registry {
	r := &Registry{
		allowChange: mode == config.PassthroughEnabledAllowChange ||
			mode == config.PassthroughEnabledPlainAllowChange,
	}
	if _, err := rand.Read(r.flightKey[:]); err != nil {
		// crypto/rand.Read does not fail on supported platforms (Go 1.24+).
		panic("auth: reading random bytes: " + err.Error())
	}
	r.snap.Store(&snapshot{entries: map[Key]*entry{}})
	return r
}

// Authenticate admits (key, password), or says why not:
//
//   - the verified password of key: nil at once (no lock, no allocation);
//   - an empty password: ErrPasswordMismatch (Postgres refuses those);
//   - another password for a known key, in a mode without allow_change:
//     ErrPasswordMismatch, without asking Postgres;
//   - an unknown key, or another password under *_allow_change: verify is
//     called first, and the password is stored only if Postgres accepted
//     it. Concurrent calls for the same key and password share one verify.
//     An error wrapping ErrRejected becomes ErrPasswordMismatch; any other
//     verify error is returned (wrapped, with the key) and nothing is
//     remembered, so the next login asks again.
//
// When ctx ends first, Authenticate returns ctx's error while the shared
// verification carries on for the other callers.
func (r *Registry) Authenticate(ctx context.Context, key Key, password string, verify VerifyFunc) error {
	if password == "" {
		return ErrPasswordMismatch
	}
	if e, ok := r.snap.Load().entries[key]; ok {
		if e.matches(password) {
			return nil
		}
		if !r.allowChange {
			return ErrPasswordMismatch
		}
	}
	return r.verifyAndStore(ctx, key, password, verify)
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

// verifyAndStore is the slow path: one shared verification per (key,
// password), then a copy-on-write store.
func (r *Registry) verifyAndStore(ctx context.Context, key Key, password string, verify VerifyFunc) error {
	if err := ctx.Err(); err != nil {
		// The client is gone: do not open a server connection for it.
		return fmt.Errorf("auth: before verifying %s: %w", key, context.Cause(ctx))
	}
	r.mu.Lock()
	epoch := r.epoch
	r.mu.Unlock()

	detached := context.WithoutCancel(ctx)
	results := r.flights.DoChan(r.flightName(key, password), func() (any, error) {
		if err := verify(detached, key, password); err != nil {
			return nil, err
		}
		return nil, r.store(key, password, epoch)
	})
	if r.joinedFlight != nil {
		r.joinedFlight()
	}

	select {
	case res := <-results:
		switch {
		case res.Err == nil:
			return nil
		case errors.Is(res.Err, ErrPasswordMismatch), errors.Is(res.Err, ErrRejected):
			return ErrPasswordMismatch
		default:
			return fmt.Errorf("auth: verifying the password of %s against Postgres: %w", key, res.Err)
		}
	case <-ctx.Done():
		return fmt.Errorf("auth: waiting for the verification of %s: %w", key, context.Cause(ctx))
	}
}

// store publishes password as key's verified password, unless Forget was
// called since epoch (then the caller is admitted, as Postgres accepted the
// password, but nothing is remembered: a reload may have removed the key). Without allow_change, a
// password that another login verified and stored first wins, and this
// one gets ErrPasswordMismatch.
func (r *Registry) store(key Key, password string, epoch uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.epoch != epoch {
		return nil
	}
	old := r.snap.Load()
	if e, ok := old.entries[key]; ok {
		if e.matches(password) {
			return nil
		}
		if !r.allowChange {
			return ErrPasswordMismatch
		}
	}
	entries := make(map[Key]*entry, len(old.entries)+1)
	for k, e := range old.entries {
		entries[k] = e
	}
	entries[key] = &entry{password: password, digest: sha256.Sum256([]byte(password))}
	r.snap.Store(&snapshot{entries: entries})
	return nil
}

// flightName names the singleflight of (key, password) with an HMAC under
// a per-registry random key, so it holds no plaintext. Lengths are encoded
// so distinct (user, database, password) triples cannot collide by
// concatenation.
func (r *Registry) flightName(key Key, password string) string {
	mac := hmac.New(sha256.New, r.flightKey[:])
	var n [8]byte
	for _, part := range [...]string{key.User, key.Database, password} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		mac.Write(n[:])
		mac.Write([]byte(part))
	}
	return string(mac.Sum(nil))
}

// Password returns the verified password of key, for the pool to open
// further server connections.
func (r *Registry) Password(key Key) (string, bool) {
	e, ok := r.snap.Load().entries[key]
	if !ok {
		return "", false
	}
	return e.password, true
}

// Forget removes key, e.g. when a reload removes its user. The next login
// of key is verified against Postgres again; verifications already in
// flight (of any key) admit their callers but do not store the password.
func (r *Registry) Forget(key Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.epoch++
	old := r.snap.Load()
	if _, ok := old.entries[key]; !ok {
		return
	}
	entries := make(map[Key]*entry, len(old.entries))
	for k, e := range old.entries {
		if k != key {
			entries[k] = e
		}
	}
	r.snap.Store(&snapshot{entries: entries})
}

// Keys lists the keys with a verified password, sorted by user then
// database.
func (r *Registry) Keys() []Key {
	entries := r.snap.Load().entries
	keys := make([]Key, 0, len(entries))
	for k := range entries {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b Key) int {
		if c := strings.Compare(a.User, b.User); c != 0 {
			return c
		}
		return strings.Compare(a.Database, b.Database)
	})
	return keys
}
