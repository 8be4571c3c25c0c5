package pooler

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Cancel keys. Every client gets its own BackendKeyData, a process id and a
// secret, and a CancelRequest carrying them is routed to the backend
// serving that client (cancelRequest). Drivers show the process id as the
// backend's pid (pgconn's PID, psycopg's info.backend_pid, JDBC's
// getBackendPID), and applications hand it to pg_cancel_backend,
// pg_terminate_backend or pg_stat_activity. So the id must never be the
// pid of a real Postgres backend, which would then serve some other
// client: it is drawn above maxLinuxPID, where no Linux process id can be.
// It stays within int32 as well, since some drivers read it signed.
//
// The id and the secret are both random, from crypto/rand, so a live key
// takes a guess of about 63 bits, as PgBouncer's 64 random bits do
// (welcome_client in src/server.c), and ids are unique among live
// sessions, so the pair names one client.

// maxLinuxPID is the ceiling of the kernel.pid_max sysctl on 64-bit Linux
// (PID_MAX_LIMIT in include/linux/threads.h; proc_sys_kernel(5)): no Linux
// process id reaches it.
const maxLinuxPID = 4 << 20

// keyBatchLen is how many random bytes keySource reads from crypto/rand at
// once: one read serves about 60 clients, so a login does not pay for a
// getrandom call of its own.
const keyBatchLen = 512

// keySource draws cancel keys from crypto/rand. Not safe for concurrent
// use: the pooler calls it with sessionsMu held.
type keySource struct {
	buf  [keyBatchLen]byte
	next int // bytes of buf used; len(buf) (or 0 before the first fill) means refill
	// fill replaces crypto/rand in tests; nil in production.
	fill func([]byte)
}

func (k *keySource) uint32() uint32 {
	if k.next == 0 || k.next+4 > len(k.buf) {
		if k.fill != nil {
			k.fill(k.buf[:])
		} else {
			rand.Read(k.buf[:]) // never fails, per its documentation
		}
		k.next = 0
	}
	v := binary.BigEndian.Uint32(k.buf[k.next:])
	k.next += 4
	return v
}

// processID returns an id in (maxLinuxPID, math.MaxInt32], uniformly: 31
// random bits, drawn again when they fall at or below maxLinuxPID (1 draw
// in 512).
func (k *keySource) processID() uint32 {
	for {
		if id := k.uint32() & math.MaxInt32; id > maxLinuxPID {
			return id
		}
	}
}

// CancelRequests counts the CancelRequests pgtender received since it
// started, by what became of them: forwarded to the backend serving the
// client (Forwarded), none sent because the client had no server
// connection linked (NoServer), forwarding failed (Error), or dropped
// because the key named no live client (UnknownKey); or the client was
// waiting for a server connection and was taken out of the queue, its
// request answered 57014 (WhileWaiting).
type CancelRequests struct {
	Forwarded, NoServer, Error, UnknownKey, WhileWaiting uint64
}

// cancelCounters are the atomics behind CancelRequests.
type cancelCounters struct {
	forwarded, noServer, failed, unknownKey, whileWaiting atomic.Uint64
}

// CancelRequests returns the cancel counters now.
func (p *Pooler) CancelRequests() CancelRequests {
	return CancelRequests{
		Forwarded:    p.cancels.forwarded.Load(),
		NoServer:     p.cancels.noServer.Load(),
		Error:        p.cancels.failed.Load(),
		UnknownKey:   p.cancels.unknownKey.Load(),
		WhileWaiting: p.cancels.whileWaiting.Load(),
	}
}

// cancelTarget returns the logged-in session whose BackendKeyData is
// (processID, secret), or nil. A session still logging in has not been
// told its key, so nothing can name it yet.
func (p *Pooler) cancelTarget(processID uint32, secret []byte) *session {
	if len(secret) != 4 {
		return nil // pgtender's keys are 4 bytes (protocol 3.0)
	}
	p.sessionsMu.Lock()
	target := p.sessions[processID]
	p.sessionsMu.Unlock()
	if target == nil || !target.loggedIn.Load() {
		return nil
	}
	// target.secret was set before the session was registered.
	var want [4]byte
	binary.BigEndian.PutUint32(want[:], target.secret)
	if subtle.ConstantTimeCompare(want[:], secret) != 1 {
		return nil
	}
	return target
}

