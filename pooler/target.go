package pooler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/pgtender/pgtender/auth"
)

// While a server is down, new server connections to it are not attempted:
// they fail at once, and one connect at a time (a probe) is let through,
// the first minServerRetry after the failure that found the server down,
// then at intervals doubling up to maxServerRetry. Each interval is drawn
// from its upper half, so that pgtender processes that saw the same
// failure do not probe in step. The ceiling is short because a probe costs
// Postgres one connection attempt while clients wait for the answer:
// clients are served again within about maxServerRetry of Postgres
// accepting connections, at the price of a few connects a second while it
// is down. PgBouncer's server_login_retry (15 s by default) is the same
// idea with a single fixed interval; see docs/RELIABILITY.md.
const (
	minServerRetry = 10 * time.Millisecond
	maxServerRetry = 100 * time.Millisecond
)

// targetState is what pgtender believes about a server.
type targetState uint8

const (
	// targetUp: connects are attempted.
	targetUp targetState = iota
	// targetDown: the last connect found the server unreachable; only
	// probes are attempted.
	targetDown
)

// connectOutcome classifies how a connect to a server ended, for the
// target's state (classifyConnect).
type connectOutcome uint8

const (
	// connectOK: a server connection was opened.
	connectOK connectOutcome = iota
	// connectRefused: the server answered and refused (credentials, an
	// unknown database, too many connections, a certificate pgtender does
	// not trust): it is up.
	connectRefused
	// connectUnreachable: no answer within connect_timeout, the connection
	// was refused or broke, or Postgres said it cannot accept connections
	// now (starting up, shutting down, in recovery).
	connectUnreachable
	// connectAbandoned: the connect did not run to its end (shutdown, its
	// caller gave up waiting for a connect slot, a panic): nothing was
	// learned.
	connectAbandoned
)

// targetTransition is a change of a target's state that is worth a log
// line.
type targetTransition uint8

const (
	targetUnchanged targetTransition = iota
	targetWentDown
	targetCameBack
)

// serverTarget is what pgtender knows about one Postgres server (a host
// and port), shared by every pool and passthrough check that connects to
// it. Its state decides whether a connect is attempted (admit); the
// outcome of each attempt updates it (record). Methods take the time so
// that the rules are tested without sockets or sleeps.
type serverTarget struct {
	address string

	mu        sync.Mutex
	state     targetState
	probing   bool          // a probe is in flight
	retry     time.Duration // the current backoff interval while down
	nextProbe time.Time     // while down: no probe before this
	downSince time.Time
	probes    int    // probes since the server went down
	code      string // while down: the SQLSTATE clients get
	cause     error  // while down: the failure that found it down, for the log

	// prober is the pool whose connect found the server down: while no
	// client asks for a connection, the maintenance loop probes with it
	// (Pooler.probeDownServers), so that the server is seen back, and
	// server_reachable says so, without traffic.
	prober *Pool

	// plaintextUntil (Unix nanoseconds) records that under tls_verify =
	// "prefer" the server answered an SSLRequest with 'N', so that until
	// then connects skip the TLS attempt (a second dial per connection).
	// Only that answer is remembered: a TLS attempt that failed otherwise
	// (a hostssl rule, too many connections) says nothing about the next
	// one. Forgotten when the server goes down, and after plaintextMemory,
	// since Postgres can turn ssl on with a reload.
	plaintextUntil atomic.Int64

	stats targetStats
}

// targetStats count connects to a server by their outcome.
type targetStats struct {
	ok, refused, unreachable, abandoned atomic.Uint64
	// notAttempted: connects failed at once because the server was down.
	notAttempted atomic.Uint64
}

// serverDownError is the error of a connect that was not attempted because
// the server is down. The password it carried was not sent.
type serverDownError struct {
	address string
	code    string // sqlstateConnectionFailure, or sqlstateCannotConnectNow when Postgres said so
	since   time.Time
	cause   error
}

func (e *serverDownError) Error() string {
	return fmt.Sprintf("%s not attempted: the server has been unreachable for %s (%v)",
		e.address, time.Since(e.since).Round(time.Millisecond), e.cause)
}

// Unwrap makes the error an auth.ErrPasswordNotSent, so that a passthrough
// verification that could not be attempted is not counted as a failed one.
func (e *serverDownError) Unwrap() []error { return []error{auth.ErrPasswordNotSent, e.cause} }

