package pooler

import (
	"errors"
	"io"
	"time"

	"go.uber.org/zap"

	"github.com/pgtender/pgtender/pooler/wire"
)

// Logins that hold a login slot while waiting on a stalled client.
//
// A login holds its slot (admission.go) from accept to ReadyForQuery, most
// of that time waiting for the client's next packet. A client that stalls
// mid-login, or sends its startup packet a byte at a time (a slow-loris),
// would hold its slot until client_login_timeout, and as many such clients
// as there are slots would keep every other client out for that long:
// PgBouncer, one event loop without slots, has no such limit to exhaust.
// So the login marks the time it began waiting on its client (loginReader),
// and when the accept loops find every slot held with no login taking a
// step for the stall wait, the logins that waited on their clients all
// that while are ended (endStalledLogins) in favour of the connections in
// the accept queue, instead of those being refused.

// loginReader reads a logging-in client's bytes for the session's
// wire.Reader, marking the session as waiting on its client from the first
// read after the login's last step (a whole startup packet read, the
// password exchange done) or wait on Postgres: a client that trickles a
// packet's bytes is waiting all along, though each read returns.
type loginReader struct {
	s *session
	r io.Reader
}

func (l *loginReader) Read(b []byte) (int, error) {
	l.s.clientWaitBegin()
	return l.r.Read(b)
}

// clientWaitBegin marks the login as waiting on its client, unless it is
// already; clientWaitEnd, at the login's steps and waits on Postgres, ends
// the mark.
func (s *session) clientWaitBegin() {
	if s.clientWaitSince.Load() == 0 {
		s.clientWaitSince.Store(int64(s.pooler.loginSlots.clock()) + 1)
	}
}

func (s *session) clientWaitEnd() { s.clientWaitSince.Store(0) }

// endingStalled is clientWaitSince once endStalledLogins has decided to end
// the login: not 0, so clientWaitBegin leaves it, and below any clock
// reading, so it is never taken for a wait.
const endingStalled = -1

// endStalledLogins ends the logins that have been waiting on their clients
// for at least waitedAtLeast, by putting their sockets' read deadline in
// the past, and returns how many. The accept loops call it when every slot
// is held and no login took a step for the stall wait; it walks every
// session, which is rare enough (once per stall) to cost nothing in the
// common case.
func (p *Pooler) endStalledLogins(waitedAtLeast time.Duration) int {
	now := int64(p.loginSlots.clock())
	ended := 0
	for _, s := range p.sessionList() {
		if state := clientState(s.state.Load()); state != stateStartup && state != stateAuth {
			continue // logged in, or past the stages that wait on the client
		}
		since := s.clientWaitSince.Load()
		if since <= 0 || time.Duration(now-(since-1)) < waitedAtLeast {
			continue
		}
		// Decided only if the login has not taken a step since the load:
		// a step (clientWaitEnd) clears the mark, and then the swap fails.
		if !s.clientWaitSince.CompareAndSwap(since, endingStalled) {
			continue
		}
		s.endedStalled.Store(true)
		_ = s.tcp.SetReadDeadline(time.Now())
		ended++
	}
	if ended > 0 {
		// Once per stall, as the shedding's line; the logins' own lines
		// are sampled.
		p.log.Info("login slots stalled: ending the logins waiting on their clients, for the connections in the accept queue",
			zap.Int("ended", ended), zap.Int("logins_in_progress", len(p.loginSlots.held)), zap.Duration("stall_wait", waitedAtLeast))
	}
	return ended
}

// endedStalledMessage is what a login ended by endStalledLogins reads.
const endedStalledMessage = "pgtender is overloaded: every login slot was taken and this login was waiting for the client; retry"

// loginEndedStalled ends a login that endStalledLogins ended: the client is
// told, and the login is counted as shed.
func (s *session) loginEndedStalled(timings LoginTimings, stage LoginStage) error {
	s.pooler.recorder.LoginFinished(LoginShed, timings)
	s.pooler.shedCounts.add(ShedSlowClient)
	s.sendError(wire.SeverityFatal, sqlstateTooManyConnections, endedStalledMessage)
	s.logEndedStalled(stage)
	return errEndedStalled
}

// logEndedStalled logs a login endStalledLogins ended, sampled as every
// refusal under overload is.
func (s *session) logEndedStalled(stage LoginStage) {
	if logged := s.pooler.log.Check(zap.InfoLevel, "login refused: overloaded"); logged != nil {
		logged.Write(zap.String("reason", string(ShedSlowClient)), zap.String("stage", string(stage)),
			zap.String("remote", s.tcp.RemoteAddr().String()))
	}
}

// errEndedStalled is the end of a login that endStalledLogins ended.
var errEndedStalled = errors.New("login ended: it waited on its client while every login slot was taken")
