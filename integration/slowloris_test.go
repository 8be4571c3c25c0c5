package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// TestSlowLorisLogins: clients that send their startup packet a byte at a
// time. Fewer of them than there are login slots each end at
// client_login_timeout with FATAL 08P01 and cost a goroutine while they
// last; more of them than there are slots do not keep other clients from
// logging in: the ones holding slots are ended with 53300 once every slot
// is held with no login taking a step, and their slots go to the others.
func TestSlowLorisLogins(t *testing.T) {
	const slots = 8
	t.Run("fewer than the slots", func(t *testing.T) {
		r := slowLorisRun(t, slots, slots/2)
		if r.timedOut != slots/2 || r.endedStalled != 0 {
			t.Errorf("%d slow clients ended at client_login_timeout and %d were ended for a stalled slot; want all %d at the timeout",
				r.timedOut, r.endedStalled, slots/2)
		}
		// Each costs pgtender its session's goroutine while it lasts
		// (and the pooled read buffer it reads into); nothing more is
		// started. The test's own goroutine per slow client is taken off.
		if perClient := float64(r.goroutinesDuring-r.goroutinesBefore-slots/2) / float64(slots/2); perClient > 1 {
			t.Errorf("%.2f of pgtender's goroutines per slow client, want at most 1", perClient)
		}
	})
	t.Run("more than the slots", func(t *testing.T) {
		r := slowLorisRun(t, slots, 3*slots)
		if r.endedStalled == 0 {
			t.Error("no slow client was ended for holding a stalled slot")
		}
		if r.refused > 0 || r.served == 0 {
			t.Errorf("while slow clients held the login slots, %d logins of other clients were refused (first: %v) and %d served; want none refused",
				r.refused, r.firstRefusal, r.served)
		}
	})
}

// slowLorisResult is what one slowLorisRun saw.
type slowLorisResult struct {
	timedOut, endedStalled             int // how the slow clients ended
	refusedAtAccept                    int // slow clients refused before their login began
	served, refused                    int // other clients' logins meanwhile
	firstRefusal                       error
	goroutinesBefore, goroutinesDuring int
}

// slowLorisRun starts a pooler with slots login slots, sends it slowClients
// connections that trickle their startup packets, logs other clients in
// one after the other meanwhile, and checks that every slow client got
// FATAL 08P01 at client_login_timeout or 53300 for a stalled slot, then a
// close.
func slowLorisRun(t *testing.T, slots, slowClients int) slowLorisResult {
	const (
		byteEvery  = 250 * time.Millisecond
		loginLimit = 3 * time.Second
	)
	tp := startPooler(t, poolerOptions{general: joinLines(
		"passthrough_auth = \"enabled_plain\"",
		"max_logins_in_progress = "+itoa(slots),
		"client_login_timeout = "+itoa(int(loginLimit/time.Millisecond)),
	)})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A first login verifies the password and fills the pool's parameters,
	// so later logins need nothing from Postgres.
	tp.connect(t, ctx).Close(ctx)

	var r slowLorisResult
	r.goroutinesBefore = runtime.NumGoroutine()
	packet := startupPacket(appUser, appDB)
	type ending struct {
		code, message string
		err           error
		after         time.Duration
	}
	endings := make(chan ending, slowClients)
	var started sync.WaitGroup
	for range slowClients {
		started.Add(1)
		go func() {
			conn, err := net.Dial("tcp", tp.addr)
			if err != nil {
				started.Done()
				endings <- ending{err: err}
				return
			}
			defer conn.Close()
			start := time.Now()
			// One byte at a time, never the whole packet: the loop is
			// bounded by the packet's length and by time, and pgtender
			// must end it first.
			for i := 0; i < len(packet)-1; i++ {
				if _, err := conn.Write(packet[i : i+1]); err != nil {
					break
				}
				if i == 0 {
					started.Done()
				}
				time.Sleep(byteEvery)
				if time.Since(start) > 2*loginLimit {
					break
				}
			}
			_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			msg, err := pgproto3.NewFrontend(conn, conn).Receive()
			e, ok := msg.(*pgproto3.ErrorResponse)
			if err != nil || !ok {
				endings <- ending{err: errors.Join(err, errors.New("no ErrorResponse")), after: time.Since(start)}
				return
			}
			_, err = conn.Read(make([]byte, 1))
			if !errors.Is(err, io.EOF) && !isReset(err) {
				endings <- ending{err: errors.New("still open after the error"), after: time.Since(start)}
				return
			}
			endings <- ending{code: e.Code, message: e.Message, after: time.Since(start)}
		}()
	}
	started.Wait()
	time.Sleep(byteEvery) // every slow client accepted has begun its login
	r.goroutinesDuring = runtime.NumGoroutine()

	// Other clients log in and query meanwhile, one after the other.
	deadline := time.Now().Add(loginLimit / 2)
	for time.Now().Before(deadline) && r.served+r.refused < 1000 {
		conn, err := tp.connectAs(ctx, appUser, appPassword, appDB)
		if err == nil {
			_, err = conn.Exec(ctx, "SELECT 1")
			conn.Close(ctx)
		}
		if err != nil {
			r.refused++
			if r.firstRefusal == nil {
				r.firstRefusal = err
			}
			continue
		}
		r.served++
	}

	for range slowClients {
		e := <-endings
		switch {
		case e.err != nil:
			t.Errorf("a slow client: %v after %v", e.err, e.after)
		case e.code == "08P01" && strings.Contains(e.message, "client_login_timeout"):
			r.timedOut++
		case e.code == "53300" && strings.Contains(e.message, "waiting for the client"):
			r.endedStalled++
		case e.code == "53300" && strings.Contains(e.message, "too many logins in progress"):
			// Still in the accept queue when every slot was stalled and
			// each login waiting on its client had just been ended: the
			// accept loop refuses until a login takes a step
			// (docs/admission.md). Rare; seen under -race on a busy machine.
			r.refusedAtAccept++
		default:
			t.Errorf("a slow client got %s %q after %v, want FATAL 08P01 at client_login_timeout or 53300 for a stalled slot", e.code, e.message, e.after)
		}
	}
	t.Logf("%d slow clients (a byte every %v, %d login slots): %d ended at client_login_timeout, %d ended for a stalled slot, %d refused at accept; "+
		"goroutines %d before, %d while they lasted (the test's own one per slow client included); %d other logins served meanwhile, %d refused",
		slowClients, byteEvery, slots, r.timedOut, r.endedStalled, r.refusedAtAccept, r.goroutinesBefore, r.goroutinesDuring, r.served, r.refused)
	return r
}

// startupPacket is a protocol 3.0 StartupMessage for user and database.
func startupPacket(user, database string) []byte {
	body := binary.BigEndian.AppendUint32(nil, 196608)
	for _, kv := range []string{"user", user, "database", database} {
		body = append(append(body, kv...), 0)
	}
	body = append(body, 0)
	return append(binary.BigEndian.AppendUint32(nil, uint32(4+len(body))), body...)
}
