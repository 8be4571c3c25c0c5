package integration

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

var soakMinutes = flag.Float64("soak-minutes", 0, "how long TestSoak runs its load (make soak; 0 skips it)")

// soakSample is one scrape of the pgtender process during TestSoak.
type soakSample struct {
	at                  time.Duration
	rss                 float64 // process_resident_memory_bytes
	goroutines, openFDs float64
	clients, servers    float64 // clients, sv_total of the app pool
}

func (s soakSample) String() string {
	return fmt.Sprintf("%6.0fs rss %6.1f MiB, goroutines %4.0f, fds %4.0f, clients %3.0f, sv_total %2.0f",
		s.at.Seconds(), s.rss/(1<<20), s.goroutines, s.openFDs, s.clients, s.servers)
}

// TestSoak runs the pgtender binary under a mixed load for -soak-minutes:
// per-request logins (a fresh connection per request, as a Django fleet
// without persistent connections), long-lived clients running transactions
// with prepared statements (pgx's statement cache, renamed by pgtender),
// and long-lived clients with their own session settings. It samples the
// process's RSS, goroutines and open files and the pool's gauges through
// /metrics every few seconds. It fails on any client error, on RSS at the
// end of the load more than 10 % (plus 8 MiB) above what it was a quarter
// of the way in, and on goroutines or open files that do not settle back to
// their idle count after the load.
func TestSoak(t *testing.T) {
	if *soakMinutes <= 0 {
		t.Skip("make soak runs it (-soak-minutes)")
	}
	duration := time.Duration(*soakMinutes * float64(time.Minute))
	metricsPort := freePort(t)
	pr := startProcessWith(t, processOptions{
		general: metricsGeneral(metricsPort) + "\nlog_connections = false\nlog_disconnections = false",
		pool:    "pool_size = 8",
	})
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort)
	ctx, cancel := context.WithTimeout(context.Background(), duration+5*time.Minute)
	defer cancel()
	admin := direct(t, ctx)
	if _, err := admin.Exec(ctx, "DROP TABLE IF EXISTS soak_rows; CREATE TABLE soak_rows (client int, n int); GRANT ALL ON soak_rows TO "+appUser); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP TABLE IF EXISTS soak_rows") })

	start := time.Now()
	sampleNow := func() soakSample {
		families := scrape(t, url)
		s := soakSample{
			at:         time.Since(start),
			rss:        mustSample(t, families, "process_resident_memory_bytes", nil),
			goroutines: mustSample(t, families, "go_goroutines", nil),
			openFDs:    mustSample(t, families, "process_open_fds", nil),
			clients:    mustSample(t, families, namespace+"clients", nil),
		}
		s.servers, _ = sample(families, namespace+"sv_total", map[string]string{"user": appUser, "database": appDB})
		return s
	}
	idle := sampleNow()

	var (
		requests, errs atomic.Int64
		mu             sync.Mutex
		firstErrors    []string
		wg             sync.WaitGroup
	)
	fail := func(format string, args ...any) {
		errs.Add(1)
		mu.Lock()
		defer mu.Unlock()
		if len(firstErrors) < 10 {
			firstErrors = append(firstErrors, fmt.Sprintf(format, args...))
		}
	}
	end := start.Add(duration)
	// Per-request logins.
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				conn, err := pr.connect(ctx)
				if err != nil {
					fail("login worker %d: connect: %v", w, err)
					time.Sleep(100 * time.Millisecond)
					continue
				}
				var got int
				if err := conn.QueryRow(ctx, "SELECT $1::int", w).Scan(&got); err != nil || got != w {
					fail("login worker %d: query: %v (%d)", w, err, got)
				}
				conn.Close(ctx)
				requests.Add(1)
			}
		}()
	}
	// Long-lived clients: transactions with prepared statements.
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cc, err := pgx.ParseConfig(fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", appUser, appPassword, pr.addr, appDB))
			if err != nil {
				fail("client %d: %v", c, err)
				return
			}
			conn, err := pgx.ConnectConfig(ctx, cc) // the default: prepared statements, cached
			if err != nil {
				fail("client %d: connect: %v", c, err)
				return
			}
			defer conn.Close(context.Background())
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for n := 0; time.Now().Before(end); n++ {
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, "INSERT INTO soak_rows VALUES ($1, $2)", c, n); err != nil {
						return err
					}
					var count int
					// One of a few statement texts, so statements are shared
					// and evicted across clients and server connections.
					sql := fmt.Sprintf("SELECT count(*) FROM soak_rows WHERE client = $1 AND n <= $2 + %d", rng.IntN(20))
					return tx.QueryRow(ctx, sql, c, n).Scan(&count)
				})
				if err != nil {
					fail("client %d transaction %d: %v", c, n, err)
				}
				requests.Add(1)
				if n%1000 == 999 {
					if _, err := conn.Exec(ctx, "DELETE FROM soak_rows WHERE client = $1", c); err != nil {
						fail("client %d: cleanup: %v", c, err)
					}
				}
			}
		}()
	}
	// Long-lived clients with session settings of their own.
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pr.connect(ctx)
			if err != nil {
				fail("settings client %d: connect: %v", c, err)
				return
			}
			defer conn.Close(context.Background())
			name := fmt.Sprintf("soak-%d", c)
			if _, err := conn.Exec(ctx, "SET application_name = '"+name+"'"); err != nil {
				fail("settings client %d: SET: %v", c, err)
				return
			}
			for time.Now().Before(end) {
				var got string
				if err := conn.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&got); err != nil || got != name {
					fail("settings client %d: saw application_name %q (%v), want %q", c, got, err, name)
				}
				requests.Add(1)
				time.Sleep(time.Millisecond)
			}
		}()
	}

	every := max(duration/20, 3*time.Second)
	var samples []soakSample
	quarter := soakSample{}
	for time.Now().Before(end) {
		time.Sleep(min(every, time.Until(end)))
		s := sampleNow()
		samples = append(samples, s)
		if quarter.at == 0 && s.at >= duration/4 {
			quarter = s
		}
	}
	wg.Wait()
	loaded := samples[len(samples)-1]

	// After the load: every client gone, goroutines and files back to
	// their idle count (the pool's server connections aside).
	var settled soakSample
	eventually(t, 30*time.Second, "goroutines and open files to settle after the load", func() bool {
		settled = sampleNow()
		return settled.clients == 0 &&
			settled.goroutines <= idle.goroutines+2*settled.servers+2 &&
			settled.openFDs <= idle.openFDs+settled.servers
	})
	for _, s := range samples {
		t.Log(s)
	}
	t.Logf("idle before: %v", idle)
	t.Logf("after the load: %v", settled)
	for _, e := range firstErrors {
		t.Error(e)
	}
	if n := errs.Load(); n != 0 {
		t.Errorf("%d client errors in %d requests", n, requests.Load())
	}
	if quarter.at == 0 {
		quarter = samples[0]
	}
	if limit := quarter.rss*1.1 + 8<<20; loaded.rss > limit {
		t.Errorf("RSS grew under a steady load: %.1f MiB at %v, %.1f MiB at the end (limit %.1f MiB)",
			quarter.rss/(1<<20), quarter.at.Round(time.Second), loaded.rss/(1<<20), limit/(1<<20))
	}
	t.Logf("soak of %v: %d requests, %d errors; RSS %.1f MiB idle, %.1f MiB at a quarter, %.1f MiB at the end, %.1f MiB after; goroutines %0.f idle, %0.f after",
		duration, requests.Load(), errs.Load(), idle.rss/(1<<20), quarter.rss/(1<<20), loaded.rss/(1<<20), settled.rss/(1<<20),
		idle.goroutines, settled.goroutines)
	if !strings.Contains(pr.output.String(), "pgtender started") {
		t.Error("no start line in the process output")
	}
}
