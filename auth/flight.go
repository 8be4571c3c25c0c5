package auth

import (
	"crypto/sha256"
	"sync"
	"sync/atomic"
)

// flightGroup shares one verification among the logins presenting the same
// (key, password) at the same moment, like golang.org/x/sync/singleflight,
// and also counts the logins waiting on each one: that count is the
// verification's demand when the failure limits refuse it (throttle.go),
// and when it drops to 0 a verification still waiting for a token gives
// up. singleflight neither tells the function how many callers still wait
// nor lets a caller leave.
type flightGroup struct {
	mu      sync.Mutex
	flights map[[sha256.Size]byte]*flight
}

// flight is one verification of a (key, password), named by its MAC.
type flight struct {
	done chan struct{} // closed once err is set
	err  error
	// waiting is how many logins wait for err now. It changes under the
	// group's mu; the throttle reads it without.
	waiting atomic.Int32
	// abandoned is closed when waiting drops to 0: every login gave up
	// (its context ended). The flight is then out of the group, so a later
	// login with the same password starts a new one.
	abandoned chan struct{}
}

// join counts the caller as waiting on the flight of mac, starting one that
// runs fn in a new goroutine if none runs. The caller must call leave
// once, when it has the result or stops waiting for it.
func (g *flightGroup) join(mac [sha256.Size]byte, fn func(*flight) error) *flight {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f, ok := g.flights[mac]; ok {
		f.waiting.Add(1)
		return f
	}
	if g.flights == nil {
		g.flights = make(map[[sha256.Size]byte]*flight)
	}
	f := &flight{done: make(chan struct{}), abandoned: make(chan struct{})}
	f.waiting.Add(1) // before fn runs: it reads the count
	g.flights[mac] = f
	go func() {
		err := fn(f)
		g.mu.Lock()
		f.err = err
		g.removeLocked(mac, f)
		g.mu.Unlock()
		close(f.done)
	}()
	return f
}

// leave ends the caller's wait on f, the flight of mac.
func (g *flightGroup) leave(mac [sha256.Size]byte, f *flight) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f.waiting.Add(-1) == 0 {
		close(f.abandoned)
		g.removeLocked(mac, f)
	}
}

// removeLocked takes f out of the group if it is still mac's flight.
func (g *flightGroup) removeLocked(mac [sha256.Size]byte, f *flight) {
	if g.flights[mac] == f {
		delete(g.flights, mac)
	}
}
