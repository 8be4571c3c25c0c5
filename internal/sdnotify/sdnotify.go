// Package sdnotify tells systemd what state the service is in, for units of
// Type=notify: the few lines of sd_notify(3)'s protocol, with no library.
//
// The protocol (https://www.freedesktop.org/software/systemd/man/latest/sd_notify.html):
// systemd passes the path of a datagram socket in $NOTIFY_SOCKET; the
// service sends it newline-separated VAR=value assignments, one datagram per
// notification. A path beginning with '@' is in Linux's abstract namespace.
// Without $NOTIFY_SOCKET (not started by systemd, or a unit of another type)
// nothing is sent.
//
// What pgtender sends, and when (systemd.service(5), Type=notify and
// Type=notify-reload,
// https://www.freedesktop.org/software/systemd/man/latest/systemd.service.html):
//   - READY=1 once the listening sockets are open and the pooler serves,
//     so that units ordered after pgtender start when it can take clients;
//   - RELOADING=1 with MONOTONIC_USEC=<CLOCK_MONOTONIC in µs> when a reload
//     begins, and READY=1 when it is done (applied or refused: either way
//     the service runs on), so `systemctl reload` returns only then;
//   - STOPPING=1 when the drain begins; after it nothing else is sent, so a
//     reload during the drain does not tell systemd the service is ready.
package sdnotify

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// The notifications, as sd_notify(3) spells them.
const (
	Ready    = "READY=1"
	Stopping = "STOPPING=1"
)

// Reloading is the notification that a reload begins at monotonic, the
// CLOCK_MONOTONIC time: systemd.service(5) requires MONOTONIC_USEC with
// RELOADING=1 under Type=notify-reload, to tell this reload from an older
// one.
func Reloading(monotonic time.Duration) string {
	return fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d", monotonic.Microseconds())
}

// Monotonic reads CLOCK_MONOTONIC, the clock systemd compares
// MONOTONIC_USEC with (Go's time package keeps its monotonic reading
// private).
func Monotonic() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("clock_gettime(CLOCK_MONOTONIC): %w", err)
	}
	return time.Duration(ts.Nano()), nil
}

// Send sends one notification to the socket at socket (the value of
// $NOTIFY_SOCKET), bounded by ctx. Go's net package maps a leading '@' to
// the abstract namespace, as sd_notify(3) asks. A datagram socket whose
// receiver's queue is full blocks the sender, hence the deadline.
func Send(ctx context.Context, socket, state string) error {
	if socket == "" {
		return errors.New("no notify socket")
	}
	if socket[0] != '/' && socket[0] != '@' {
		// systemd also passes vsock: addresses to virtual machines; a
		// pooler does not run as a VM's init.
		return fmt.Errorf("NOTIFY_SOCKET %q: only absolute paths and abstract ('@') sockets are supported", socket)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unixgram", socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		if err := conn.SetWriteDeadline(deadline); err != nil {
			return err
		}
	}
	_, err = conn.Write([]byte(state))
	return err
}

// sendTimeout bounds one notification: systemd reads its socket at once,
// and a service must not hang on a manager that does not.
const sendTimeout = 2 * time.Second

// Notifier sends pgtender's state changes to systemd. Its methods are safe
// for concurrent use, do nothing without a socket, and never fail the
// caller: the first failure to send is logged, later ones are not (a unit
// of the wrong type, or a socket gone, fails every time).
type Notifier struct {
	socket string
	log    *zap.Logger

	mu       sync.Mutex // serialises notifications, so they arrive in order
	stopping bool       // STOPPING=1 was sent; nothing follows it
	failed   bool       // a failure has been logged
}

// New returns a Notifier for socket, the value of $NOTIFY_SOCKET ("" sends
// nothing), logging its first failure to log.
func New(socket string, log *zap.Logger) *Notifier {
	return &Notifier{socket: socket, log: log}
}

// Enabled reports whether there is a socket to notify.
func (n *Notifier) Enabled() bool { return n.socket != "" }

// Ready sends READY=1: startup is complete, or a reload is.
func (n *Notifier) Ready() { n.notify(Ready, false) }

// Reloading sends RELOADING=1 with the current monotonic time; the caller
// sends Ready when the reload is done.
func (n *Notifier) Reloading() {
	if !n.Enabled() {
		return
	}
	now, err := Monotonic()
	if err != nil {
		n.fail(err)
		return
	}
	n.notify(Reloading(now), false)
}

// Stopping sends STOPPING=1; later notifications are dropped, since the
// service no longer becomes ready.
func (n *Notifier) Stopping() { n.notify(Stopping, true) }

// notify sends state unless STOPPING=1 was sent; last marks state as the
// final notification.
func (n *Notifier) notify(state string, last bool) {
	if !n.Enabled() {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopping {
		return
	}
	n.stopping = last
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	if err := Send(ctx, n.socket, state); err != nil {
		n.failLocked(err)
	}
}

func (n *Notifier) fail(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.failLocked(err)
}

func (n *Notifier) failLocked(err error) {
	if n.failed {
		return
	}
	n.failed = true
	n.log.Warn("cannot notify systemd (NOTIFY_SOCKET); pgtender runs on, later failures are not logged",
		zap.String("notify_socket", n.socket), zap.Error(err))
}