// cancelRequest forwards a client's CancelRequest, which came from remote,
// to the Postgres backend linked to that client now, and to nothing else.
func (p *Pooler) cancelRequest(remote net.Addr, processID uint32, secret []byte) {
	target := p.cancelTarget(processID, secret)
	if target == nil {
		p.cancels.unknownKey.Add(1)
		// A key that names no client is a client that left before its
		// cancel arrived, a pid taken from somewhere else (pg_stat_activity
		// shows real backends' pids, which pgtender never hands out), or
		// someone guessing: worth a line, but a storm of them must not
		// flood the log. The secret is never logged.
		if n, ok := p.unknownCancelLog.take(time.Now()); ok {
			p.log.Info("cancel request matched no client: dropped",
				zap.String("remote", remote.String()), zap.Uint32("process_id", processID),
				zap.Uint64("unmatched_since_last_line", n))
		}
		return
	}
	target.mu.Lock()
	sc := target.server
	if sc == nil || target.closingLocked() {
		if waiting := target.checkoutCancel; waiting != nil && !target.closingLocked() {
			// The client waits for a server connection: nothing runs yet,
			// so the cancel takes it out of the queue.
			waiting(errCanceledWhileWaiting)
			target.mu.Unlock()
			p.cancels.whileWaiting.Add(1)
			return
		}
		target.mu.Unlock()
		p.cancels.noServer.Add(1)
		return
	}
	// Hold the link until Postgres has taken the cancel in: released now,
	// the backend could start another client's query before the cancel
	// lands and cancel that instead. Postgres signals the backend before it
	// closes the cancel connection, and a backend that gets the signal
	// while waiting for a command drops it.
	target.cancelsInFlight++
	address, serverPID, serverSecret := sc.address, sc.processID, sc.secretKey
	target.mu.Unlock()

	ctx, cancel := context.WithTimeout(p.ctx, p.state.Load().cfg.General.ConnectTimeout.Duration())
	var err error
	select {
	case p.cancelSlots <- struct{}{}:
		err = sendCancel(ctx, address, serverPID, serverSecret)
		<-p.cancelSlots
	case <-ctx.Done():
		err = fmt.Errorf("waiting for one of the %d cancel slots: %w", maxConcurrentCancels, ctx.Err())
	}
	cancel()
	if err != nil {
		p.cancels.failed.Add(1)
		p.log.Warn("could not forward a cancel request", zap.Uint32("client_id", processID), zap.Error(err))
	} else {
		p.cancels.forwarded.Add(1)
	}

	target.mu.Lock()
	target.cancelsInFlight--
	if target.cancelsInFlight == 0 {
		target.cond.Broadcast() // returnServer may be waiting
		if target.server == sc && target.mayReleaseLocked() {
			target.wakeReaderLocked(sc)
		}
	}
	target.mu.Unlock()
}

// logSampler lets one log line through per interval and counts the events
// in between, so a storm of one event costs a line per interval and the
// line still says how many there were. Safe for concurrent use.
type logSampler struct {
	interval time.Duration
	last     atomic.Int64  // UnixNano of the last line let through; 0: none yet
	events   atomic.Uint64 // events not yet reported by a line
}

// take records one event at now. It reports whether a line is due, and if
// so how many events it stands for, this one included.
func (l *logSampler) take(now time.Time) (events uint64, due bool) {
	l.events.Add(1)
	last := l.last.Load()
	if last != 0 && now.UnixNano()-last < int64(l.interval) {
		return 0, false
	}
	if !l.last.CompareAndSwap(last, now.UnixNano()) {
		return 0, false // another goroutine writes this interval's line
	}
	return l.events.Swap(0), true
}
