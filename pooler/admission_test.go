package pooler

import (
	"testing"
	"time"
)

// fakeTimers is a clock for admissionPolicy whose timers fire only when the
// test says so.
type fakeTimers struct {
	fire chan time.Time
}

func newFakeTimers() *fakeTimers { return &fakeTimers{fire: make(chan time.Time, 1)} }

func (f *fakeTimers) newTimer(time.Duration) (<-chan time.Time, func() bool) {
	return f.fire, func() bool { return true }
}

// expire makes the pending (or next) timer fire.
func (f *fakeTimers) expire() { f.fire <- time.Time{} }

func newTestPolicy(slots int) (*admissionPolicy, *fakeTimers) {
	timers := newFakeTimers()
	policy := newAdmissionPolicy(make(loginSlots, slots))
	policy.newTimer = timers.newTimer
	return policy, timers
}

// holdAll takes every slot, as logins in progress would.
func holdAll(s loginSlots) {
	for s.tryAcquire() {
	}
}

func TestAdmissionFreeSlotAdmits(t *testing.T) {
	policy, _ := newTestPolicy(2)
	never := make(chan struct{})
	if !policy.beforeAccept(50*time.Millisecond, never) {
		t.Fatal("a free slot was not taken")
	}
	if got := policy.afterAccept(true, 0, true, 2*time.Second); got != admitLogin {
		t.Fatalf("decision %v, want admitLogin", got)
	}
	if len(policy.slots) != 1 {
		t.Fatalf("%d slots held, want 1", len(policy.slots))
	}
}

func TestAdmissionOverloadShedsUntilASlotFrees(t *testing.T) {
	policy, timers := newTestPolicy(2)
	holdAll(policy.slots)
	never := make(chan struct{})

	// Overload: no slot frees within the target.
	timers.expire()
	if policy.beforeAccept(50*time.Millisecond, never) {
		t.Fatal("took a slot although all were held")
	}
	if !policy.shedding {
		t.Fatal("not shedding after the target passed with every slot held")
	}
	for i := 0; i < 3; i++ {
		// While shedding, beforeAccept does not wait at all.
		if policy.beforeAccept(50*time.Millisecond, never) {
			t.Fatal("took a slot while shedding with every slot held")
		}
		if got := policy.afterAccept(false, 0, true, 0); got != shedNoSlot {
			t.Fatalf("connection %d: decision %v, want shedNoSlot", i, got)
		}
	}

	// Recovery: a login finishes and frees its slot; the next connection
	// is served and shedding ends.
	policy.slots.release()
	if got := policy.afterAccept(policy.beforeAccept(50*time.Millisecond, never), 0, true, 0); got != admitLogin {
		t.Fatalf("after a slot freed: decision %v, want admitLogin", got)
	}
	if policy.shedding {
		t.Fatal("still shedding after a connection got a slot")
	}
}

func TestAdmissionBurstShorterThanTargetDoesNotShed(t *testing.T) {
	policy, _ := newTestPolicy(1)
	holdAll(policy.slots)
	never := make(chan struct{})
	got := make(chan bool)
	go func() { got <- policy.beforeAccept(50*time.Millisecond, never) }()
	// The slot frees before the target passes (the timer never fires).
	policy.slots.release()
	if !<-got {
		t.Fatal("a slot freed within the target was not taken")
	}
	if policy.shedding {
		t.Fatal("shedding after a burst shorter than the target")
	}
	if decision := policy.afterAccept(true, 0, true, 0); decision != admitLogin {
		t.Fatalf("decision %v, want admitLogin", decision)
	}
}

func TestAdmissionShedsConnectionsPastMaxAge(t *testing.T) {
	policy, _ := newTestPolicy(2)
	never := make(chan struct{})
	haveSlot := policy.beforeAccept(50*time.Millisecond, never)
	if got := policy.afterAccept(haveSlot, 3*time.Second, true, 2*time.Second); got != shedQueueAge {
		t.Fatalf("decision %v, want shedQueueAge", got)
	}
	if len(policy.slots) != 0 {
		t.Fatalf("%d slots held after a refusal, want 0", len(policy.slots))
	}
	// An age the kernel did not report, or a limit of 0, sheds nothing.
	for _, c := range []struct {
		known  bool
		maxAge time.Duration
	}{{false, 2 * time.Second}, {true, 0}} {
		haveSlot := policy.beforeAccept(50*time.Millisecond, never)
		if got := policy.afterAccept(haveSlot, time.Hour, c.known, c.maxAge); got != admitLogin {
			t.Fatalf("age known %v, max %v: decision %v, want admitLogin", c.known, c.maxAge, got)
		}
		policy.slots.release()
	}
}

func TestAdmissionDoneStopsTheWait(t *testing.T) {
	policy, _ := newTestPolicy(1)
	holdAll(policy.slots)
	done := make(chan struct{})
	close(done)
	if policy.beforeAccept(time.Hour, done) {
		t.Fatal("took a slot although every slot was held")
	}
}
