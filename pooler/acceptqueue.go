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
// whole queue, so all of them end up late together. The sizer keeps the
// queue to the logins pgtender completes in half of login_queue_max_age
// (its target wait), measured over the last second, while logins have had
// to wait for a slot within the last second. The kernel then drops the SYNs of
// the excess (counted in listen_overflows_total); their clients retry the
// SYN after a second or three, and most of them are then served in time,
// where a userspace refusal would have cost pgtender an accept, a read, a
// write and a close each. The queue's size is exported per socket as
// listen_queue_capacity (read from the kernel at scrape time).

const (
	// queueSizerTick is how often the queue is resized.
	queueSizerTick = 100 * time.Millisecond
	// queueSizerWindow is how many ticks the throughput is averaged over.
	queueSizerWindow = 10
	// minAcceptQueue is the smallest backlog the sizer sets per socket,
	// so that a pooler whose logins have stalled still queues a few
	// connections for the shedding accept loop to refuse with an error.
	minAcceptQueue = 16
)

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
	var window [queueSizerWindow]uint64 // logins ended per tick, a ring
	next := 0
	lastEnded := p.loginSlots.ended.Load()
	current := p.effectiveBacklog
	standing := newStandingQueue()
	for {
		select {
		case <-p.done:
			return
		case <-ticker.C:
		}
		ended := p.loginSlots.ended.Load()
		window[next] = ended - lastEnded
		next = (next + 1) % queueSizerWindow
		lastEnded = ended
		var total uint64
		for _, n := range window {
			total += n
		}
		perSecond := float64(total) / (queueSizerWindow * queueSizerTick).Seconds()
		saturated := standing.observe(p.loginSlots.waited.Swap(false))
		wait := p.state.Load().cfg.General.LoginQueueMaxAge.Duration() / 2
		size := acceptQueueSize(perSecond, saturated, wait, len(p.listeners), p.effectiveBacklog)
		if size == current || p.draining.Load() {
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
