package auth

import (
	"net/netip"
	"sync"
	"time"
)

const (
	// limiterMaxKeys bounds the buckets of each kind (users, addresses),
	// so a flood of logins with random user names from random addresses
	// cannot grow memory without bound: about 4 MB each at most.
	limiterMaxKeys = 1 << 16
	// limiterSweepEvery is how often full buckets (which say nothing a
	// missing one does not) are dropped.
	limiterSweepEvery = 10 * time.Second
)

// limiter limits failed verifications per user and per client address,
// with one token bucket each. A verification takes a token from both
// before it asks Postgres (so concurrent attempts count too) and gives
// them back only when Postgres accepted the password or certainly never
// saw it (ErrPasswordNotSent): rejections, and failures after which
// Postgres may have logged one (a timeout), drain the buckets.
//
// It sits on the slow path only, so one mutex is enough: the fast path (a
// verified password) never reaches it, and is never delayed by it.
//
// When a kind is full of buckets still draining (limiterMaxKeys at once,
// an attack from more addresses or on more user names than that within a
// refill period), a new key is refused: the limiter fails closed, keeping
// Postgres's load bounded at the cost of first logins during such an
// attack.
type limiter struct {
	mu    sync.Mutex
	users buckets[string]
	addrs buckets[netip.Addr]
	// waiting holds, per user, the one verification waiting for the next
	// token (throttle.go).
	waiting map[string]*tokenWaiter
}

func (l *limiter) init(perUser, perAddress Limit) {
	l.users.init(perUser)
	l.addrs.init(perAddress)
	l.waiting = make(map[string]*tokenWaiter)
}

// reserve takes a token for user and for addr (when valid), or neither,
// and reports whether it did. While a verification of user waits for a
// token (throttle.go) and only the user's bucket holds it back, reserve
// takes none: that token is the waiter's.
func (l *limiter) reserve(user string, addr netip.Addr, now time.Time) bool {
	if l.users.off() && l.addrs.off() {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.waiting[user]; w != nil && (!w.hasAddr || l.addrs.allows(w.addr, now)) {
		// A waiter held back by its own address's bucket does not hold
		// back the others: a guesser on a drained address would otherwise
		// park a waiter to refuse every other address's first logins.
		return false
	}
	ok, _ := l.reserveLocked(user, addr, now)
	return ok
}

// reserveLocked is reserve with l.mu held, without regard to a waiter (the
// waiter's own reserve). When it takes no token, wait
// is how long until both buckets will have one (if nothing else takes
// them first).
func (l *limiter) reserveLocked(user string, addr netip.Addr, now time.Time) (ok bool, wait time.Duration) {
	a, hasAddr := addrKey(addr)
	l.users.maybeSweep(now, limiterSweepEvery)
	l.addrs.maybeSweep(now, limiterSweepEvery)
	if !l.users.allows(user, now) || hasAddr && !l.addrs.allows(a, now) {
		wait = l.users.untilToken(user, now)
		if hasAddr {
			wait = max(wait, l.addrs.untilToken(a, now))
		}
		return false, wait
	}
	l.users.take(user, now)
	if hasAddr {
		l.addrs.take(a, now)
	}
	return true, 0
}

// refund gives back the tokens of a reserve whose verification succeeded
// or never reached Postgres.
func (l *limiter) refund(user string, addr netip.Addr, now time.Time) {
	if l.users.off() && l.addrs.off() {
		return
	}
	a, hasAddr := addrKey(addr)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.users.give(user, now)
	if hasAddr {
		l.addrs.give(a, now)
	}
}

// addrKey is the bucket key of a client address: IPv4 (also when mapped
// into IPv6) as it is, IPv6 by its /64, which one host usually holds whole.
func addrKey(addr netip.Addr) (netip.Addr, bool) {
	if !addr.IsValid() {
		return netip.Addr{}, false
	}
	addr = addr.Unmap()
	if addr.Is4() {
		return addr, true
	}
	prefix, err := addr.Prefix(64)
	if err != nil {
		return netip.Addr{}, false
	}
	return prefix.Addr(), true
}

// buckets are token buckets kept as GCRA (the generic cell rate
// algorithm): one time per key, the "theoretical arrival time" tat. A
// token is available when tat is at most (Burst-1)×Every after now;
// taking one moves tat Every later. A bucket with tat not after now is
// full and is the same as no bucket, so it is deleted. The caller holds
// the limiter's mu.
type buckets[K comparable] struct {
	limit Limit
	tat   map[K]time.Time
	swept time.Time // last sweep
}

func (b *buckets[K]) init(limit Limit) {
	if limit.Burst <= 0 || limit.Every <= 0 {
		limit = Limit{} // off
	}
	b.limit = limit
	b.tat = make(map[K]time.Time)
}

func (b *buckets[K]) off() bool { return b.limit.Burst == 0 }

// allows reports whether k has a token at now.
func (b *buckets[K]) allows(k K, now time.Time) bool {
	if b.off() {
		return true
	}
	tat, ok := b.tat[k]
	if !ok {
		if len(b.tat) >= limiterMaxKeys {
			// Full: sweep, but at most once a second, so an attack
			// cannot make every login pay for a sweep.
			b.maybeSweep(now, time.Second)
			return len(b.tat) < limiterMaxKeys
		}
		return true
	}
	return !tat.After(now.Add(time.Duration(b.limit.Burst-1) * b.limit.Every))
}

// untilToken is how long until k has a token, 0 if it has one now (or no
// bucket is kept for it: a full key table refuses until a sweep).
func (b *buckets[K]) untilToken(k K, now time.Time) time.Duration {
	tat, ok := b.tat[k]
	if b.off() || !ok {
		return 0
	}
	return max(tat.Sub(now)-time.Duration(b.limit.Burst-1)*b.limit.Every, 0)
}

// take spends one token of k; allows must have said yes.
func (b *buckets[K]) take(k K, now time.Time) {
	if b.off() {
		return
	}
	tat := b.tat[k]
	if tat.Before(now) {
		tat = now
	}
	b.tat[k] = tat.Add(b.limit.Every)
}

// give returns one token of k.
func (b *buckets[K]) give(k K, now time.Time) {
	if b.off() {
		return
	}
	tat, ok := b.tat[k]
	if !ok {
		return
	}
	if tat = tat.Add(-b.limit.Every); tat.After(now) {
		b.tat[k] = tat
	} else {
		delete(b.tat, k)
	}
}

// maybeSweep deletes the full buckets, unless it did less than every ago.
func (b *buckets[K]) maybeSweep(now time.Time, every time.Duration) {
	if len(b.tat) == 0 || now.Sub(b.swept) < every {
		return
	}
	b.swept = now
	for k, tat := range b.tat {
		if !tat.After(now) {
			delete(b.tat, k)
		}
	}
}
