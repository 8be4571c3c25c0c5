package pooler

import (
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/pgtender/pgtender/pooler/wire"
)

// Login admission control.
//
// A login holds one of a bounded number of login slots from accept to
// ReadyForQuery (or its end). While every slot is taken, the accept loops
// stop accepting, so new connections wait in the kernel's accept queue,
// which costs pgtender nothing. Three rules keep that wait short of a
// client's deadline:
//
//   - The accept queue is kept to the size pgtender can serve on time
//     (acceptQueueSizer): while logins are waiting for slots, each
//     listening socket's backlog is set, with listen(2), to what pgtender
//     completes in half of login_queue_max_age, so the kernel drops the SYNs
//     of the excess (the client retries them) instead of queueing
//     connections that would be served late. Without a standing queue the
//     backlog is listen_backlog, so a short burst is queued whole.
//   - A connection accepted after waiting longer than login_queue_max_age
//     in the kernel's queue is refused with FATAL 53300 rather than served
//     late: its client has used most of its connect_timeout already.
//   - When the slots stop freeing altogether (every slot held by a login
//     that does not progress) for login_queue_target, the logins that have
//     waited on their clients all that time (a client that stalls mid-login,
//     or sends its packets a byte at a time) are ended, with FATAL 53300,
//     and their slots go to the connections in the accept queue: otherwise
//     as many stalled clients as there are slots would keep every other
//     client out until client_login_timeout. Only when no such login can
//     be ended does the accept loop start shedding: it accepts each new
//     connection and refuses it at once with FATAL 53300, until a login
//     ends again. New clients then get a quick, clear refusal instead of a
//     silent wait. Slots that keep freeing, however slowly, never trigger
//     either: that is a queue to be sized, not a stall.
//
// A login already holding a slot is never starved by newcomers: slots are
// released only by the logins that hold them. Why the slots are few (16
// per GOMAXPROCS): logins are CPU work, and every extra login in progress
// lengthens the scheduler's run queue that the first queries of logged-in
// clients wait in; with 128 per GOMAXPROCS a wave at 1.5x capacity left
// most clients logged in but timing out on their first query
// (docs/PERFORMANCE.md, "Reconnect waves").

// slotsPerCPU is the default number of login slots per GOMAXPROCS.
const slotsPerCPU = 16

// stallConfirmDivisor sets the confirming wait after the stall wait:
// target/stallConfirmDivisor (12.5 ms for the default 50 ms).
const stallConfirmDivisor = 4

// The stall wait follows the slowness of the clients (loginSlots.stallWait).
// A fixed login_queue_target cannot tell a slow client population from a
// stalled one: with the load generator capped at 12% of a CPU, all 32
// logins in progress went longer than 62.5 ms without a step while
// pgtender's timers ran on time, and the fixed rule refused 3,919-6,081
// clients per 1.5 C run that would have been served (0-55 with this one;
// docs/PERFORMANCE.md, "Clients short of CPU"). So the wait is at
// least login_queue_target and at least stallGapFactor times the longest
// spell, recently, in which every slot was held and no login took a step
// until one did (a slow spell, not a stall), decaying by half every
// stallGapHalfLife; it never exceeds stallWaitCeiling, and a spell longer
// than that is a stall whatever ended it, so it is not learnt from.
const (
	stallGapFactor   = 2
	stallGapHalfLife = 10 * time.Second
	stallWaitCeiling = 400 * time.Millisecond
	// burstQuiet: logins that find every slot held after this long in
	// which none did begin a burst (loginSlots.noteWaited).
	burstQuiet = time.Second
	// stallGapFloor: spells shorter than this are not recorded (they
	// could not raise the wait above any sensible target), so the common
	// step costs a clock read and an atomic swap, and no lock.
	stallGapFloor = 10 * time.Millisecond
)

// shedDeadline bounds how long a refused connection may take pgtender's
// time: reading its startup packet (so the client sees the error, not a
// reset), and then writing the error.
const shedDeadline = time.Second

// shedMessage is what a refused client reads.
const shedMessage = "pgtender is overloaded: too many logins in progress; retry"

// ShedReason says why admission control refused a connection; it is the
// reason logged for a refusal.
type ShedReason string

