package pooler

import (
	"errors"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Parking idle clients.
//
// A logged-in client that sends nothing holds a goroutine waiting in the
// runtime's poller, and the goroutine's stack is most of what that client
// costs (docs/pooling.md, "What an idle client holds"). A plain-TCP client
// with no server connection linked, silent for a sweep interval, is
// therefore parked: its session goroutine registers the socket on an epoll
// set of pgtender's own (one-shot, level-triggered, so a byte that arrived
// before the registration is reported at once) and returns. The session
// itself stays whole, in the sessions map; nothing of its state lived on
// the stack, since a session parks only at the top of the relay loop with
// no partial message held. When the socket turns readable (a request, a
// close, a reset), the parker goroutine starts a goroutine that goes on
// with the relay loop. A session whose socket pgtender closes while parked
// (shutdown, a kill) is resumed by closeSocket, since closing a descriptor
// takes it off every epoll set without an event.
//
// Whoever moves session.parked from true to false owns the session: the
// parker on an event, closeSocket, or the parking goroutine itself when
// the registration failed. Only the owner runs the relay loop.

// parkSweepInterval is how often idle sessions are looked for: a client
// silent for between one and two intervals is parked. Resuming costs a
// goroutine start and two epoll_ctl calls, small against a second of
// silence, and nothing is added to a client that is busy.
const parkSweepInterval = time.Second

// The parker returns freed memory to the operating system once the parked
// sessions grew by parkReleaseAfter, at most every parkReleaseInterval
// unless they grew by a quarter since the last release
// (releaseMemoryIfParkedMany); it looks parkReleaseDelay after a sweep
// asked sessions to park, by when they have.
const (
	parkReleaseAfter    = 1024
	parkReleaseInterval = 10 * time.Second
	parkReleaseDelay    = 100 * time.Millisecond
)

// parkTuning is the parker's timing; a zero field takes its default.
type parkTuning struct {
	sweep           time.Duration // parkSweepInterval
	releaseAfter    int64         // parkReleaseAfter
	releaseInterval time.Duration // parkReleaseInterval
}

func (t parkTuning) withDefaults() parkTuning {
	if t.sweep <= 0 {
		t.sweep = parkSweepInterval
	}
	if t.releaseAfter <= 0 {
		t.releaseAfter = parkReleaseAfter
	}
	if t.releaseInterval <= 0 {
		t.releaseInterval = parkReleaseInterval
	}
	return t
}

// errParked is what the relay loop returns when the session parked: its
// goroutine ends and the session goes on in another.
var errParked = errors.New("session parked")

// parker owns the epoll set of parked sessions and the goroutine that
// waits on it.
type parker struct {
	p *Pooler
	// mu guards epfd against close: epoll_ctl is called under it, and close
	// closes the set under it, so that no epoll_ctl reaches a descriptor
	// number reused since.
	mu     sync.Mutex
	epfd   int
	file   *os.File        // epfd, on the runtime's poller (run waits on it)
	raw    syscall.RawConn // file's
	closed bool
	tuning parkTuning
	// parked counts the sessions parked now; parks, the parkings since
	// the pooler started.
	parked atomic.Int64
	parks  atomic.Uint64
	// releases counts the memory releases (releaseMemoryIfParkedMany).
	releases atomic.Uint64
	// sessions is the sweep's scratch, owned by run.
	sessions []*session
	// Owned by run: the fewest sessions parked at a look since the last
	// memory release, how many were parked at that release and when it
	// began (releaseMemoryIfParkedMany), and when to look again between
	// sweeps (zero: none due). releasing: one is under way.
	parkedLow       int64
	parkedAtRelease int64
	lastRelease     time.Time
	releaseLook     time.Time
	releasing       atomic.Bool
}

func newParker(p *Pooler, tuning parkTuning) (*parker, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	// Non-blocking, so that os.NewFile puts it on the runtime's poller: an
	// epoll set is readable while it has events to report.
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, err
	}
	file := os.NewFile(uintptr(epfd), "parked clients")
	raw, err := file.SyscallConn()
	if err != nil {
		file.Close()
		return nil, err
	}
	return &parker{p: p, epfd: epfd, file: file, raw: raw, tuning: tuning.withDefaults()}, nil
}