// serverDownMessage is what a client of pool is told while its server is
// down, code being what it is told with.
func serverDownMessage(code string, pool poolKey) string {
	if code == sqlstateCannotConnectNow {
		return fmt.Sprintf("the database server for pool %s is not accepting connections (starting up or shutting down); pgtender is retrying", pool)
	}
	return fmt.Sprintf("the database server for pool %s is unreachable; pgtender is retrying", pool)
}

// admit decides whether a connect may be attempted now. While the server is
// down, the first caller after nextProbe becomes the probe (probe = true)
// and every other caller gets a *serverDownError at once. A caller that
// was admitted must report the outcome with record.
func (t *serverTarget) admit(now time.Time) (probe bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state == targetUp {
		return false, nil
	}
	if !t.probing && !now.Before(t.nextProbe) {
		t.probing = true
		t.probes++
		return true, nil
	}
	t.stats.notAttempted.Add(1)
	return false, &serverDownError{address: t.address, code: t.code, since: t.downSince, cause: t.cause}
}

// record takes the outcome of a connect that admit let through, and says
// whether the server went down or came back with it. code is the SQLSTATE
// clients get while the server is down, for connectUnreachable.
func (t *serverTarget) record(now time.Time, probe bool, outcome connectOutcome, code string, cause error) targetTransition {
	t.count(outcome)
	t.mu.Lock()
	defer t.mu.Unlock()
	if probe {
		t.probing = false
	}
	switch outcome {
	case connectOK, connectRefused:
		if t.state == targetDown {
			t.state = targetUp
			return targetCameBack
		}
	case connectUnreachable:
		if t.state == targetUp {
			t.state = targetDown
			t.downSince = now
			t.probes = 0
			t.retry = minServerRetry
			t.code, t.cause = code, cause
			t.nextProbe = now.Add(jittered(t.retry))
			t.plaintextUntil.Store(0)
			return targetWentDown
		}
		if probe {
			// Connects already in flight when the server went down fail
			// too; only a failed probe lengthens the interval.
			t.retry = min(2*t.retry, maxServerRetry)
			t.code, t.cause = code, cause
			t.nextProbe = now.Add(jittered(t.retry))
		}
	case connectAbandoned:
		// Nothing learned; the next caller probes.
	}
	return targetUnchanged
}

func (t *serverTarget) count(outcome connectOutcome) {
	switch outcome {
	case connectOK:
		t.stats.ok.Add(1)
	case connectRefused:
		t.stats.refused.Add(1)
	case connectUnreachable:
		t.stats.unreachable.Add(1)
	case connectAbandoned:
		t.stats.abandoned.Add(1)
	}
}

// downFor reports how long the server was down and how many probes it
// took, for the line logged when it comes back. t.mu must not be held.
func (t *serverTarget) downFor(now time.Time) (time.Duration, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return now.Sub(t.downSince), t.probes
}

// probeWith records the pool to probe the server with while it is down.
func (t *serverTarget) probeWith(pool *Pool) {
	t.mu.Lock()
	t.prober = pool
	t.mu.Unlock()
}

// backgroundProbe returns the pool to probe the down server with now, or
// nil when the server is up, a probe is in flight or not yet due.
func (t *serverTarget) backgroundProbe(now time.Time) *Pool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state != targetDown || t.probing || now.Before(t.nextProbe) {
		return nil
	}
	return t.prober
}

// plaintextMemory is how long a server's refusal of TLS is remembered.
const plaintextMemory = time.Minute

// plaintextOnly reports whether a connect under tls_verify = "prefer" may
// skip the TLS attempt.
func (t *serverTarget) plaintextOnly(now time.Time) bool {
	return now.UnixNano() < t.plaintextUntil.Load()
}

// rememberPlaintext records that the server refused TLS.
func (t *serverTarget) rememberPlaintext(now time.Time) {
	t.plaintextUntil.Store(now.Add(plaintextMemory).UnixNano())
}

// serverDown reports whether err, from a connect, shows the server down:
// the connect found it unreachable, or was not attempted because it was
// known to be (*serverDownError).
func serverDown(err error) bool {
	if _, ok := errors.AsType[*serverDownError](err); ok {
		return true
	}
	outcome, _ := classifyConnect(err, false)
	return outcome == connectUnreachable
}

