package pooler

import (
	"errors"
	"net"
	"runtime"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/pgtender/pgtender/pooler/wire"
)

// Login admission control.
//
// A login holds one of a bounded number of login slots from accept to
// ReadyForQuery (or its end). While every slot is taken, the accept loops
// stop accepting, so new connections wait in the kernel's accept queue,
// which costs pgtender nothing. (overload.md measured this policy keeping a
// no-backend Go login server at capacity under 3× overload where accepting
// everything fell to 0.69×; pgtender's own figures, which do not yet reach
// that, are in docs/PERFORMANCE.md "Reconnect waves".)
// Two rules keep that wait short of a client's deadline:
//
//   - When no slot frees within login_queue_target, the accept loop starts
//     shedding: it accepts each new connection and refuses it at once with
//     FATAL 53300, until a slot is free again. Slots held by logins that do
//     not progress (clients stalling mid-login) then cost new clients a
//     quick, clear refusal instead of a silent wait.
//   - A connection accepted after waiting longer than login_queue_max_age
//     in the kernel's queue is refused rather than served late: its client
//     has used most of its connect_timeout already, and serving it would
//     make the connections behind it late too.
//
// A login already holding a slot is never starved by newcomers: slots are
// released only by the logins that hold them.

// slotsPerCPU is the default number of login slots per GOMAXPROCS.
const slotsPerCPU = 128

// shedDeadline bounds how long a refused connection may take pgtender's
// time: reading its startup packet (so the client sees the error, not a
// reset) and writing the error.
const shedDeadline = 250 * time.Millisecond

// shedMessage is what a refused client reads.
const shedMessage = "pgtender is overloaded: too many logins in progress; retry"

// ShedReason says why admission control refused a connection; it is the
// reason logged for a refusal.
type ShedReason string

const (
	ShedNoLoginSlot ShedReason = "no_login_slot" // no slot freed within login_queue_target
	ShedQueueAge    ShedReason = "queue_age"     // waited longer than login_queue_max_age in the accept queue
)

// loginSlots is the semaphore of login slots.
type loginSlots chan struct{}

func newLoginSlots(n int) loginSlots {
	if n <= 0 {
		n = slotsPerCPU * runtime.GOMAXPROCS(0)
	}
	return make(loginSlots, n)
}

// tryAcquire takes a slot if one is free.
func (s loginSlots) tryAcquire() bool {
	select {
	case s <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s loginSlots) release() { <-s }

// admissionDecision is what admission control does with an accepted
// connection.
type admissionDecision int

const (
	admitLogin   admissionDecision = iota // serve it; it holds a slot
	shedNoSlot                            // refuse: no slot freed within login_queue_target
	shedQueueAge                          // refuse: it waited too long in the accept queue
)

// admissionPolicy is one accept loop's admission state: whether it is
// shedding. Its clock is a seam for tests (real timers in production).
// Not safe for concurrent use: each accept loop has its own, sharing slots.
type admissionPolicy struct {
	slots    loginSlots
	newTimer func(time.Duration) (<-chan time.Time, func() bool)
	shedding bool
}

func newAdmissionPolicy(slots loginSlots) *admissionPolicy {
	return &admissionPolicy{slots: slots, newTimer: func(d time.Duration) (<-chan time.Time, func() bool) {
		timer := time.NewTimer(d)
		return timer.C, timer.Stop
	}}
}

// beforeAccept is called before each accept. Unless shedding, it waits up
// to target for a free slot and reports whether it took one; when none
// frees in time (or done closes) the loop starts shedding.
func (a *admissionPolicy) beforeAccept(target time.Duration, done <-chan struct{}) (haveSlot bool) {
	if a.shedding {
		return false
	}
	if a.slots.tryAcquire() {
		return true
	}
	expired, stop := a.newTimer(target)
	defer stop()
	select {
	case a.slots <- struct{}{}:
		return true
	case <-expired:
	case <-done:
	}
	a.shedding = true
	return false
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
		a.slots.release()
		return shedQueueAge
	}
	return admitLogin
}

// acceptQueueAge is how long an accepted connection waited in the kernel's
// accept queue: the time since its handshake's last ACK or its first data
// (TCP_INFO tcpi_last_ack_recv and tcpi_last_data_recv, in milliseconds;
// whichever is older is the closer bound). ok is false where the kernel
// does not say.
func acceptQueueAge(conn *net.TCPConn) (age time.Duration, ok bool) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	var infoErr error
	if err := raw.Control(func(fd uintptr) {
		info, infoErr = unix.GetsockoptTCPInfo(int(fd), unix.SOL_TCP, unix.TCP_INFO)
	}); err != nil || infoErr != nil {
		return 0, false
	}
	ms := max(info.Last_ack_recv, info.Last_data_recv)
	return time.Duration(ms) * time.Millisecond, true
}

// shed refuses an accepted connection with FATAL 53300. It reads the
// client's startup packet first (answering an SSLRequest or GSSENCRequest
// with 'N'), so that the client reads the error instead of a connection
// reset, all within shedDeadline. It counts the refusal as a login.
func (p *Pooler) shed(conn *net.TCPConn, reason ShedReason) {
	defer p.wg.Done()
	defer conn.Close()
	p.recorder.LoginStarted()
	p.recorder.LoginFinished(LoginShed, LoginTimings{})
	p.log.Info("login refused: overloaded", zap.String("reason", string(reason)), zap.String("remote", conn.RemoteAddr().String()))
	_ = conn.SetDeadline(time.Now().Add(shedDeadline))
	var scratch [256]byte
	for range 3 {
		startup, err := wire.ReadStartup(conn, scratch[:0])
		if err != nil {
			if errors.Is(err, wire.ErrMalformedStartup) {
				break
			}
			return
		}
		if startup.Kind == wire.SSLRequest || startup.Kind == wire.GSSEncRequest {
			if _, err := conn.Write([]byte{'N'}); err != nil {
				return
			}
			continue
		}
		break // a StartupMessage (or a CancelRequest, which cannot be served now)
	}
	_, _ = conn.Write(wire.AppendErrorResponse(nil, wire.SeverityFatal, sqlstateTooManyConnections, shedMessage))
}
