package pooler

import (
	"sync/atomic"
	"time"
)

// ClientTimeouts counts the clients pgtender disconnected because a
// timeout ran out, since it started: Write, a client that took none of
// pgtender's output within client_write_timeout (session.write);
// IdleInTransaction, a client that held a transaction open and sent
// nothing for client_idle_in_transaction_timeout.
type ClientTimeouts struct {
	Write, IdleInTransaction uint64
}

// clientTimeoutCounters are the atomics behind ClientTimeouts.
type clientTimeoutCounters struct {
	write, idleInTransaction atomic.Uint64
}

// ClientTimeouts returns the client timeout counters now.
func (p *Pooler) ClientTimeouts() ClientTimeouts {
	return ClientTimeouts{
		Write:             p.clientTimeouts.write.Load(),
		IdleInTransaction: p.clientTimeouts.idleInTransaction.Load(),
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
func (s *session) watchIdleInTransactionLocked(now time.Time) {
	timeout := s.pooler.state.Load().cfg.General.ClientIdleInTransactionTimeout.Duration()
	if timeout > 0 && s.link.idleInTransaction() {
		s.idleTxDeadline = now.Add(timeout)
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