const (
	ShedNoLoginSlot ShedReason = "no_login_slot" // no login took a step within login_queue_target while every slot was held
	ShedQueueAge    ShedReason = "queue_age"     // waited longer than login_queue_max_age in the accept queue
	// ShedSlowClient: a login that held its slot waiting on its client
	// while every slot was held and none took a step (Pooler.endStalledLogins).
	ShedSlowClient ShedReason = "slow_client"
)

// shedCounters count refused logins by ShedReason.
type shedCounters struct {
	noLoginSlot, queueAge, slowClient atomic.Uint64
}

func (c *shedCounters) add(reason ShedReason) {
	switch reason {
	case ShedNoLoginSlot:
		c.noLoginSlot.Add(1)
	case ShedQueueAge:
		c.queueAge.Add(1)
	case ShedSlowClient:
		c.slowClient.Add(1)
	}
}

// loginSlots is the semaphore of login slots, with the counters the
// admission policy and the accept-queue sizer read. Safe for concurrent
// use.
type loginSlots struct {
	held chan struct{}
	// ended counts slots released by the logins that held them: the
	// progress that tells a slow queue from a stall, and the throughput
	// the accept queue is sized by.
	ended atomic.Uint64
	// progressed counts steps of logins holding slots: a startup packet
	// read, a password exchange done, and every login ending. The stall
	// rule watches it rather than ended: a client population slow to answer
	// (a load generator short of CPU) still takes steps, where clients that
	// stall mid-login take none. Watching ended alone, a 3 C wave from a
	// load generator short of CPU got 14,330 refusals (median of 3 runs),
	// with the late-timer rule already in place. Watching steps has not
	// stopped such refusals on a busy machine (docs/PERFORMANCE.md).
	progressed atomic.Uint64
	// waited is set when an accept loop found every slot taken; the queue
	// sizer reads and clears it each tick.
	waited atomic.Bool
	// burstStart is the clock reading at which the current burst began:
	// the first time a login found every slot held after burstQuiet in
	// which none did; lastWaitedAt is the latest such time. Within
	// stallWaitCeiling of a burst's start the stall wait is the ceiling
	// (see stallWait).
	burstStart   atomic.Int64
	lastWaitedAt atomic.Int64
	// longestQueueWait is the longest accept-queue wait, in nanoseconds,
	// of the connections accepted since the queue sizer last read and
	// cleared it (noteQueueWait).
	longestQueueWait atomic.Int64
	// serverWaits counts logins holding a slot that are waiting on
	// Postgres (a passthrough verification, a cold pool's first server
	// connection). Slots held that way are not stalled: each such wait ends
	// within connect_timeout or checkout_timeout, and a refusal would tell
	// clients pgtender is overloaded when Postgres is slow. Seen once in a
	// full test run on a loaded machine: TestTransactionModeIsolation's 50
	// clients, logging in at once to a cold pool, got 53300.
	serverWaits atomic.Int64

	// clock reads monotonic time since the slots were made (a seam for
	// tests). lastEvent is its reading at the latest slot taken or login
	// step: a spell in which every slot is held without a step begins with
	// one of the two, so a step that finds every slot held ends a spell of
	// now - lastEvent.
	clock     func() time.Duration
	lastEvent atomic.Int64
	// slowSpell is the longest recent spell that a step ended (see
	// stallWait), with the clock reading it was recorded at.
	slowSpellMu sync.Mutex
	slowSpell   time.Duration
	slowSpellAt time.Duration
}

// full reports whether every slot is held.
func (s *loginSlots) full() bool { return len(s.held) == cap(s.held) }

// noteWaited records that an accept loop found every slot held: for the
// queue sizer (waited), and for the start of a burst (burstStart).
func (s *loginSlots) noteWaited() {
	s.waited.Store(true)
	now := int64(s.clock())
	if now-s.lastWaitedAt.Swap(now) > int64(burstQuiet) {
		s.burstStart.Store(now)
	}
}

// noteQueueWait records how long an accepted connection waited in the
// kernel's accept queue, for the queue sizer.
func (s *loginSlots) noteQueueWait(wait time.Duration) {
	for {
		longest := s.longestQueueWait.Load()
		if int64(wait) <= longest || s.longestQueueWait.CompareAndSwap(longest, int64(wait)) {
			return
		}
	}
}

// serverWaitBegin and serverWaitEnd bracket a login's wait on Postgres.
func (s *loginSlots) serverWaitBegin() { s.serverWaits.Add(1) }
func (s *loginSlots) serverWaitEnd()   { s.serverWaits.Add(-1) }

