package pooler

import (
	"sync"
	"testing"
	"time"
)

// fakeTimers is a clock for admissionPolicy whose timers fire only when the
// test says so. Its time moves only when a timer starts: by the timer's
// length plus late, as if the timer were going to fire that late.
type fakeTimers struct {
	fire  chan time.Time
	armed chan struct{} // receives once per timer started

	mu       sync.Mutex
	clock    time.Time
	late     time.Duration
	lastWait time.Duration // the length of the latest timer started
}

func newFakeTimers() *fakeTimers {
	return &fakeTimers{fire: make(chan time.Time, 2), armed: make(chan struct{}, 64)}
}

func (f *fakeTimers) newTimer(d time.Duration) (<-chan time.Time, func() bool) {
	f.mu.Lock()
	f.clock = f.clock.Add(d + f.late)
	f.lastWait = d
	f.mu.Unlock()
	f.armed <- struct{}{}
	return f.fire, func() bool { return true }
}

func (f *fakeTimers) now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.clock
}

// setLate makes the timers started from now on fire late by d.
func (f *fakeTimers) setLate(d time.Duration) {
	f.mu.Lock()
	f.late = d
	f.mu.Unlock()
}

// expire makes the pending (or next) timer fire.
func (f *fakeTimers) expire() { f.fire <- time.Time{} }

func newTestPolicy(slots int) (*admissionPolicy, *fakeTimers) {
	timers := newFakeTimers()
	policy := newAdmissionPolicy(newLoginSlots(slots))
	policy.newTimer = timers.newTimer
	policy.now = timers.now
	// The slots' clock stands still, in a burst that began long ago, so
	// that stallWait is the target (TestStallWaitIsTheCeilingAtABurstStart
	// covers the start of a burst).
	clock := &manualClock{now: time.Hour}
	policy.slots.clock = clock.read
	policy.slots.lastWaitedAt.Store(int64(clock.now))
	return policy, timers
}

// holdAll takes every slot, as logins in progress would.
func holdAll(s *loginSlots) {
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
	if len(policy.slots.held) != 1 {
		t.Fatalf("%d slots held, want 1", len(policy.slots.held))
	}
}

func TestAdmissionOverloadShedsUntilASlotFrees(t *testing.T) {
	policy, timers := newTestPolicy(2)
	holdAll(policy.slots)
	never := make(chan struct{})

	// Overload: no slot frees (and no login ends) within the target, nor
	// within the confirming wait after it.
	timers.expire()
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
	if policy.slots.ended.Load() != 0 {
		t.Fatal("shedding counted as progress")
	}
	policy.slots.release()
	if got := policy.afterAccept(policy.beforeAccept(50*time.Millisecond, never), 0, true, 0); got != admitLogin {
		t.Fatalf("after a slot freed: decision %v, want admitLogin", got)
	}
	if policy.shedding {
		t.Fatal("still shedding after a connection got a slot")
	}
}

