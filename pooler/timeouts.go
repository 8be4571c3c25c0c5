package pooler

import (
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pgtender/pgtender/pooler/wire"
)

// ClientTimeouts counts the clients pgtender disconnected because a
// timeout ran out, since it started: Write, a client that took none of
// pgtender's output within client_write_timeout (session.write);
// IdleInTransaction, a client that held a transaction open and sent
// nothing for client_idle_in_transaction_timeout; Query, a client whose
// request was not answered within query_timeout.
type ClientTimeouts struct {
	Write, IdleInTransaction, Query uint64
}

// clientTimeoutCounters are the atomics behind ClientTimeouts.
type clientTimeoutCounters struct {
	write, idleInTransaction, query atomic.Uint64
}

// ClientTimeouts returns the client timeout counters now.
func (p *Pooler) ClientTimeouts() ClientTimeouts {
	return ClientTimeouts{
		Write:             p.clientTimeouts.write.Load(),
		IdleInTransaction: p.clientTimeouts.idleInTransaction.Load(),
		Query:             p.clientTimeouts.query.Load(),
	}
}

// Idle in transaction.
//
// A client is idle in a transaction from the ReadyForQuery that says it is
// in one (or in a failed one) with nothing else owed, until it sends the
// next byte; Postgres's idle_in_transaction_session_timeout measures the
// same wait. Its bound is a read deadline on the client's socket, which
// readServer sets as it writes that ReadyForQuery (watchIdleInTransaction-
// Locked) and serve's read runs into (idleInTransactionExpired). No timer
// of its own is armed, and nothing at all is done per transaction while
// client_idle_in_transaction_timeout is 0.

// watchIdleInTransactionLocked is called by readServer after it wrote
// ReadyForQuery to the client: the socket's read deadline becomes
// client_idle_in_transaction_timeout from now if the client is now idle in
// a transaction, and is cleared if it was set for an earlier idle spell.
// s.mu must be held.
func (s *session) watchIdleInTransactionLocked() {
	timeout := s.pooler.state.Load().cfg.General.ClientIdleInTransactionTimeout.Duration()
	if timeout > 0 && s.link.idleInTransaction() {
		s.idleTxDeadline = time.Now().Add(timeout)
		_ = s.tcp.SetReadDeadline(s.idleTxDeadline)
		return
	}
	if !s.idleTxDeadline.IsZero() {
		s.idleTxDeadline = time.Time{}
		_ = s.tcp.SetReadDeadline(s.idleTxDeadline)
	}
}

// idleInTransactionExpired is called by serve when a read of the client's
// socket ran out of its deadline, which after login only
// watchIdleInTransactionLocked sets. It returns the error that ends the
// session when the client is still idle in its transaction and its time
// is up; otherwise nil, with the deadline cleared (it was set for an idle
// spell the client has since ended: its next request has been forwarded,
// and its reply is not in yet).
func (s *session) idleInTransactionExpired() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.server != nil && !s.idleTxDeadline.IsZero() && s.link.idleInTransaction() && !time.Now().Before(s.idleTxDeadline) {
		s.idleTxDeadline = time.Time{}
		s.pooler.clientTimeouts.idleInTransaction.Add(1)
		s.pooler.log.Warn("client idle in a transaction for client_idle_in_transaction_timeout; disconnecting it and rolling its transaction back",
			s.logFields()...)
		return fatalError(sqlstateIdleInTransactionTimeout, "terminating connection due to idle-in-transaction timeout", nil)
	}
	s.idleTxDeadline = time.Time{}
	_ = s.tcp.SetReadDeadline(s.idleTxDeadline)
	return nil
}

// Query timeout.
//
// query_timeout bounds how long a request waits for its answer: the clock
// starts when the client sends something the server must answer while
// nothing was being timed, restarts at each ReadyForQuery while more is
// owed (the next request of a pipeline), and stops when nothing is owed.
// A request is a simple Query, or an extended-protocol batch up to its
// Sync; a COPY counts until its ReadyForQuery. When the clock runs out,
// readServer (which owns the server stream and the client's output) ends
// the session: the client is told, and finish cancels what runs on the
// server, drains it and rolls it back, so that the connection is reused
// when Postgres answers, and closed when it does not (a network path that
// stalled) within rollback_timeout.
//
// The clock is one timer per session, made at its first timed request
// and re-armed per request, only while query_timeout is set.