func newLoginSlots(n int) *loginSlots {
	if n <= 0 {
		n = slotsPerCPU * runtime.GOMAXPROCS(0)
	}
	epoch := time.Now()
	s := &loginSlots{held: make(chan struct{}, n), clock: func() time.Duration { return time.Since(epoch) }}
	// No burst has begun: the first login to find every slot held begins one.
	s.lastWaitedAt.Store(int64(-2 * burstQuiet))
	s.burstStart.Store(int64(-2 * stallWaitCeiling))
	return s
}

// tryAcquire takes a slot if one is free.
func (s *loginSlots) tryAcquire() bool {
	select {
	case s.held <- struct{}{}:
		s.acquired()
		return true
	default:
		return false
	}
}

// acquired notes the time a slot was taken: a spell in which every slot is
// held may begin there (see lastEvent).
func (s *loginSlots) acquired() { s.lastEvent.Store(int64(s.clock())) }

// release gives back the slot of a login that ended (served, failed or
// abandoned).
func (s *loginSlots) release() {
	s.step()
	<-s.held
	s.ended.Add(1)
	s.progressed.Add(1)
}

// progress records a step of a login holding a slot (see progressed).
func (s *loginSlots) progress() {
	s.step()
	s.progressed.Add(1)
}

// step notes the time of a login's step and, when it ends a slow spell
// (every slot held, no step for at least stallGapFloor), records the spell.
func (s *loginSlots) step() {
	now := s.clock()
	spell := now - time.Duration(s.lastEvent.Swap(int64(now)))
	if spell < stallGapFloor || spell > stallWaitCeiling || !s.full() {
		return
	}
	s.slowSpellMu.Lock()
	defer s.slowSpellMu.Unlock()
	if spell >= s.decayedSlowSpell(now) {
		s.slowSpell, s.slowSpellAt = spell, now
	}
}

// decayedSlowSpell is the recorded slow spell halved for every
// stallGapHalfLife since it was recorded. slowSpellMu must be held.
func (s *loginSlots) decayedSlowSpell(now time.Duration) time.Duration {
	halvings := (now - s.slowSpellAt) / stallGapHalfLife
	if halvings >= 32 {
		return 0
	}
	return s.slowSpell >> halvings
}

// stallWait is how long every slot must stay held with no login taking a
// step before the slots count as stalled: target (login_queue_target), or
// stallGapFactor times the recent slowest spell, whichever is longer, and
// at most stallWaitCeiling (or target, if that is longer).
//
// Within stallWaitCeiling of the start of a burst it is the ceiling: the
// slots were just filled by clients that connected together, which have
// yet to show how slow they are, and a fleet reconnecting at once is slow
// to send its first packets while its own dials take the machine's CPU.
// With the short wait, a burst of thousands of clients into an idle pooler
// had hundreds refused at its start (docs/admission.md). Clients that
// stall are still refused, a few hundred milliseconds later.
func (s *loginSlots) stallWait(target time.Duration) time.Duration {
	now := s.clock()
	if now-time.Duration(s.burstStart.Load()) < stallWaitCeiling {
		return max(target, stallWaitCeiling)
	}
	s.slowSpellMu.Lock()
	spell := s.decayedSlowSpell(now)
	s.slowSpellMu.Unlock()
	return max(target, min(stallGapFactor*spell, stallWaitCeiling))
}

// unused gives back a slot that no login used (the connection was refused
// or the accept failed); it is not progress.
func (s *loginSlots) unused() { <-s.held }

// admissionDecision is what admission control does with an accepted
// connection.
type admissionDecision int

const (
	admitLogin   admissionDecision = iota // serve it; it holds a slot
	shedNoSlot                            // refuse: the slots are stalled
	shedQueueAge                          // refuse: it waited too long in the accept queue
)

// admissionPolicy is one accept loop's admission state: whether it is
// shedding, and since which count of login steps (loginSlots.progressed).
// Its clock is a seam for tests (real timers in production). Not safe for
// concurrent use: each accept loop has its own, sharing the slots.
type admissionPolicy struct {
	slots *loginSlots
	// endStalled ends the logins that hold a slot and have waited on their
	// client for at least the given time, and returns how many it ended
	// (Pooler.endStalledLogins); nil ends none.
	endStalled func(waitedAtLeast time.Duration) int
	newTimer   func(time.Duration) (<-chan time.Time, func() bool)
	now        func() time.Time
	shedding   bool
	// stallWait is the stall wait that started the shedding, for its log
	// line.
	stallWait time.Duration
	// progressedAtShed is slots.progressed when shedding began: shedding
	// stops as soon as a login takes a step after it.
	progressedAtShed uint64
}

