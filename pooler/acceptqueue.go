package pooler

import (
	"net"
	"time"

	"go.uber.org/zap"
)

// Sizing the kernel's accept queue to what can be served on time.
//
// A connection waits in its listening socket's accept queue while every
// login slot is taken. A queue of listen_backlog entries (1024 by default,
// per socket) holds seconds of work for a pooler whose CPU is capped, and
// it is FIFO: in a wave above capacity every connection in it waits the
// whole queue, so all of them end up late together. Once the queue is late
// (a connection accepted within the standing queue had waited in it longer
// than half the target wait), the sizer keeps it to the logins pgtender
// completes in the target wait, three quarters of login_queue_max_age, for
// as long as logins keep waiting for slots. The kernel then drops the SYNs
// of the excess (counted in listen_overflows_total); their clients retry the
// SYN after a second or three, and most of them are then served in time,
// where a userspace refusal would have cost pgtender an accept, a read, a
// write and a close each. The queue's size is exported per socket as
// listen_queue_capacity (read from the kernel at scrape time).
//
// A queue that is long but served in time is left whole: a closed loop of
// clients (each reconnecting when its last login ended) is not an overload,
// however many they are, and dropping its SYNs only makes its clients wait
// out a SYN retransmission. Cutting the queue as soon as logins waited for
// a slot did that: with a few thousand clients, or a thousand after an idle
// spell, the kernel dropped SYNs that pgtender would have served within
// login_queue_max_age (docs/admission.md, "Closed loops are not overloads").
const (
	// queueSizerTick is how often the queue is resized.
	queueSizerTick = 100 * time.Millisecond
	// queueSizerWindow is how many ticks the throughput is averaged over.
	queueSizerWindow = 10
	// minAcceptQueue is the smallest backlog the sizer sets per socket,
	// so that a pooler whose logins have stalled still queues a few
	// connections for the shedding accept loop to refuse with an error.
	minAcceptQueue = 16
	// queueTargetNumerator / queueTargetDenominator of login_queue_max_age
	// is the wait the queue is sized to: the rest is the margin for dips in
	// the login rate before a queued connection passes the age at which it
	// is refused.
	queueTargetNumerator   = 3
	queueTargetDenominator = 4
	// queueLateDivisor: the queue is late once a connection waited in it
	// longer than the target wait divided by this.
	queueLateDivisor = 2
	// queueShrinkNumerator / queueShrinkDenominator is the most a resize
	// keeps of the queue's size when it shrinks it (stepAcceptQueueSize).
	queueShrinkNumerator   = 3
	queueShrinkDenominator = 4
)

// stepAcceptQueueSize is the backlog to set this tick, given the current
// one and the size wanted: a queue grows at once but shrinks by at most a
// quarter a tick. The rate it is sized by is an estimate, lowest at the
// start of a burst, while the clients that connected together are slow to
// send their first packets; a queue cut below its length in one step drops
// every SYN until it drains, though the next tick measures the rate that
// would have served them. (Cut in one step, a burst of clients into an idle
// pooler lost many of its SYNs to a rate measured in its first half-second,
// well below the rate a few ticks later; docs/admission.md.)
func stepAcceptQueueSize(current, want int) int {
	if want >= current {
		return want
	}
	return max(want, current*queueShrinkNumerator/queueShrinkDenominator)
}

// queueTarget is the wait the accept queue is sized to for a
// login_queue_max_age of maxAge (0: no target, the queue is not sized).
func queueTarget(maxAge time.Duration) time.Duration {
	return maxAge * queueTargetNumerator / queueTargetDenominator
}

// standingQueue says whether logins are queueing for slots: they waited
// for one within the last queueSizerWindow ticks. A single quiet tick is
// not enough to clear it. In a wave, slots free up for a moment now and
// then (and a process whose CPU quota ran out thaws with its slots free);
// were the queue reopened to listen_backlog at each such moment, the kernel
// would take in up to listen_backlog connections at once, more than can be
// served before their clients give up (measured: with listen_backlog 4096
// the sizer flipped every 100-300 ms in a 3 C wave).
type standingQueue struct {
	quietTicks int // consecutive ticks in which no login waited
}

func newStandingQueue() standingQueue { return standingQueue{quietTicks: queueSizerWindow} }

// observe records one tick and reports whether the queue is standing.
func (q *standingQueue) observe(waited bool) bool {
	if waited {
		q.quietTicks = 0
	} else if q.quietTicks < queueSizerWindow {
		q.quietTicks++
	}
	return q.quietTicks < queueSizerWindow
}

// busyThroughput is the rate at which logins end while the slots are
// taken, over the last queueSizerWindow ticks: the rate that drains the
// accept queue. A tick counts only if logins waited for a slot in it and in
// the tick before, so the slots were taken from its start to its end; the
// tick in which a queue formed began with free slots and idle ticks say
// nothing of what pgtender can do. Not safe for concurrent use.
type busyThroughput struct {
	ended      [queueSizerWindow]uint64 // logins ended in each busy tick of the ring
	busy       [queueSizerWindow]bool
	next       int
	waitedLast bool // logins waited in the previous tick
}