// startQueryClockLocked starts the clock if query_timeout is set, the
// link owes a reply and the clock is not running. Called by serve after it
// planned a chunk for the server. s.mu must be held.
func (s *session) startQueryClockLocked() {
	if s.queryClockRunning || s.pooler.state.Load().cfg.General.QueryTimeout <= 0 || s.link.owed() == nil {
		return
	}
	s.armQueryClockLocked(time.Now())
}

// queryAnsweredLocked is called by readServer after it forwarded
// ReadyForQuery: the clock restarts for the next request owed, or stops.
// s.mu must be held.
func (s *session) queryAnsweredLocked() {
	if !s.queryClockRunning {
		return
	}
	if s.link.owed() != nil {
		s.armQueryClockLocked(time.Now())
		return
	}
	s.stopQueryClockLocked()
}

// armQueryClockLocked (re)starts the clock from now, when query_timeout is
// set. s.mu must be held.
func (s *session) armQueryClockLocked(now time.Time) {
	timeout := s.pooler.state.Load().cfg.General.QueryTimeout.Duration()
	if timeout <= 0 {
		s.stopQueryClockLocked()
		return
	}
	s.queryClockRunning = true
	s.queryClockStarted = now
	if s.queryClock == nil {
		s.queryClock = time.AfterFunc(timeout, s.queryClockRanOut)
		return
	}
	s.queryClock.Reset(timeout)
}

// stopQueryClockLocked stops the clock. A run-out already on its way sees
// it stopped (queryClockRanOut). s.mu must be held.
func (s *session) stopQueryClockLocked() {
	if !s.queryClockRunning {
		return
	}
	s.queryClockRunning = false
	s.queryClock.Stop()
}

// queryClockRanOut is the clock's timer function. If the request it timed
// is still unanswered, readServer is woken to end the session
// (queryTimedOut). A run-out of a clock since stopped does nothing; of one
// since re-armed (or whose timeout a reload raised), it sets the timer for
// what is left; with nothing owed (the reply came without a
// ReadyForQuery: a Flush), it only stops the clock.
func (s *session) queryClockRanOut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.queryClockRunning || s.closingLocked() || s.server == nil {
		return
	}
	timeout := s.pooler.state.Load().cfg.General.QueryTimeout.Duration()
	if timeout <= 0 {
		s.queryClockRunning = false // a reload turned query_timeout off
		return
	}
	if left := timeout - time.Since(s.queryClockStarted); left > 0 {
		s.queryClock.Reset(left)
		return
	}
	s.queryClockRunning = false
	if s.link.owed() == nil {
		return
	}
	s.queryTimedOut = true
	s.wakeReaderLocked(s.server)
}

// endTimedOutQueryLocked ends the session whose request ran past
// query_timeout, from readServer, which found queryTimedOut set when it
// was woken. The client is told only when its output is at a message
// boundary (else a message would land inside a row it is reading); finish
// then cleans sc. s.mu must be held; it is released.
func (s *session) endTimedOutQueryLocked(sc *ServerConn) {
	s.queryTimedOut = false
	s.endLocked(stateClosing)
	s.mu.Unlock()
	timeout := s.pooler.state.Load().cfg.General.QueryTimeout.Duration()
	s.pooler.clientTimeouts.query.Add(1)
	s.pooler.log.Warn("request not answered within query_timeout; disconnecting the client and canceling the request",
		s.logFields(zap.Duration("query_timeout", timeout))...)
	if sc.scanner.AtBoundary() {
		s.sendError(wire.SeverityFatal, sqlstateQueryCanceled,
			fmt.Sprintf("terminating connection: the request was not answered within query_timeout (%v)", timeout))
	}
	s.closeSocket()
}