func newAdmissionPolicy(slots *loginSlots) *admissionPolicy {
	return &admissionPolicy{slots: slots, newTimer: func(d time.Duration) (<-chan time.Time, func() bool) {
		timer := time.NewTimer(d)
		return timer.C, timer.Stop
	}, now: time.Now}
}

// beforeAccept is called before each accept. Unless shedding, it waits for
// a free slot and reports whether it took one. It waits as long as logins
// keep taking steps (another loop may win the slot each one frees); when a
// whole stall wait (target, or longer after slow spells: stallWait), and a
// short wait to confirm it, pass with every slot held, no login taking a
// step and none waiting on Postgres (or done closes), the logins waiting on
// their clients all that while are ended (endStalled) and the loop waits
// for their slots; if there are none, it starts shedding. A wait whose timer fired late by more than half its
// length proves nothing: the loop could not run when it was due, so the
// process was starved of CPU (its cgroup quota spent, or a loaded machine)
// and so were the logins it waits on; the count starts over. A pooler
// whose logins really stalled is idle, and its timers fire on time.
func (a *admissionPolicy) beforeAccept(target time.Duration, done <-chan struct{}) (haveSlot bool) {
	if a.shedding {
		if a.slots.progressed.Load() == a.progressedAtShed {
			a.slots.noteWaited()
			return false // still stalled
		}
		a.shedding = false // a login took a step: the slots progress again
	}
	if a.slots.tryAcquire() {
		return true
	}
	a.slots.noteWaited()
	progressed := a.slots.progressed.Load()
	stallWait := a.slots.stallWait(target)
	wait, confirming := stallWait, false
	for {
		started := a.now()
		expired, stop := a.newTimer(wait)
		select {
		case a.slots.held <- struct{}{}:
			stop()
			a.slots.acquired()
			return true
		case <-expired:
		case <-done:
			stop()
			return false
		}
		if now := a.slots.progressed.Load(); now != progressed {
			// Logins are taking steps: a queue, not a stall. The step
			// may have ended a slow spell that lengthens the wait.
			stallWait = a.slots.stallWait(target)
			progressed, wait, confirming = now, stallWait, false
			continue
		}
		// Starved, not stalled: the timer fired late (before this rule, a
		// 64-client closed loop under a 20% CPU quota got 66 refusals).
		starved := a.now().Sub(started)-wait > wait/2
		// Waiting on Postgres, not on clients: a queue behind a slow
		// server, bounded by its timeouts.
		waitingOnServer := a.slots.serverWaits.Load() > 0
		if starved || waitingOnServer {
			wait, confirming = stallWait, false
			continue
		}
		if !confirming {
			// Confirm with one short wait more: a process whose CPU quota
			// ran out was frozen for the whole target (up to 80 ms of
			// every 100 under a 20% cgroup quota), and its logins need a
			// moment after it thaws to show progress again.
			wait, confirming = max(target/stallConfirmDivisor, time.Millisecond), true
			continue
		}
		if a.endStalled != nil && a.endStalled(stallWait) > 0 {
			// Their slots free as those logins end: for the
			// connections waiting in the accept queue, not refused.
			wait, confirming = stallWait, false
			continue
		}
		a.shedding, a.stallWait = true, stallWait
		a.progressedAtShed = progressed
		return false
	}
}

// afterAccept decides what to do with an accepted connection, given whether
// beforeAccept took a slot for it and how long it waited in the accept
// queue (ageKnown false where the kernel does not say). A connection that
// is served holds a slot; a refused one does not.
func (a *admissionPolicy) afterAccept(haveSlot bool, age time.Duration, ageKnown bool, maxAge time.Duration) admissionDecision {
	if !haveSlot {
		if !a.slots.tryAcquire() {
			return shedNoSlot
		}
		a.shedding = false // a slot is free again
	}
	if maxAge > 0 && ageKnown && age > maxAge {
		a.slots.unused()
		return shedQueueAge
	}
	return admitLogin
}

