package auth

import "testing"

// TestFlightGroupCountsWaiters: logins joining one (key, password) share a
// flight and are counted; when the last leaves, the flight is abandoned
// and out of the group, so the next login starts a new one.
func TestFlightGroupCountsWaiters(t *testing.T) {
	var g flightGroup
	var mac [32]byte
	release := make(chan struct{})
	runs := make(chan *flight, 2)
	fn := func(f *flight) error {
		runs <- f
		<-release
		return nil
	}
	a := g.join(mac, fn)
	b := g.join(mac, fn)
	if a != b || a.waiting.Load() != 2 {
		t.Fatalf("two joins: same flight %v, waiting %d; want one flight, 2", a == b, a.waiting.Load())
	}
	if f := <-runs; f != a || f.waiting.Load() < 1 {
		t.Fatalf("fn ran with waiting %d", f.waiting.Load())
	}
	g.leave(mac, a)
	select {
	case <-a.abandoned:
		t.Fatal("abandoned with a login still waiting")
	default:
	}
	g.leave(mac, b)
	<-a.abandoned
	c := g.join(mac, fn)
	if c == a || c.waiting.Load() != 1 {
		t.Fatalf("join after all left: new flight %v, waiting %d", c != a, c.waiting.Load())
	}
	<-runs
	close(release)
	<-a.done
	<-c.done
	g.leave(mac, c)
	if len(g.flights) != 0 {
		t.Fatalf("%d flights left in the group", len(g.flights))
	}
}