// observe records one tick: the logins that ended in it and whether logins
// waited for a slot in it.
func (b *busyThroughput) observe(ended uint64, waited bool) {
	b.busy[b.next] = waited && b.waitedLast
	b.ended[b.next] = ended
	b.next = (b.next + 1) % queueSizerWindow
	b.waitedLast = waited
}

// perSecond is the busy ticks' rate; ok is false when the window holds no
// busy tick.
func (b *busyThroughput) perSecond() (rate float64, ok bool) {
	var ended uint64
	ticks := 0
	for i, busy := range b.busy {
		if busy {
			ended += b.ended[i]
			ticks++
		}
	}
	if ticks == 0 {
		return 0, false
	}
	return float64(ended) / (time.Duration(ticks) * queueSizerTick).Seconds(), true
}

// queueSizing decides, tick by tick, whether the accept queue is sized and
// by what rate. It is sized while the queue stands (standingQueue), has been
// late since it formed (a connection accepted had waited longer than
// lateAfter) and a busy rate has been measured in it; the rate is the
// latest busy rate measured, kept while the queue stands even when the busy
// ticks have left the window, so a wave whose waits come and go does not
// reopen the queue. Not safe for concurrent use.
type queueSizing struct {
	standing   standingQueue
	throughput busyThroughput
	perSecond  float64 // the latest busy rate
	measured   bool    // perSecond was measured since the queue formed
	late       bool    // a connection waited longer than lateAfter since the queue formed
}

func newQueueSizing() queueSizing { return queueSizing{standing: newStandingQueue()} }

// observe records one tick: the logins that ended in it, whether logins
// waited for a slot in it, and the longest accept-queue wait of the
// connections accepted in it. It returns the rate to size by, and whether
// to size at all.
func (q *queueSizing) observe(ended uint64, waited bool, longestWait, lateAfter time.Duration) (perSecond float64, sized bool) {
	q.throughput.observe(ended, waited)
	if !q.standing.observe(waited) {
		q.measured, q.late = false, false
		return 0, false
	}
	if rate, ok := q.throughput.perSecond(); ok {
		q.perSecond, q.measured = rate, true
	}
	if longestWait > lateAfter {
		q.late = true
	}
	return q.perSecond, q.measured && q.late
}

// acceptQueueSize is the backlog for each of sockets listening sockets:
// endedPerSecond logins completing per second, a target wait of wait, at
// most ceiling (listen_backlog) and at least minAcceptQueue. Without a
// standing queue (saturated false) or without a target (wait 0) it is the
// ceiling.
func acceptQueueSize(endedPerSecond float64, saturated bool, wait time.Duration, sockets, ceiling int) int {
	if !saturated || wait <= 0 || sockets <= 0 {
		return ceiling
	}
	size := int(endedPerSecond*wait.Seconds()/float64(sockets) + 0.5)
	return min(max(size, minAcceptQueue), ceiling)
}

// acceptQueueSizer resizes the listening sockets' accept queues every
// queueSizerTick until done closes. It runs on its own goroutine.
func (p *Pooler) acceptQueueSizer() {
	defer p.wg.Done()
	ticker := time.NewTicker(queueSizerTick)
	defer ticker.Stop()
	sizing := newQueueSizing()
	lastEnded := p.loginSlots.ended.Load()
	current := p.effectiveBacklog
	for {
		select {
		case <-p.done:
			return
		case <-ticker.C:
		}
		ended := p.loginSlots.ended.Load()
		// Slots all held at the tick count as a wait: a stall, which
		// nobody may be knocking at, keeps the queue standing.
		waited := p.loginSlots.waited.Swap(false) || p.loginSlots.full()
		longestWait := time.Duration(p.loginSlots.longestQueueWait.Swap(0))
		target := queueTarget(p.state.Load().cfg.General.LoginQueueMaxAge.Duration())
		perSecond, sized := sizing.observe(ended-lastEnded, waited, longestWait, target/queueLateDivisor)
		lastEnded = ended
		size := stepAcceptQueueSize(current, acceptQueueSize(perSecond, sized, target, len(p.listeners), p.effectiveBacklog))
		if size == current || p.draining.Load() || p.notAccepting.Load() {
			continue
		}
		if err := resizeAcceptQueues(p.listeners, size); err != nil {
			p.log.Warn("cannot resize the accept queue", zap.Int("backlog", size), zap.Error(err))
			continue
		}
		if (size == p.effectiveBacklog) != (current == p.effectiveBacklog) {
			// Logged only when a standing queue forms or clears, not on
			// every resize in between.
			p.log.Info("accept queue resized", zap.Int("backlog", size), zap.Int("listen_backlog", p.effectiveBacklog),
				zap.Float64("logins_per_second", perSecond))
		}
		current = size
	}
}

// resizeAcceptQueues sets the backlog of every listening socket. listen(2)
// on a socket that is already listening only changes its backlog; the
// connections already queued stay.
func resizeAcceptQueues(listeners []*net.TCPListener, backlog int) error {
	for _, l := range listeners {
		if err := setBacklog(l, backlog); err != nil {
			return err
		}
	}
	return nil
}
