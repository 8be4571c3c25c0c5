package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// TestAdmissionEndsStalledLoginsForNewClients: with a small bound on
// logins in progress and clients that connect and stall, holding every login
// slot, the stalled logins are ended with SQLSTATE 53300 once every slot has
// been held without a step for the stall wait, and new clients are served
// in their place rather than refused; the ended logins are counted as shed.
func TestAdmissionEndsStalledLoginsForNewClients(t *testing.T) {
	const slots, newClients = 4, 5
	metricsPort := freePort(t)
	pr := startProcessWith(t, processOptions{
		general: fmt.Sprintf("openmetrics_port = %d\nopenmetrics_host = \"127.0.0.1\"\nopenmetrics_namespace = %q\n"+
			"max_logins_in_progress = %d\nlogin_queue_target = 50\nworkers = 1", metricsPort, namespace, slots),
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

	for i := 0; i < newClients; i++ {
		start := time.Now()
		conn, err := pr.connect(ctx)
		if err != nil {
			t.Fatalf("client %d, with stalled logins holding every slot: %v; want it served", i, err)
		}
		conn.Close(ctx)
		t.Logf("client %d served after %v", i, time.Since(start))
	}
	for i, c := range stallers {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		reply, _ := io.ReadAll(c)
		if !strings.Contains(string(reply), "53300") || !strings.Contains(string(reply), "waiting for the client") {
			t.Errorf("staller %d read %q, want FATAL 53300 for a login waiting on its client", i, reply)
		}
	}

	var after map[string]*dto.MetricFamily
	eventually(t, 5*time.Second, "no login in flight", func() bool {
		after = scrape(t, url)
		return mustSample(t, after, namespace+"logins_in_flight", nil) == 0
	})
	v0, _ := sample(before, namespace+"logins_total", map[string]string{"result": "shed"})
	if shed := mustSample(t, after, namespace+"logins_total", map[string]string{"result": "shed"}) - v0; shed != slots {
		t.Errorf("logins_total{result=shed} moved by %v, want the %d stallers ended", shed, slots)
	}
	ok0, _ := sample(before, namespace+"logins_total", map[string]string{"result": "ok"})
	if served := mustSample(t, after, namespace+"logins_total", map[string]string{"result": "ok"}) - ok0; served != newClients {
		t.Errorf("logins_total{result=ok} moved by %v, want the %d new clients", served, newClients)
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