// jittered returns a duration in [d/2, d).
func jittered(d time.Duration) time.Duration {
	half := d / 2
	return half + rand.N(d-half)
}

// classifyConnect says what a connect's error shows about the server, and
// the SQLSTATE clients get while it is down. shuttingDown is whether
// pgtender's own context had ended: then a failure says nothing about the
// server. A connect is not ended by the client it was for (openServer), so
// a deadline is connect_timeout's: the server did not answer. Only a
// failure of the network (no answer, refused, reset, closed mid-login) or
// Postgres saying it cannot take connections now counts as unreachable;
// any other answer, a refused password or TLS that does not verify, shows
// a server that is up.
func classifyConnect(err error, shuttingDown bool) (connectOutcome, string) {
	if err == nil {
		return connectOK, ""
	}
	if shuttingDown {
		return connectAbandoned, ""
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		switch pgErr.Code {
		case sqlstateAdminShutdown, sqlstateCrashShutdown, sqlstateCannotConnectNow:
			return connectUnreachable, sqlstateCannotConnectNow
		}
		return connectRefused, ""
	}
	if opErr, ok := errors.AsType[*net.OpError](err); ok && opErr.Op == "remote error" {
		return connectRefused, "" // a TLS alert: the server answered
	}
	if _, ok := errors.AsType[net.Error](err); ok ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return connectUnreachable, sqlstateConnectionFailure
	}
	return connectRefused, ""
}

// ServerTarget is what pgtender knows about one Postgres server, for
// metrics and the admin console.
type ServerTarget struct {
	Address   string
	Reachable bool
	// Connects by outcome: opened (OK), answered and refused (Refused),
	// no answer or "cannot connect now" (Unreachable), not run to its end
	// (Abandoned: shutdown, or no connect slot in the caller's time), and
	// failed at once because the server was down (NotAttempted).
	OK, Refused, Unreachable, Abandoned, NotAttempted uint64
}

// ServerTargets returns every server pgtender has connected to, in no
// particular order.
func (p *Pooler) ServerTargets() []ServerTarget {
	p.targetsMu.Lock()
	targets := slices.Collect(maps.Values(p.targets))
	p.targetsMu.Unlock()
	out := make([]ServerTarget, 0, len(targets))
	for _, t := range targets {
		t.mu.Lock()
		reachable := t.state == targetUp
		t.mu.Unlock()
		out = append(out, ServerTarget{
			Address: t.address, Reachable: reachable,
			OK: t.stats.ok.Load(), Refused: t.stats.refused.Load(), Unreachable: t.stats.unreachable.Load(),
			Abandoned: t.stats.abandoned.Load(), NotAttempted: t.stats.notAttempted.Load(),
		})
	}
	return out
}

// target returns the state of the server at host:port, creating it.
func (p *Pooler) target(host string, port int) *serverTarget {
	address := net.JoinHostPort(host, strconv.Itoa(port))
	p.targetsMu.Lock()
	defer p.targetsMu.Unlock()
	t, ok := p.targets[address]
	if !ok {
		t = &serverTarget{address: address}
		p.targets[address] = t
	}
	return t
}

// probeDownServers starts a probe of each down server that no client has
// probed lately. A probe that opens a connection gives it to the pool.
func (p *Pooler) probeDownServers(now time.Time) {
	p.targetsMu.Lock()
	var due []*Pool
	for _, t := range p.targets {
		if pool := t.backgroundProbe(now); pool != nil {
			due = append(due, pool)
		}
	}
	p.targetsMu.Unlock()
	for _, pool := range due {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			_ = pool.openIdle(p.ctx, pool.settings.Load().size) // bounded by connect_timeout (openServer); the target records the outcome
		}()
	}
}

// logTransition says when a server went down or came back.
func (p *Pooler) logTransition(t *serverTarget, transition targetTransition, cause error) {
	switch transition {
	case targetWentDown:
		if p.draining.Load() {
			return
		}
		p.log.Warn("database server unreachable: new server connections fail at once while one probe at a time checks it",
			zap.String("server", t.address), zap.Error(cause))
	case targetCameBack:
		downFor, probes := t.downFor(time.Now())
		p.log.Info("database server reachable again",
			zap.String("server", t.address), zap.Duration("down_for", downFor), zap.Int("probes", probes))
	}
}
