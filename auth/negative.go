package auth

import (
	"crypto/sha256"
	"sync"
	"time"
)

// negativeCacheShardSize bounds the rejected (key, password) pairs one
// shard remembers: 64 × 256 shards = 16,384 pairs at most, under 2 MB,
// whatever a flood of random wrong passwords does. The oldest is evicted
// first.
const negativeCacheShardSize = 64

// negativeCache remembers, for one shard, the (key, password) pairs
// Postgres rejected, each for a TTL, so a wave of clients presenting an
// old password after a rotation is refused without a Postgres round trip
// each. A pair is named by its HMAC under the registry's random key, never
// by the password or an unsalted hash of it.
//
// The trade-off: a password that becomes valid again within the TTL (the
// role's password changed back, a NOLOGIN lifted) is still refused until
// the TTL ends. It is never refused longer than that: entries expire, and
// nothing renews them but another rejection by Postgres.
//
// Since the TTL is the same for every pair, insertion order is expiry
// order: a ring of insertions evicts the oldest in O(1).
type negativeCache struct {
	mu    sync.Mutex
	pairs map[[sha256.Size]byte]negativeRecord // each pair's latest record
	ring  []negativeRecord                     // insertion order; allocated on first use
	head  int                                  // index of the oldest record in ring
	n     int                                  // records in ring
	seq   uint64                               // numbers records
}

type negativeRecord struct {
	mac     [sha256.Size]byte
	expires time.Time
	seq     uint64
}

// rejected reports whether mac was rejected less than the TTL before now.
func (c *negativeCache) rejected(mac [sha256.Size]byte, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	rec, ok := c.pairs[mac]
	if !ok {
		return false
	}
	if !now.Before(rec.expires) {
		delete(c.pairs, mac) // its ring record goes when it is evicted
		return false
	}
	return true
}

// add remembers that mac was rejected at now, for ttl (nothing when ttl is
// 0), evicting the oldest record when the shard is full.
func (c *negativeCache) add(mac [sha256.Size]byte, now time.Time, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ring == nil {
		c.ring = make([]negativeRecord, negativeCacheShardSize)
		c.pairs = make(map[[sha256.Size]byte]negativeRecord, negativeCacheShardSize)
	}
	for c.n > 0 && !now.Before(c.ring[c.head].expires) {
		c.evictOldestLocked() // expired
	}
	if c.n == len(c.ring) {
		c.evictOldestLocked()
	}
	c.seq++
	rec := negativeRecord{mac: mac, expires: now.Add(ttl), seq: c.seq}
	c.ring[(c.head+c.n)%len(c.ring)] = rec
	c.n++
	// A pair rejected again is renewed; its older record in the ring no
	// longer matches the map and is dropped when evicted.
	c.pairs[mac] = rec
}

// evictOldestLocked drops the oldest record, and its map entry if the
// record is still the pair's latest.
func (c *negativeCache) evictOldestLocked() {
	old := c.ring[c.head]
	if latest, ok := c.pairs[old.mac]; ok && latest.seq == old.seq {
		delete(c.pairs, old.mac)
	}
	c.ring[c.head] = negativeRecord{}
	c.head = (c.head + 1) % len(c.ring)
	c.n--
}

// len is the number of pairs remembered (expired ones included until they
// are looked up or evicted), for tests.
func (c *negativeCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pairs)
}
