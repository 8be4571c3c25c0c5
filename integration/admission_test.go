package integration

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// TestAdmissionShedsWhenStalledLoginsHoldEverySlot: with a small bound on
// logins in progress and clients that connect and stall, holding every login
// slot, a new client is refused quickly with SQLSTATE 53300 rather than left
// waiting in the accept queue; once the stallers leave, logins succeed again;
// and the refusals are counted as shed logins.
func TestAdmissionShedsWhenStalledLoginsHoldEverySlot(t *testing.T) {
	const slots, refusedClients = 4, 5
	metricsPort := freePort(t)
	pr := startProcessWith(t, processOptions{
		general: fmt.Sprintf("openmetrics_port = %d\nopenmetrics_host = \"127.0.0.1\"\nopenmetrics_namespace = %q\n"+
			"max_logins_in_progress = %d\nlogin_queue_target = 50\nworkers = 1\n"+
			// A queue target of 450 ms: the first refused client, which waits
			// in the accept queue while the stall is detected (the ceiling,
			// 400 ms, at the start of a burst), makes the queue late.
			"login_queue_max_age = 600", metricsPort, namespace, slots),
	})
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	before := scrape(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The stallers: each completes the TCP handshake and sends a byte of
	// a startup packet, then nothing, holding a login slot.
	var stallers []net.Conn
	for i := 0; i < slots; i++ {
		conn, err := net.Dial("tcp", pr.addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write([]byte{0})
		stallers = append(stallers, conn)
	}
	defer func() {
		for _, c := range stallers {
			c.Close()
		}
	}()
	eventually(t, 10*time.Second, "the stallers to hold every slot", func() bool {
		return mustSample(t, scrape(t, url), namespace+"logins_in_flight", nil) == slots
	})

	for i := 0; i < refusedClients; i++ {
		start := time.Now()
		_, err := pr.connect(ctx)
		elapsed := time.Since(start)
		if sqlState(err) != "53300" {
			t.Fatalf("client %d with every slot held: got %v, want SQLSTATE 53300", i, err)
		}
		t.Logf("client %d refused with 53300 after %v: %v", i, elapsed, err)
		if elapsed > 2*time.Second {
			t.Errorf("client %d waited %v for its refusal; the point is to refuse quickly", i, elapsed)
		}
	}

	// Nothing can be served on time while the slots are stalled, and the
	// first refused client waited in the queue longer than half its target:
	// the accept queue shrinks, a quarter a tick, to its floor (16).
	capacity := func() float64 {
		return mustSample(t, scrape(t, url), namespace+"listen_queue_capacity", map[string]string{"worker": "0"})
	}
	configured := mustSample(t, before, namespace+"listen_queue_capacity", map[string]string{"worker": "0"})
	eventually(t, 10*time.Second, "the accept queue to shrink during the stall", func() bool { return capacity() == 16 })

	for _, c := range stallers {
		c.Close()
	}
	stallers = nil
	eventually(t, 10*time.Second, "logins to succeed again once the stallers left", func() bool {
		conn, err := pr.connect(ctx)
		if err != nil {
			return false
		}
		conn.Close(ctx)
		return true
	})
	// No login waits for a slot any more: the queue is listen_backlog again.
	eventually(t, 10*time.Second, "the accept queue to grow back to listen_backlog", func() bool { return capacity() == configured })
	t.Logf("listen_queue_capacity: %v before the stall, 16 during it, %v after", configured, capacity())

	var after map[string]*dto.MetricFamily
	eventually(t, 5*time.Second, "no login in flight", func() bool {
		after = scrape(t, url)
		return mustSample(t, after, namespace+"logins_in_flight", nil) == 0
	})
	v0, _ := sample(before, namespace+"logins_total", map[string]string{"result": "shed"})
	shed := mustSample(t, after, namespace+"logins_total", map[string]string{"result": "shed"}) - v0
	if shed < refusedClients {
		t.Errorf("logins_total{result=shed} moved by %v, want at least the %d refusals the clients saw", shed, refusedClients)
	}
	// The stallers sent a byte each and left: abandoned in the startup stage.
	a0, _ := sample(before, namespace+"logins_abandoned_total", map[string]string{"stage": "startup"})
	if got := mustSample(t, after, namespace+"logins_abandoned_total", map[string]string{"stage": "startup"}) - a0; got != slots {
		t.Errorf("logins_abandoned_total{stage=startup} moved by %v, want the %d stallers", got, slots)
	}
}

// TestAdmissionShedsConnectionsThatWaitedTooLong: connections that sat in
// the kernel's accept queue longer than login_queue_max_age (the pooler was
// stopped) are refused with 53300 when accepted, not served late.
func TestAdmissionShedsConnectionsThatWaitedTooLong(t *testing.T) {
	const clients = 3
	pr := startProcessWith(t, processOptions{general: "login_queue_max_age = 300\nworkers = 1"})
	pr.stop(t)
	results := make(chan error, clients)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < clients; i++ {
		go func() {
			conn, err := pr.connect(ctx)
			if err == nil {
				conn.Close(ctx)
			}
			results <- err
		}()
	}
	// Once all of them are in the accept queue, let them age past
	// login_queue_max_age. (The sleep makes the condition; nothing is
	// asserted about its length.)
	_, port := splitAddr(t, pr.addr)
	eventually(t, 10*time.Second, "the clients to wait in the accept queue", func() bool {
		out, err := exec.Command("ss", "-ltnH", "sport = :"+port).Output()
		if err != nil {
			return false
		}
		fields := strings.Fields(string(out))
		return len(fields) > 1 && fields[1] == fmt.Sprint(clients)
	})
	time.Sleep(time.Second)
	if err := pr.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < clients; i++ {
		if err := <-results; sqlState(err) != "53300" {
			t.Errorf("a connection that waited 1 s in the accept queue: got %v, want SQLSTATE 53300", err)
		}
	}
	// A fresh connection is served.
	conn, err := pr.connect(ctx)
	if err != nil {
		t.Fatalf("a fresh connection after the stale ones: %v", err)
	}
	conn.Close(ctx)
	if !strings.Contains(pr.output.String(), `"reason":"queue_age"`) {
		t.Errorf("no refusal logged with reason queue_age:\n%s", pr.output.String())
	}
}