// queueAgeReader reads how long accepted connections waited in the
// kernel's accept queue, into storage of its own reused from one
// connection to the next, so that an accept allocates no TCP_INFO. It
// belongs to one accept loop.
type queueAgeReader struct {
	info    unix.TCPInfo
	infoErr error
	read    func(fd uintptr) // r.readInfo, as a func value made once
}

func newQueueAgeReader() *queueAgeReader {
	r := &queueAgeReader{}
	r.read = r.readInfo
	return r
}

// readInfo is getsockopt(TCP_INFO) into r.info (unix.GetsockoptTCPInfo
// would allocate the struct at every call). A raw call, as every direct
// system call of this package is (rawsocket.go): getsockopt never sleeps.
func (r *queueAgeReader) readInfo(fd uintptr) {
	length := uint32(unsafe.Sizeof(r.info))
	_, _, errno := unix.RawSyscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&r.info)), uintptr(unsafe.Pointer(&length)), 0)
	r.infoErr = nil
	if errno != 0 {
		r.infoErr = errno
	}
}

// age is how long conn waited in the kernel's accept queue: the time since
// its handshake's last ACK or its first data (TCP_INFO tcpi_last_ack_recv
// and tcpi_last_data_recv, in milliseconds; whichever is older is the
// closer bound). ok is false where the kernel does not say.
func (r *queueAgeReader) age(conn *net.TCPConn) (age time.Duration, ok bool) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, false
	}
	if err := raw.Control(r.read); err != nil || r.infoErr != nil {
		return 0, false
	}
	ms := max(r.info.Last_ack_recv, r.info.Last_data_recv)
	return time.Duration(ms) * time.Millisecond, true
}

// shed refuses an accepted connection with FATAL 53300. It reads the
// client's startup packet first (answering an SSLRequest or GSSENCRequest
// with 'N'), so that the client reads the error instead of a connection
// reset, all within shedDeadline. A client that has not sent its startup
// packet by then gets the error anyway: a client slow to send it (a load
// generator short of CPU, a long round trip) reads it after writing its
// packet. It counts the refusal as a login. queueWait is how long the
// connection waited in the kernel's accept queue, when known: logged, it
// says how much of the wait a refused client saw happened before pgtender
// could see the connection at all.
//
// An SSLRequest gets 'N' even when client TLS is configured: a TLS
// handshake per refused connection would cost the CPU that shedding is
// meant to save. A client that insists on TLS (sslmode=require) then
// reports that the server does not support SSL instead of the 53300 text;
// it is refused either way, and counted as shed.
//
// A CancelRequest is not refused: it is forwarded as from any connection
// (bounded by maxConcurrentCancels, not by login slots), since under
// overload a cancel is what relieves Postgres. It is counted as a cancel,
// not as a login.
func (p *Pooler) shed(conn *net.TCPConn, reason ShedReason, queueWait time.Duration, queueWaitKnown bool) {
	defer p.wg.Done()
	defer conn.Close()
	p.recorder.LoginStarted()
	_ = conn.SetDeadline(time.Now().Add(shedDeadline))
	var scratch [256]byte
read:
	for range 3 {
		startup, err := wire.ReadStartup(conn, scratch[:0])
		if err != nil {
			if errors.Is(err, wire.ErrMalformedStartup) || isTimeout(err) {
				break
			}
			break // the client is gone: still a refused login
		}
		switch startup.Kind {
		case wire.SSLRequest, wire.GSSEncRequest:
			if _, err := conn.Write([]byte{'N'}); err != nil {
				break read
			}
			continue
		case wire.CancelRequest:
			p.recorder.LoginCancelRequest()
			p.cancelRequest(conn.RemoteAddr(), startup.CancelProcessID, startup.CancelSecret)
			return
		}
		break // a StartupMessage
	}
	p.recorder.LoginFinished(LoginShed, LoginTimings{})
	p.shedCounts.add(reason)
	if logged := p.log.Check(zap.InfoLevel, "login refused: overloaded"); logged != nil {
		fields := []zap.Field{zap.String("reason", string(reason)), zap.String("remote", conn.RemoteAddr().String())}
		if queueWaitKnown {
			fields = append(fields, zap.Duration("accept_queue_wait", queueWait))
		}
		logged.Write(fields...)
	}
	_ = conn.SetWriteDeadline(time.Now().Add(shedDeadline))
	_, _ = conn.Write(wire.AppendErrorResponse(nil, wire.SeverityFatal, sqlstateTooManyConnections, shedMessage))
}
