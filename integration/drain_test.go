package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestDrainUnderLoad: SIGTERM while clients run transactions back to back,
// with shutdown_readiness_delay. /readyz fails first while logins are still
// served; then the listeners close. Every transaction that began (its BEGIN
// answered) commits, none is cut mid-flight; a client's next transaction
// is refused at its start (57P01, or the connection closed); the process
// exits 0 within shutdown_timeout; and the table holds exactly the rows of
// the transactions that reported a commit.
func TestDrainUnderLoad(t *testing.T) {
	const (
		workers        = 16
		readinessDelay = 1500 * time.Millisecond
	)
	healthPort := freePort(t)
	pr := startProcessWith(t, processOptions{
		general: fmt.Sprintf("shutdown_timeout = 15000\nshutdown_readiness_delay = %d\nhealthcheck_port = %d",
			readinessDelay/time.Millisecond, healthPort),
		pool: "pool_size = 4",
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := direct(t, ctx)
	if _, err := admin.Exec(ctx, "DROP TABLE IF EXISTS drain_load; CREATE TABLE drain_load (worker int, seq int); GRANT ALL ON drain_load TO "+appUser); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP TABLE IF EXISTS drain_load") })

	readyz := fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort)
	eventually(t, 10*time.Second, "/readyz to answer 200", func() bool { return httpStatus(readyz) == http.StatusOK })

	var (
		committed, refusedAtStart, cutMidFlight atomic.Int64
		mu                                      sync.Mutex
		rows                                    = map[string]bool{}
		cuts                                    []string
		wg                                      sync.WaitGroup
	)
	stop := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var conn *pgx.Conn
			defer func() {
				if conn != nil {
					conn.Close(context.Background())
				}
			}()
			for seq := 0; seq < 100_000; seq++ {
				select {
				case <-stop:
					return
				default:
				}
				if conn == nil {
					var err error
					if conn, err = pr.connect(ctx); err != nil {
						refusedAtStart.Add(1)
						time.Sleep(10 * time.Millisecond)
						continue
					}
				}
				if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
					// Refused at its start: the session was ended between
					// transactions.
					refusedAtStart.Add(1)
					conn.Close(context.Background())
					conn = nil
					continue
				}
				err := func() error {
					if _, err := conn.Exec(ctx, "INSERT INTO drain_load VALUES ($1, $2)", w, seq); err != nil {
						return err
					}
					if _, err := conn.Exec(ctx, "SELECT pg_sleep(0.02)"); err != nil {
						return err
					}
					_, err := conn.Exec(ctx, "COMMIT")
					return err
				}()
				if err != nil {
					cutMidFlight.Add(1)
					mu.Lock()
					cuts = append(cuts, fmt.Sprintf("worker %d transaction %d: %v", w, seq, err))
					mu.Unlock()
					conn.Close(context.Background())
					conn = nil
					continue
				}
				committed.Add(1)
				mu.Lock()
				rows[fmt.Sprintf("%d/%d", w, seq)] = true
				mu.Unlock()
			}
		}()
	}
	eventually(t, 20*time.Second, "transactions to flow", func() bool { return committed.Load() > 100 })

	signaled := time.Now()
	if err := pr.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Readiness fails first, while new logins are still served.
	eventually(t, readinessDelay/2, "/readyz to fail after SIGTERM", func() bool { return httpStatus(readyz) == http.StatusServiceUnavailable })
	unreadyAfter := time.Since(signaled)
	servedWhileUnready := 0
	for time.Since(signaled) < readinessDelay*2/3 {
		conn, err := pr.connect(ctx)
		if err != nil {
			t.Fatalf("a login %v after SIGTERM, within shutdown_readiness_delay: %v; want it served", time.Since(signaled), err)
		}
		if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("a query %v after SIGTERM, within shutdown_readiness_delay: %v", time.Since(signaled), err)
		}
		conn.Close(ctx)
		servedWhileUnready++
	}
	// Then the listeners close.
	eventually(t, 2*readinessDelay, "new connections to be refused", func() bool {
		conn, err := pr.connect(ctx)
		if err == nil {
			conn.Close(ctx)
		}
		return err != nil
	})
	refusedAfter := time.Since(signaled)
	code := pr.waitExit(t, 20*time.Second)
	exitedAfter := time.Since(signaled)
	close(stop)
	wg.Wait()
	if code != 0 {
		t.Errorf("exit code %d after the drain, want 0", code)
	}
	for _, c := range cuts {
		t.Errorf("a transaction in flight was cut by the drain: %s", c)
	}
	var stored int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM drain_load").Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != len(rows) {
		t.Errorf("%d rows stored, %d transactions reported a commit", stored, len(rows))
	}
	if unreadyAfter >= refusedAfter {
		t.Errorf("readiness failed %v after SIGTERM, not before the listeners closed (%v)", unreadyAfter, refusedAfter)
	}
	t.Logf("SIGTERM under %d clients: /readyz 503 within %v, %d logins served while unready, new connections refused from %v, exit 0 after %v; "+
		"%d transactions committed, %d cut mid-flight, %d refused at their start",
		workers, unreadyAfter.Round(time.Millisecond), servedWhileUnready, refusedAfter.Round(time.Millisecond), exitedAfter.Round(time.Millisecond),
		committed.Load(), cutMidFlight.Load(), refusedAtStart.Load())
}

// httpStatus is the status of a GET of url, or 0 when it fails.
func httpStatus(url string) int {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestSecondSignalDuringReadinessDelay: a second signal during
// shutdown_readiness_delay exits at once, without waiting the delay out.
func TestSecondSignalDuringReadinessDelay(t *testing.T) {
	pr := startProcess(t, "shutdown_readiness_delay = 60000", "")
	pr.cmd.Process.Signal(syscall.SIGTERM)
	eventually(t, 5*time.Second, "the readiness delay to begin", func() bool {
		return strings.Contains(pr.output.String(), "still serving for shutdown_readiness_delay")
	})
	pr.cmd.Process.Signal(syscall.SIGINT)
	if code := pr.waitExit(t, 10*time.Second); code != 1 {
		t.Fatalf("exit code %d after a second signal, want 1", code)
	}
}