// run waits for parked sockets to turn readable and resumes their
// sessions, and sweeps for idle sessions every interval, until stop.
// It waits in the runtime's poller, as a socket read does, rather than in
// a blocking epoll_wait: a thread blocked in a system call keeps its
// scheduler slot until the runtime's monitor takes it back, so the
// goroutines run resumed would have waited for that.
func (pk *parker) run() {
	defer pk.p.wg.Done()
	events := make([]unix.EpollEvent, 128)
	lastSweep := time.Now()
	for {
		wake := lastSweep.Add(pk.tuning.sweep)
		if !pk.releaseLook.IsZero() && pk.releaseLook.Before(wake) {
			wake = pk.releaseLook
		}
		_ = pk.file.SetReadDeadline(wake)
		if pk.stopped() { // after the deadline is set: stop's may have come before it and been undone
			pk.close()
			return // Shutdown ends the parked sessions (closeSocket)
		}
		var waitErr error
		err := pk.raw.Read(func(fd uintptr) bool {
			n, err := unix.EpollWait(int(fd), events, 0)
			if err == unix.EINTR {
				return false
			}
			if err != nil {
				waitErr = err
				return true
			}
			for _, event := range events[:n] {
				if s := pk.p.sessionByID(uint32(event.Fd)); s != nil {
					s.unpark()
				}
			}
			return n > 0
		})
		if err == nil {
			err = waitErr
		}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			pk.p.log.Error("waiting on parked clients failed; idle clients are no longer parked", zap.Error(err))
			pk.close()
			pk.resumeAll()
			return
		}
		now := time.Now()
		if !pk.releaseLook.IsZero() && !now.Before(pk.releaseLook) {
			pk.releaseLook = time.Time{}
			pk.releaseMemoryIfParkedMany(now)
		}
		if now.Sub(lastSweep) >= pk.tuning.sweep {
			lastSweep = now
			// Every sweep looks too: a release refused for its interval,
			// or while one ran, comes at a later sweep.
			pk.releaseMemoryIfParkedMany(now)
			if pk.sweepIdleSessions() > 0 {
				pk.releaseLook = now.Add(parkReleaseDelay)
			}
		}
	}
}

// stopped reports whether run must end: Shutdown began (it may have begun
// before the parker was made, and then never calls stop).
func (pk *parker) stopped() bool {
	select {
	case <-pk.p.done:
		return true
	default:
		return false
	}
}

// stop wakes run, which ends since p.done is closed before stop is called.
// Sessions parked then stay so until closeSocket resumes them, which
// Shutdown makes happen.
func (pk *parker) stop() {
	_ = pk.file.SetReadDeadline(time.Unix(1, 0))
}

// close closes the epoll set; run calls it as it returns.
func (pk *parker) close() {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	pk.closed = true
	_ = pk.file.Close()
}

// resumeAll resumes every parked session, after the set failed.
func (pk *parker) resumeAll() {
	for _, s := range pk.p.sessionList() {
		s.unpark()
	}
}

// unpark resumes s on a goroutine of its own if it is parked; a no-op
// otherwise, or when another goroutine took it first.
func (s *session) unpark() {
	if s.parked.CompareAndSwap(true, false) {
		s.pooler.parker.Load().parked.Add(-1)
		go s.resume()
	}
}

// add registers s's socket, one-shot; false when it cannot be (the socket
// is closed, or the parker stopped).
func (pk *parker) add(s *session) bool {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.closed {
		return false
	}
	var ctlErr error
	err := s.in.raw.Control(func(fd uintptr) {
		event := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: int32(s.processID)}
		ctlErr = unix.EpollCtl(pk.epfd, unix.EPOLL_CTL_ADD, int(fd), &event)
	})
	return err == nil && ctlErr == nil
}

// remove takes s's socket off the set; nothing when it is closed (closing
// took it off) or the parker stopped.
func (pk *parker) remove(s *session) {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.closed {
		return
	}
	_ = s.in.raw.Control(func(fd uintptr) {
		_ = unix.EpollCtl(pk.epfd, unix.EPOLL_CTL_DEL, int(fd), nil)
	})
}

// sessionByID returns the live session whose BackendKeyData process id is
// id, or nil.
func (p *Pooler) sessionByID(id uint32) *session {
	p.sessionsMu.Lock()
	defer p.sessionsMu.Unlock()
	return p.sessions[id]
}

// sweepIdleSessions asks every session that has waited for its client
// since the previous sweep, with no server connection linked, to park: a
// read deadline in the past wakes its read, and the relay loop parks it
// (parkIfAsked). It returns how many it asked.
func (pk *parker) sweepIdleSessions() int {
	if pk.p.draining.Load() {
		return 0
	}
	asked := 0
	pk.sessions = pk.p.appendSessions(pk.sessions[:0])
	defer clear(pk.sessions) // no session is kept alive by the sweep
	for _, s := range pk.sessions {
		waits := s.idleWaits.Load()
		seen := s.idleWaitsSeen
		s.idleWaitsSeen = waits
		if !s.waitingIdle.Load() || waits != seen || s.parked.Load() {
			continue
		}
		s.mu.Lock()
		if s.stateLocked() == stateIdle && s.server == nil {
			s.parkAsked.Store(true)
			_ = s.tcp.SetReadDeadline(time.Unix(1, 0))
			asked++
		}
		s.mu.Unlock()
	}
	return asked
}

