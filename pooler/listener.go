package pooler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Accept errors back off from acceptBackoffMin doubling to acceptBackoffMax,
// as net/http does, so a persistent error (EMFILE) cannot spin a core.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// listenWorkers opens one listening socket per worker on host:port, each
// with SO_REUSEPORT so the kernel spreads new connections across them, and
// each with the configured listen backlog. It returns the sockets and the
// effective backlog (the kernel caps it at net.core.somaxconn).
func listenWorkers(host string, port, workers, backlog int) ([]*net.TCPListener, int, error) {
	listenConfig := net.ListenConfig{
		// TCP keepalive is set once on the listening socket, which every
		// accepted socket inherits, rather than by Go on each accepted
		// connection: that was four setsockopt calls per login.
		KeepAlive: -1,
		Control: func(network, address string, raw syscall.RawConn) error {
			var sockErr error
			err := raw.Control(func(fd uintptr) {
				sockErr = setListenerOptions(int(fd))
			})
			if err != nil {
				return err
			}
			return sockErr
		},
	}
	var listeners []*net.TCPListener
	closeAll := func() {
		for _, l := range listeners {
			l.Close()
		}
	}
	address := net.JoinHostPort(host, strconv.Itoa(port))
	if port != 0 {
		if err := portFree(address); err != nil {
			return nil, 0, err
		}
	}
	for i := 0; i < workers; i++ {
		l, err := listenConfig.Listen(context.Background(), "tcp", address)
		if err != nil {
			closeAll()
			return nil, 0, fmt.Errorf("listen on %s: %w", address, err)
		}
		tcpListener := l.(*net.TCPListener)
		// Go listens with net.core.somaxconn; calling listen(2) again on a
		// listening socket sets the backlog the operator asked for.
		if err := setBacklog(tcpListener, backlog); err != nil {
			l.Close()
			closeAll()
			return nil, 0, err
		}
		listeners = append(listeners, tcpListener)
		if port == 0 {
			// Port 0 picks a free port once; the other workers share it.
			address = tcpListener.Addr().String()
		}
	}
	effective := backlog
	if somaxconn, err := readSomaxconn(); err == nil && somaxconn < backlog {
		effective = somaxconn
	}
	return listeners, effective, nil
}

// portFree fails when another socket listens on address. The workers'
// sockets share the port with SO_REUSEPORT, which the kernel grants to any
// socket of the same user that asks for it: a second pgtender started by
// mistake (a unit and a shell, two units) would share the port without an
// error, and the kernel would spread logins across both, each with its own
// pools. A socket bound without SO_REUSEPORT is refused with EADDRINUSE
// while any other listens there (socket(7), SO_REUSEPORT), so one is opened
// and closed first. Two pgtenders starting in the same instant may both pass
// the check before either listens; that window is what is left.
func portFree(address string) error {
	probe, err := net.Listen("tcp", address)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("listen on %s: another process (another pgtender?) already listens there: %w", address, err)
		}
		return fmt.Errorf("listen on %s: %w", address, err)
	}
	return probe.Close()
}

// Keepalive settings inherited by accepted connections: the values Go
// applies to accepted connections by default (probe after 15 s idle, every
// 15 s, 9 probes), so a client whose host vanished is noticed in about
// 2.5 minutes.
const (
	keepAliveIdleSeconds     = 15
	keepAliveIntervalSeconds = 15
	keepAliveProbes          = 9
)

// setListenerOptions sets SO_REUSEPORT and the keepalive options on a
// listening socket before it listens.
func setListenerOptions(fd int) error {
	for _, option := range []struct {
		level, name, value int
		what               string
	}{
		{unix.SOL_SOCKET, unix.SO_REUSEPORT, 1, "SO_REUSEPORT"},
		{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1, "SO_KEEPALIVE"},
		{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, keepAliveIdleSeconds, "TCP_KEEPIDLE"},
		{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, keepAliveIntervalSeconds, "TCP_KEEPINTVL"},
		{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, keepAliveProbes, "TCP_KEEPCNT"},
	} {
		if err := unix.SetsockoptInt(fd, option.level, option.name, option.value); err != nil {
			return fmt.Errorf("setsockopt %s: %w", option.what, err)
		}
	}
	return nil
}

func setBacklog(l *net.TCPListener, backlog int) error {
	raw, err := l.SyscallConn()
	if err != nil {
		return err
	}
	var listenErr error
	if err := raw.Control(func(fd uintptr) { listenErr = unix.Listen(int(fd), backlog) }); err != nil {
		return err
	}
	if listenErr != nil {
		return fmt.Errorf("listen(2) with backlog %d: %w", backlog, listenErr)
	}
	return nil
}

func readSomaxconn() (int, error) {
	data, err := os.ReadFile("/proc/sys/net/core/somaxconn")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(data)))
}

// acceptLoop accepts connections on one worker's socket and starts a
// session goroutine for each, under login admission control (admission.go).
// It never waits on a client.
func (p *Pooler) acceptLoop(l *net.TCPListener, worker int) {
	defer p.wg.Done()
	backoff := time.Duration(0)
	admission := newAdmissionPolicy(p.loginSlots)
	admission.endStalled = p.endStalledLogins
	queueAges := newQueueAgeReader()
	for {
		general := p.state.Load().cfg.General
		wasShedding := admission.shedding
		haveSlot := admission.beforeAccept(general.LoginQueueTarget.Duration(), p.done)
		if admission.shedding && !wasShedding {
			// Once per stall, not per refusal (those are sampled).
			p.log.Info("login slots stalled: refusing new logins until one takes a step",
				zap.Int("worker", worker), zap.Int("logins_in_progress", len(p.loginSlots.held)),
				zap.Duration("stall_wait", admission.stallWait))
		}
		if !haveSlot && p.draining.Load() {
			return
		}
		conn, err := l.AcceptTCP()
		if err != nil {
			if haveSlot {
				p.loginSlots.unused()
			}
			if p.draining.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			if backoff == 0 {
				backoff = acceptBackoffMin
			} else {
				backoff = min(2*backoff, acceptBackoffMax)
			}
			p.log.Warn("accept failed; backing off", zap.Int("worker", worker), zap.Duration("backoff", backoff), zap.Error(err))
			select {
			case <-time.After(backoff):
			case <-p.done:
				return
			}
			continue
		}
		backoff = 0
		var age time.Duration
		ageKnown := false
		maxAge := general.LoginQueueMaxAge.Duration()
		if maxAge > 0 {
			age, ageKnown = queueAges.age(conn)
			if ageKnown {
				p.loginSlots.noteQueueWait(age)
			}
		}
		switch admission.afterAccept(haveSlot, age, ageKnown, maxAge) {
		case shedNoSlot:
			p.wg.Add(1)
			go p.shed(conn, ShedNoLoginSlot, age, ageKnown)
		case shedQueueAge:
			p.wg.Add(1)
			go p.shed(conn, ShedQueueAge, age, ageKnown)
		default:
			p.wg.Add(1)
			go p.serveConn(conn)
		}
	}
}
