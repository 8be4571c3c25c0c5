package auth

import (
	"net/netip"
	"time"
)

// A verification the failure limits refuse is not always a guess. After a
// restart (nothing verified yet) or a password change under allow_change,
// the right password has to be verified once, and a few wrong passwords
// from the same client address or for the same role (a misconfigured
// client retrying, a guesser) empty the buckets first: refused at once,
// the right password would then wait for a token by luck, or forever while
// the wrong ones keep coming (measured: 1,000 right logins, 1,000 refused,
// integration TestWrongPasswords/drained before this).
//
// So one verification per user may wait for the next token, up to
// throttleWait: the one with the most logins waiting on it now (its
// flight's waiting count). The right password of a role is presented by
// many clients at once after a restart or a rotation, a guess by one, so
// the right one takes the place. Every other refused verification gets
// ErrThrottled after joinGrace (20 ms: the clients of a wave presenting
// the same password join it meanwhile, so it is compared with its whole
// demand). While a verification holds the place, other verifications of
// that user take no token (limiter.reserve), so the waiter gets the next
// one; it wakes when the token is due, on the limiter's clock. It gives up
// when the logins waiting on it all leave (their contexts end), without
// asking Postgres. Postgres sees no more attempts than before: the waiter
// takes a token like any verification. A guesser who presents one guess
// from more clients at once than the right password has can take the
// place, and wins one token per refill period, as without it.

// joinGrace is how long a refused verification that could not take the
// waiting place waits before it compares demands once more: long enough
// for the clients presenting the same password at the same moment (a
// reconnect wave) to join it.
const joinGrace = 20 * time.Millisecond

// tokenPollInterval is how often a waiter looks for a token when no bucket
// says when one is due (a full key table, which refuses until a sweep).
const tokenPollInterval = 10 * time.Millisecond

// tokenWaiter is the verification waiting for a user's next token.
type tokenWaiter struct {
	flight  *flight
	addr    netip.Addr    // its client address's bucket key, if hasAddr
	hasAddr bool          // (addrKey)
	evicted chan struct{} // closed when a verification in higher demand takes the place
}

// awaitToken is called when the limits refused a verification of user's
// password from addr, run by flight f. If no verification with as many
// logins waiting on it holds user's waiting place (now, or after
// joinGrace), it takes the place (evicting the one there) and waits, up
// to throttleWait, until it can take a token of both buckets; it reports
// whether it did. Otherwise, with throttleWait 0, or when every login
// waiting on f leaves first, it reports false.
func (r *Registry) awaitToken(user string, addr netip.Addr, f *flight) bool {
	wait := r.opts.throttleWait
	if wait <= 0 {
		return false
	}
	l := &r.limiter
	w := &tokenWaiter{flight: f, evicted: make(chan struct{})}
	w.addr, w.hasAddr = addrKey(addr)
	claim := func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		if cur := l.waiting[user]; cur != nil {
			if cur.flight.waiting.Load() >= f.waiting.Load() {
				return false
			}
			close(cur.evicted)
		}
		l.waiting[user] = w
		return true
	}
	if !claim() {
		if !r.sleepFor(joinGrace, f, nil) || !claim() {
			return false
		}
	}
	defer func() {
		l.mu.Lock()
		if l.waiting[user] == w {
			delete(l.waiting, user)
		}
		l.mu.Unlock()
	}()

	deadline := r.opts.now().Add(wait)
	for {
		now := r.opts.now()
		l.mu.Lock()
		ok, next := l.reserveLocked(user, addr, now)
		l.mu.Unlock()
		if ok {
			select {
			case <-f.abandoned:
				// Nobody waits for the answer any more: ask Postgres
				// nothing, and give the token to the next verification.
				l.refund(user, addr, r.opts.now())
				return false
			default:
				return true
			}
		}
		remaining := deadline.Sub(now)
		if remaining <= 0 {
			return false
		}
		if next <= 0 {
			next = tokenPollInterval
		}
		if !r.sleepFor(min(next, remaining), f, w.evicted) {
			return false
		}
	}
}

// sleepFor waits d and reports true, or reports false as soon as the
// flight's clients have all left, the registry closes, or evicted closes
// (a nil evicted never does).
func (r *Registry) sleepFor(d time.Duration, f *flight, evicted <-chan struct{}) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-evicted:
	case <-f.abandoned:
	case <-r.bgCtx.Done():
	}
	return false
}
