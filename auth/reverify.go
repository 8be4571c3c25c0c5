package auth

import (
	"context"
	"errors"
	"time"
)

// reverifyRetryDelay is how long after a re-verification that could not
// reach Postgres the next one may start (at most the reverify interval):
// a login wave while Postgres is down does not turn into a connect loop.
const reverifyRetryDelay = 5 * time.Second

// maxConcurrentReverifies bounds the background re-verifications running
// at once, so a wave of entries falling due together (all verified in the
// same login storm) does not become a wave of goroutines and connection
// attempts. A due entry that finds no slot is checked on a later use.
const maxConcurrentReverifies = 16

// maybeReverify starts a background re-verification of e, key's entry in
// shard i, if it is due and none runs yet. The login that calls it is
// admitted from the snapshot meanwhile: a password changed or revoked in
// Postgres stops being admitted within the reverify interval, plus one
// coarse clock tick, plus one check, after its last verification.
//
// It takes a slot before anything else: when all are busy (a wave of due
// entries), a login pays a failed non-blocking send, which takes no lock,
// and neither the CAS nor bgMu.
func (r *Registry) maybeReverify(ctx context.Context, i int, key Key, e *entry, verify VerifyFunc) {
	if r.fastNow() < e.due || e.checking.Load() {
		return
	}
	select {
	case r.bgSlots <- struct{}{}:
	default:
		return
	}
	if !e.checking.CompareAndSwap(false, true) {
		<-r.bgSlots
		return
	}
	r.bgMu.Lock()
	if r.bgClosed {
		// Leave checking set: a closed registry starts no more.
		r.bgMu.Unlock()
		<-r.bgSlots
		return
	}
	r.bgWG.Add(1)
	r.bgMu.Unlock()

	// The caller's values, not its cancellation (the login is over long
	// before the check), but Close's.
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(r.bgCtx, cancel)
	go func() {
		defer r.bgWG.Done()
		defer func() { <-r.bgSlots }()
		defer cancel()
		defer stop()
		r.reverify(ctx, i, key, e, verify)
	}()
}

// reverify checks e's password against Postgres and applies the outcome,
// if e is still key's entry (a newer password verified meanwhile wins):
//
//   - accepted: a new entry with the same password, verified now;
//   - rejected (ErrRejected): the entry is removed, so later logins with
//     that password take the slow path, and the pair goes into the
//     negative cache, so they are refused without asking Postgres again
//     for the TTL;
//   - any other error (Postgres down or unreachable): the entry stays and
//     keeps admitting, and the next use after reverifyRetryDelay tries
//     again. Locking every user out while Postgres is unreachable would
//     turn an outage into a login outage for no safety gain: Postgres
//     cannot serve the sessions anyway, and pooled connections opened with
//     the password are still valid.
func (r *Registry) reverify(ctx context.Context, i int, key Key, e *entry, verify VerifyFunc) {
	started := r.opts.now()
	err := verify(ctx, key, e.password)
	r.counters.count(err)
	sh := &r.shards[i]
	switch {
	case err == nil:
		sh.mu.Lock()
		if r.snaps[i].Load().entries[key] == e {
			r.replaceLocked(i, key, r.newEntry(e.password, started))
		}
		sh.mu.Unlock()
	case errors.Is(err, ErrRejected):
		// Into the negative cache first, so no login finds the entry gone
		// and the pair not yet cached, and asks Postgres again.
		sh.negative.add(r.mac(key, e.password), r.opts.now(), r.opts.negativeTTL)
		sh.mu.Lock()
		r.removeLocked(i, key, e)
		sh.mu.Unlock()
	case ctx.Err() != nil:
		// Close: nothing more is wanted of this registry's background work.
	default:
		sh.mu.Lock()
		if r.snaps[i].Load().entries[key] == e {
			retry := &entry{password: e.password, digest: e.digest, verified: e.verified,
				due: r.since(r.opts.now().Add(min(reverifyRetryDelay, r.opts.reverifyInterval)))}
			r.replaceLocked(i, key, retry)
		}
		sh.mu.Unlock()
	}
}

// coarseClockTick is how often the coarse clock advances (less for a
// reverify interval under 4 s). Reading the clock costs about 70 ns on the
// development VM, a fifth of a fast-path login; the coarse clock costs an
// atomic load, and makes a due entry wait at most one tick more.
const coarseClockTick = time.Second

// since is t on the registry's clock: nanoseconds since base, monotonic
// when both carry a monotonic reading (time.Now does), so a wall-clock
// step neither hastens nor delays a re-verification.
func (r *Registry) since(t time.Time) int64 {
	return int64(t.Sub(r.base))
}

// fastNow is the fast path's "now" on the registry's clock: the coarse
// clock, or the injected clock in tests.
func (r *Registry) fastNow() int64 {
	if r.coarseTick > 0 {
		return r.coarse.Load()
	}
	return r.since(r.opts.now())
}

// startCoarseClock advances r.coarse every tick until Close.
func (r *Registry) startCoarseClock(tick time.Duration) {
	r.coarseTick = tick
	r.coarse.Store(r.since(time.Now()))
	r.bgWG.Add(1)
	go func() {
		defer r.bgWG.Done()
		ticker := time.NewTicker(tick)
		defer ticker.Stop()
		for {
			select {
			case <-ticker.C:
				r.coarse.Store(r.since(time.Now()))
			case <-r.bgCtx.Done():
				return
			}
		}
	}()
}