// TestAdmissionEndsStalledLoginsBeforeShedding: when the slots stall, the
// logins waiting on their clients are ended, for the connections in the
// accept queue, instead of those being refused; only when none can be
// ended does the loop shed.
func TestAdmissionEndsStalledLoginsBeforeShedding(t *testing.T) {
	policy, timers := newTestPolicy(2)
	holdAll(policy.slots)
	never := make(chan struct{})
	var asked []time.Duration
	policy.endStalled = func(waitedAtLeast time.Duration) int {
		asked = append(asked, waitedAtLeast)
		// The ended login gives its slot back, as its session would.
		policy.slots.release()
		return 1
	}
	timers.expire()
	timers.expire()
	if !policy.beforeAccept(50*time.Millisecond, never) {
		t.Fatal("no slot taken after the stalled login was ended")
	}
	if policy.shedding {
		t.Fatal("shedding although a stalled login was ended")
	}
	if len(asked) != 1 || asked[0] != 50*time.Millisecond {
		t.Fatalf("endStalled asked %v, want once, for logins that waited the stall wait (50ms)", asked)
	}

	// No login can be ended: the loop sheds, as before.
	holdAll(policy.slots)
	policy.endStalled = func(time.Duration) int { return 0 }
	timers.expire()
	timers.expire()
	if policy.beforeAccept(50*time.Millisecond, never) || !policy.shedding {
		t.Fatal("not shedding with every slot stalled and no login to end")
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
	if len(policy.slots.held) != 0 {
		t.Fatalf("%d slots held after a refusal, want 0", len(policy.slots.held))
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

func TestAdmissionSlowQueueIsNotAStall(t *testing.T) {
	policy, timers := newTestPolicy(1)
	holdAll(policy.slots)
	never := make(chan struct{})
	got := make(chan bool)
	go func() { got <- policy.beforeAccept(50*time.Millisecond, never) }()

	// The target passes, but a login ended meanwhile and another accept
	// loop took its slot: the loop keeps waiting instead of shedding.
	<-timers.armed
	policy.slots.progressed.Add(1)
	timers.expire()
	<-timers.armed // a second wait began
	if policy.shedding {
		t.Fatal("shedding although a login ended within the target")
	}

	// A thaw: the target passes with no login ending, but one ends within
	// the confirming wait.
	timers.expire()
	<-timers.armed
	policy.slots.progressed.Add(1)
	timers.expire()
	<-timers.armed // waiting a whole target again
	if policy.shedding {
		t.Fatal("shedding although a login ended within the confirming wait")
	}

	// A whole target with no login ending is a stall once the confirming
	// wait shows no login ending either.
	timers.expire()
	<-timers.armed // the confirming wait
	if policy.shedding {
		t.Fatal("shedding before the stall was confirmed")
	}
	timers.expire()
	if <-got {
		t.Fatal("took a slot although every slot was held")
	}
	if !policy.shedding {
		t.Fatal("not shedding after a target with no login ending")
	}

	// A login ending elsewhere (its slot taken by another loop) ends the
	// shedding: the next beforeAccept waits again.
	policy.slots.progressed.Add(1)
	go func() { got <- policy.beforeAccept(50*time.Millisecond, never) }()
	<-timers.armed
	if policy.shedding {
		t.Fatal("still shedding after a login ended")
	}
	policy.slots.release() // frees the slot the waiting loop takes
	if !<-got {
		t.Fatal("the freed slot was not taken")
	}
}

func TestAdmissionRefusalIsNotProgress(t *testing.T) {
	policy, _ := newTestPolicy(1)
	never := make(chan struct{})
	haveSlot := policy.beforeAccept(50*time.Millisecond, never)
	if got := policy.afterAccept(haveSlot, 3*time.Second, true, time.Second); got != shedQueueAge {
		t.Fatalf("decision %v, want shedQueueAge", got)
	}
	if n := policy.slots.ended.Load() + policy.slots.progressed.Load(); n != 0 {
		t.Fatalf("a refused connection counted as %d ended logins or steps", n)
	}
}

func TestAcceptQueueSize(t *testing.T) {
	for _, c := range []struct {
		name      string
		perSecond float64
		saturated bool
		wait      time.Duration
		sockets   int
		want      int
	}{
		{"no standing queue keeps listen_backlog", 1000, false, time.Second, 2, 4096},
		{"no target keeps listen_backlog", 1000, true, 0, 2, 4096},
		{"a second of 1000/s over two sockets", 1000, true, time.Second, 2, 500},
		{"capped at listen_backlog", 100000, true, time.Second, 2, 4096},
		{"a stall keeps a floor", 0, true, time.Second, 2, minAcceptQueue},
	} {
		if got := acceptQueueSize(c.perSecond, c.saturated, c.wait, c.sockets, 4096); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
	for _, c := range []struct{ current, want, next int }{
		{4096, 100, 3072}, // shrinks by a quarter a tick
		{3072, 2500, 2500},
		{100, 4096, 4096}, // grows at once
		{16, 16, 16},
	} {
		if got := stepAcceptQueueSize(c.current, c.want); got != c.next {
			t.Errorf("step from %d towards %d: %d, want %d", c.current, c.want, got, c.next)
		}
	}
	if got := queueTarget(2 * time.Second); got != 1500*time.Millisecond {
		t.Errorf("queue target for login_queue_max_age 2 s: %v, want 1.5s", got)
	}
}

func TestStandingQueueNeedsAQuietSecondToClear(t *testing.T) {
	q := newStandingQueue()
	if q.observe(false) {
		t.Fatal("standing before any login waited")
	}
	if !q.observe(true) {
		t.Fatal("not standing in the tick a login waited")
	}
	for tick := 1; tick < queueSizerWindow; tick++ {
		if !q.observe(false) {
			t.Fatalf("cleared after %d quiet ticks, want %d", tick, queueSizerWindow)
		}
	}
	if q.observe(false) {
		t.Fatalf("still standing after %d quiet ticks", queueSizerWindow)
	}
	// A lull inside a wave does not reopen the queue.
	q.observe(true)
	q.observe(false)
	if !q.observe(true) {
		t.Fatal("a one-tick lull cleared the queue")
	}
}

// startBeforeAccept runs policy.beforeAccept (target 50 ms) in its own
// goroutine; the channel receives whether it took a slot.
func startBeforeAccept(policy *admissionPolicy) <-chan bool {
	took := make(chan bool, 1)
	go func() { took <- policy.beforeAccept(50*time.Millisecond, make(chan struct{})) }()
	return took
}

// expireUntilShedding fires the pending wait and then n-1 more, each once
// armed, and checks that beforeAccept returned without a slot, shedding.
func expireUntilShedding(t *testing.T, policy *admissionPolicy, timers *fakeTimers, took <-chan bool, n int) {
	t.Helper()
	for i := range n {
		if i > 0 {
			<-timers.armed
		}
		timers.expire()
	}
	if <-took {
		t.Fatal("took a slot although all were held")
	}
	if !policy.shedding {
		t.Fatal("not shedding after on-time waits in which no login took a step")
	}
}

func TestAdmissionStarvedTimersDoNotShed(t *testing.T) {
	policy, timers := newTestPolicy(2)
	holdAll(policy.slots)
	// Every timer fires 80 ms late, as in a process frozen for most of
	// each CFS period: no login ends, yet that is no evidence of a stall.
	timers.setLate(80 * time.Millisecond)
	took := startBeforeAccept(policy)
	for range 6 {
		<-timers.armed
		timers.expire()
	}
	<-timers.armed // still waiting: a seventh wait began
	if policy.shedding {
		t.Fatal("shedding after starved waits")
	}
	// The process gets its CPU back and the slots still do not free: now
	// it is a stall (the wait armed while late, the target, then the
	// confirming wait).
	timers.setLate(0)
	expireUntilShedding(t, policy, timers, took, 3)
}

func TestAdmissionLoginsWaitingOnPostgresAreNotAStall(t *testing.T) {
	policy, timers := newTestPolicy(2)
	holdAll(policy.slots)
	policy.slots.serverWaitBegin() // a login holding a slot waits on Postgres
	took := startBeforeAccept(policy)
	for range 4 {
		<-timers.armed
		timers.expire()
	}
	<-timers.armed // still waiting: no login ended, but one waits on Postgres
	if policy.shedding {
		t.Fatal("shedding while a login waits on Postgres")
	}
	// The wait on Postgres ends, and still no login ends: a stall.
	policy.slots.serverWaitEnd()
	expireUntilShedding(t, policy, timers, took, 2)
}

func TestAdmissionSlowClientsTakingStepsAreNotAStall(t *testing.T) {
	policy, timers := newTestPolicy(2)
	holdAll(policy.slots)
	took := startBeforeAccept(policy)
	// No login ends, but one reads its startup packet in each wait, as
	// logins of a slow client population do.
	for range 4 {
		<-timers.armed
		policy.slots.progress()
		timers.expire()
	}
	<-timers.armed
	if policy.shedding {
		t.Fatal("shedding while logins take steps")
	}
	// The steps stop: a stall.
	expireUntilShedding(t, policy, timers, took, 2)
}

// manualClock is a loginSlots clock that moves only when told.
type manualClock struct{ now time.Duration }

func (c *manualClock) read() time.Duration { return c.now }

// newStallWaitCheck makes two slots on a manual clock and a check of their
// stall wait for target.
func newStallWaitCheck(t *testing.T, target time.Duration) (*loginSlots, *manualClock, func(when string, want time.Duration)) {
	slots := newLoginSlots(2)
	clock := &manualClock{now: time.Hour}
	slots.clock = clock.read
	return slots, clock, func(when string, want time.Duration) {
		t.Helper()
		if got := slots.stallWait(target); got != want {
			t.Fatalf("%s: stall wait %v, want %v", when, got, want)
		}
	}
}

func TestStallWaitFollowsSlowSpells(t *testing.T) {
	const target = 50 * time.Millisecond
	slots, clock, wantWait := newStallWaitCheck(t, target)
	wantWait("with no history", target)

	// A spell with a slot free is not a slow spell: nobody was waiting.
	slots.tryAcquire()
	clock.now += 300 * time.Millisecond
	slots.progress()
	wantWait("after a spell with a slot free", target)

	// Every slot held, and the next step comes 90 ms after the slot was
	// taken: the clients are that slow, and the wait doubles the spell.
	slots.tryAcquire()
	clock.now += 90 * time.Millisecond
	slots.progress()
	wantWait("after a 90 ms spell", 180*time.Millisecond)

	// A shorter spell does not shorten it; the wait halves every half-life.
	clock.now += 20 * time.Millisecond
	slots.progress()
	wantWait("after a 20 ms spell", 180*time.Millisecond)
	clock.now += stallGapHalfLife
	wantWait("a half-life later", 90*time.Millisecond)
	clock.now += stallGapHalfLife
	wantWait("two half-lives later", target)

	// Spells shorter than the floor are not recorded at all.
	recordedAt := slots.slowSpellAt
	clock.now += stallGapFloor - time.Millisecond
	slots.progress()
	if slots.slowSpellAt != recordedAt {
		t.Fatalf("a spell under the floor replaced the record (%v, decayed to %v)", slots.slowSpell, slots.decayedSlowSpell(clock.now))
	}

	// A spell longer than the ceiling is a stall, whatever ended it: not
	// learnt from. One just under it sets the wait to the ceiling.
	clock.now += 5 * time.Second
	slots.progress()
	wantWait("after a 5 s stall", target)
	clock.now += stallWaitCeiling - time.Millisecond
	slots.release()
	wantWait("after a spell just under the ceiling", stallWaitCeiling)
}

func TestStallWaitIsTheCeilingAtABurstStart(t *testing.T) {
	const target = 50 * time.Millisecond
	slots, clock, wantWait := newStallWaitCheck(t, target)
	wantWait("before any login waited", target)
	slots.noteWaited() // the first login to find every slot held
	wantWait("at the start of a burst", stallWaitCeiling)
	clock.now += stallWaitCeiling - time.Millisecond
	slots.noteWaited()
	wantWait("just inside the burst's first ceiling", stallWaitCeiling)
	clock.now += time.Millisecond
	wantWait("once the burst has lasted the ceiling", target)
	// Waits less than burstQuiet apart are one burst.
	for range 5 {
		clock.now += burstQuiet - time.Millisecond
		slots.noteWaited()
		wantWait("in a burst that goes on", target)
	}
	if !slots.waited.Load() {
		t.Fatal("noteWaited did not tell the queue sizer")
	}
	// A quiet spell, and a new burst.
	clock.now += burstQuiet + time.Millisecond
	slots.noteWaited()
	wantWait("at the start of a burst after a quiet spell", stallWaitCeiling)
}

// A stall at the start of a burst is still detected, after the ceiling.
func TestAdmissionShedsAStallAtABurstStart(t *testing.T) {
	policy, timers := newTestPolicy(2)
	policy.slots.lastWaitedAt.Store(0) // quiet since long ago
	holdAll(policy.slots)
	took := startBeforeAccept(policy)
	<-timers.armed
	timers.mu.Lock()
	wait := timers.lastWait
	timers.mu.Unlock()
	if wait != stallWaitCeiling {
		t.Fatalf("stall wait %v at a burst's start, want %v", wait, stallWaitCeiling)
	}
	expireUntilShedding(t, policy, timers, took, 2)
}

func TestAdmissionWaitsLongerAfterSlowSpells(t *testing.T) {
	policy, timers := newTestPolicy(2)
	clock := &manualClock{now: time.Hour}
	policy.slots.clock = clock.read
	holdAll(policy.slots)
	// The clients took 120 ms for a step while every slot was held (a
	// load generator short of CPU): such a pause is no stall now.
	clock.now += 120 * time.Millisecond
	policy.slots.progress()
	took := startBeforeAccept(policy)
	<-timers.armed
	timers.mu.Lock()
	wait := timers.lastWait
	timers.mu.Unlock()
	if wait != 240*time.Millisecond {
		t.Fatalf("stall wait %v after a 120 ms slow spell, want 240ms", wait)
	}
	// No step in that longer wait, nor in the confirming one: a stall.
	expireUntilShedding(t, policy, timers, took, 2)
	if policy.stallWait != 240*time.Millisecond {
		t.Fatalf("shedding recorded stall wait %v", policy.stallWait)
	}
}

func TestBusyThroughputCountsOnlyTicksWithEverySlotTaken(t *testing.T) {
	var b busyThroughput
	if _, ok := b.perSecond(); ok {
		t.Fatal("a rate before any tick")
	}
	// Quiet ticks, then the tick in which a queue forms: neither says what
	// pgtender can do while busy.
	b.observe(500, false)
	b.observe(20, true)
	if rate, ok := b.perSecond(); ok {
		t.Fatalf("rate %v from the tick a queue formed in", rate)
	}
	b.observe(300, true) // busy from start to end
	b.observe(500, true)
	rate, ok := b.perSecond()
	if want := 400 / queueSizerTick.Seconds(); !ok || rate != want {
		t.Fatalf("rate %v (ok %v), want %v", rate, ok, want)
	}
	// A lull ends the busy spell: the tick after it is not counted either.
	b.observe(0, false)
	b.observe(7, true)
	b.observe(100, true)
	if rate, want := must(b.perSecond()), 300/queueSizerTick.Seconds(); rate != want {
		t.Fatalf("rate %v after a lull, want %v", rate, want)
	}
	// Busy ticks leave the window after queueSizerWindow ticks.
	for range queueSizerWindow {
		b.observe(0, false)
	}
	if rate, ok := b.perSecond(); ok {
		t.Fatalf("rate %v after a quiet window", rate)
	}
}

func must(rate float64, ok bool) float64 {
	if !ok {
		panic("no rate")
	}
	return rate
}

func TestQueueSizingWaitsUntilTheQueueIsLate(t *testing.T) {
	const lateAfter = 750 * time.Millisecond
	q := newQueueSizing()
	tick := func(ended uint64, waited bool, longest time.Duration) (float64, bool) {
		return q.observe(ended, waited, longest, lateAfter)
	}
	if _, sized := tick(400, false, 0); sized {
		t.Fatal("sized without a standing queue")
	}
	// A closed loop: logins wait for slots every tick, but the queue is
	// served well within the target.
	for range 3 * queueSizerWindow {
		if _, sized := tick(450, true, 700*time.Millisecond); sized {
			t.Fatal("sized a queue served on time")
		}
	}
	// A connection waited past lateAfter: the queue is sized by the busy rate.
	rate, sized := tick(450, true, 800*time.Millisecond)
	if want := 450 / queueSizerTick.Seconds(); !sized || rate != want {
		t.Fatalf("late queue: rate %v sized %v, want %v true", rate, sized, want)
	}
	// It stays sized while the queue stands, though waits fall (the queue
	// was cut) and busy ticks come and go.
	for range 3 * queueSizerWindow {
		tick(0, false, 0)
		if rate, sized := tick(100, true, 10*time.Millisecond); !sized || rate <= 0 {
			t.Fatalf("unsized in a standing queue: rate %v sized %v", rate, sized)
		}
	}
	// A quiet second clears it; the next queue must be late again.
	for range queueSizerWindow {
		tick(0, false, 0)
	}
	if _, sized := tick(450, true, 800*time.Millisecond); sized {
		t.Fatal("sized before a busy tick was measured")
	}
	if _, sized := tick(450, true, 100*time.Millisecond); !sized {
		t.Fatal("not sized once late and measured")
	}
	for range queueSizerWindow {
		tick(0, false, 0)
	}
	if _, sized := tick(450, true, 0); sized {
		t.Fatal("a new queue inherited the old one's lateness")
	}
	if _, sized := tick(450, true, 0); sized {
		t.Fatal("a new queue inherited the old one's lateness")
	}
}
