package auth

import (
	"crypto/sha256"
	"net/netip"
	"sync"
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
// throttleWait: the one whose password the most logins presented lately.
// The right password of a role is presented by every client of it, a
// guess by one, so the right one takes the place and gets the next token;
// every other refused verification gets ErrThrottled after joinGrace
// (20 ms: the clients of a wave presenting the same password join it
// meanwhile, so it is compared with its whole demand), and no login waits
// longer behind a guess but the one in the place, so a flood holds few
// login slots. Postgres sees no more attempts than before: the waiter
// takes a token like any verification. A guesser who presents each guess
// many times can take the place, and wins one token per refill period, as
// before.

// demandWindow is how long presentations of a password count towards its
// demand.
const demandWindow = 10 * time.Second

// demandShardSize bounds the (key, password) pairs one shard counts:
// 256 × 256 shards, about 4 MB at most. When a shard is full of pairs
// presented within demandWindow, a new pair counts as presented once.
const demandShardSize = 256

// demandCounter counts, for one shard, how many slow-path logins
// presented each (key, password) pair lately, by its MAC (never the
// password).
type demandCounter struct {
	mu    sync.Mutex
	pairs map[[sha256.Size]byte]demandRecord
	swept time.Time // last sweep of a full shard
}

type demandRecord struct {
	n     int
	since time.Time // start of the window n counts in
}

// present counts one presentation of mac at now and returns how many fell
// in the current window, this one included.
func (c *demandCounter) present(mac [sha256.Size]byte, now time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pairs == nil {
		c.pairs = make(map[[sha256.Size]byte]demandRecord)
	}
	rec, ok := c.pairs[mac]
	if !ok || now.Sub(rec.since) >= demandWindow {
		if !ok && len(c.pairs) >= demandShardSize {
			// Sweep at most once a second, so a flood of distinct
			// passwords does not make every login pay for one.
			if now.Sub(c.swept) >= time.Second {
				c.swept = now
				for k, r := range c.pairs {
					if now.Sub(r.since) >= demandWindow {
						delete(c.pairs, k)
					}
				}
			}
			if len(c.pairs) >= demandShardSize {
				return 1
			}
		}
		rec = demandRecord{since: now}
	}
	rec.n++
	c.pairs[mac] = rec
	return rec.n
}

// current is how many presentations of mac fall in the window at now.
func (c *demandCounter) current(mac [sha256.Size]byte, now time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	rec, ok := c.pairs[mac]
	if !ok || now.Sub(rec.since) >= demandWindow {
		return 0
	}
	return rec.n
}

// joinGrace is how long a refused verification that could not take the
// waiting place waits before it compares demands once more: long enough
// for the clients presenting the same password at the same moment (a
// reconnect wave) to join it.
const joinGrace = 20 * time.Millisecond

// tokenWaiter is the verification waiting for a user's next token.
type tokenWaiter struct {
	demand  func() int    // its password's demand now
	evicted chan struct{} // closed when a verification in higher demand takes the place
}

// awaitToken is called when the limits refused a verification of user's
// password from addr; demand reads how many logins presented that
// password lately. If no verification in as high a demand waits for
// user's next token (now, or after joinGrace), it takes the place
// (evicting the one there) and waits, up to throttleWait, until it can
// take a token of both buckets; it reports whether it did. Otherwise, or
// with throttleWait 0, it reports false.
func (r *Registry) awaitToken(user string, addr netip.Addr, demand func() int) bool {
	wait := r.opts.throttleWait
	if wait <= 0 {
		return false
	}
	l := &r.limiter
	w := &tokenWaiter{demand: demand, evicted: make(chan struct{})}
	claim := func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		if cur := l.waiting[user]; cur != nil {
			if cur.demand() >= w.demand() {
				return false
			}
			close(cur.evicted)
		}
		l.waiting[user] = w
		return true
	}
	if !claim() {
		grace := time.NewTimer(joinGrace)
		select {
		case <-grace.C:
		case <-r.bgCtx.Done():
			grace.Stop()
			return false
		}
		if !claim() {
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

	deadline := time.Now().Add(wait)
	for {
		l.mu.Lock()
		ok, next := l.reserveLocked(user, addr, r.opts.now())
		l.mu.Unlock()
		if ok {
			return true
		}
		remaining := time.Until(deadline)
		if remaining <= 0 {
			return false
		}
		// next is 0 when no bucket says when (a full key table): poll
		// gently then.
		timer := time.NewTimer(min(max(next, 10*time.Millisecond), remaining))
		select {
		case <-timer.C:
		case <-w.evicted:
			timer.Stop()
			return false
		case <-r.bgCtx.Done():
			timer.Stop()
			return false
		}
	}
}