// parkIfAsked is called by the relay loop when a read of the client ran
// out of its deadline with nothing held; it parks the session when the
// sweep asked for it and the session still has no server connection. True
// means the session parked (or is owned by another goroutine now): the
// caller's goroutine must return without touching it.
func (s *session) parkIfAsked() bool {
	if !s.parkAsked.Swap(false) || s.in.raw == nil {
		return false
	}
	pk := s.pooler.parker.Load()
	if pk == nil {
		return false
	}
	s.mu.Lock()
	parkable := s.stateLocked() == stateIdle && s.server == nil && !s.pooler.draining.Load() && s.scanner.AtBoundary()
	s.mu.Unlock()
	if !parkable {
		return false
	}
	s.releaseScratch()
	s.parked.Store(true)
	pk.parked.Add(1)
	if pk.add(s) {
		pk.parks.Add(1)
		return true
	}
	if s.parked.CompareAndSwap(true, false) {
		pk.parked.Add(-1)
		s.takeScanner()
		return false // not registered: go on waiting here
	}
	return true // closeSocket resumed it meanwhile
}

// releaseScratch drops the buffers the relay reuses from chunk to chunk,
// which a parked session does not need.
func (s *session) releaseScratch() {
	s.chunk.messages = nil
	s.edits = nil
	s.editBytes = nil
	s.keyScratch = nil
	s.writeBuffers = nil
	s.pendingStatements = nil
	s.localReplies = nil
	s.serverOut = nil // readServer's, and no server connection is linked
	s.replyScratch = nil
	s.returnScanner()
}

// ClientParking is what the parker holds and has done (park.go).
type ClientParking struct {
	Parked         int64  // logged-in clients parked now, holding no goroutine
	Parks          uint64 // times a client was parked since the pooler started
	MemoryReleases uint64 // times the memory parkings freed was returned to the OS
}

// ClientParking returns the parker's figures; zero before Serve, or when
// no epoll set could be made.
func (p *Pooler) ClientParking() ClientParking {
	pk := p.parker.Load()
	if pk == nil {
		return ClientParking{}
	}
	return ClientParking{Parked: pk.parked.Load(), Parks: pk.parks.Load(), MemoryReleases: pk.releases.Load()}
}

// releaseMemoryIfParkedMany returns the memory of the goroutine stacks
// that parkings freed to the operating system, once the sessions parked
// grew by releaseAfter since the fewest seen after the last release. The
// runtime keeps freed memory for reuse up to a goal that counts the stacks
// in use at the last collection, so after a wave of logins that stay
// connected, the stacks of the sessions since parked would stay in the
// process's RSS until a collection with far fewer goroutines lowered that
// goal and the background scavenger caught up, which an idle pooler may
// never reach. A forced collection and scavenge costs CPU in proportion to
// the live heap: it is done on a goroutine of its own (run goes on
// resuming sessions meanwhile), at most every releaseInterval, or sooner
// while a wave of logins that stay connected parks a quarter more than
// were parked at the last release: a wave parks over two or three sweeps,
// and the stacks of those parked after its first release would otherwise
// stay for an interval. So a wave's releases grow geometrically and cost
// a few times its last. Clients that go idle and busy again over and over
// do not cause one, since they do not make the parked sessions grow past
// the fewest seen, nor past those parked at the last release.
func (pk *parker) releaseMemoryIfParkedMany(now time.Time) {
	parked := pk.parked.Load()
	pk.parkedLow = min(pk.parkedLow, parked)
	if parked-pk.parkedLow < pk.tuning.releaseAfter {
		return
	}
	if now.Sub(pk.lastRelease) < pk.tuning.releaseInterval && 4*(parked-pk.parkedAtRelease) < pk.parkedAtRelease {
		return
	}
	if !pk.releasing.CompareAndSwap(false, true) {
		return
	}
	pk.parkedLow, pk.parkedAtRelease, pk.lastRelease = parked, parked, now
	pk.p.wg.Add(1)
	go func() {
		defer pk.p.wg.Done()
		defer pk.releasing.Store(false)
		debug.FreeOSMemory()
		pk.releases.Add(1)
	}()
}
