package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pgtender/pgtender/internal/loginstorm"
)

var overloadSeconds = flag.Int("overload-seconds", 0, "how long TestOverloadWave offers 3 C (make overload; 0 skips it)")

// The overload wave's shape: the offered load as a multiple of the
// closed-loop capacity C, and how many logins may be outstanding across
// the generators (each process may hold at most its open-file limit).
const (
	overloadMultiple    = 3
	overloadGenerators  = 2
	overloadOutstanding = 20000
	overloadWatchEvery  = 250 * time.Millisecond
)

// overloadWatch is what the watcher of TestOverloadWave saw of the pgtender
// process: its resources at each scrape and how /metrics and /readyz
// answered.
type overloadWatch struct {
	mu                               sync.Mutex
	scrapes, scrapeFailures          int
	readyAnswers, readyFailures      int
	readyStatuses                    map[int]int
	slowestScrape, slowestReady      time.Duration
	peakRSS, peakGoroutines, peakFDs float64
	peakClients, peakInFlight        float64
	firstFailure                     string
}

// watch scrapes url's /metrics and /readyz every overloadWatchEvery until
// ctx ends, each request bounded by a second.
func (w *overloadWatch) watch(ctx context.Context, base string) {
	client := http.Client{Timeout: time.Second}
	ticker := time.NewTicker(overloadWatchEvery)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		start := time.Now()
		families, err := scrapeWithin(time.Second, base+"/metrics")
		took := time.Since(start)
		start = time.Now()
		response, readyErr := client.Get(base + "/readyz")
		readyTook := time.Since(start)
		if readyErr == nil {
			response.Body.Close()
		}
		w.mu.Lock()
		w.scrapes++
		w.slowestScrape = max(w.slowestScrape, took)
		if err != nil {
			w.scrapeFailures++
			w.noteFailure(err.Error())
		} else {
			value := func(name string) float64 { v, _ := sample(families, name, nil); return v }
			w.peakRSS = max(w.peakRSS, value("process_resident_memory_bytes"))
			w.peakGoroutines = max(w.peakGoroutines, value("go_goroutines"))
			w.peakFDs = max(w.peakFDs, value("process_open_fds"))
			w.peakClients = max(w.peakClients, value(namespace+"clients"))
			w.peakInFlight = max(w.peakInFlight, value(namespace+"logins_in_flight"))
		}
		w.readyAnswers++
		w.slowestReady = max(w.slowestReady, readyTook)
		if readyErr != nil {
			w.readyFailures++
			w.noteFailure(readyErr.Error())
		} else {
			w.readyStatuses[response.StatusCode]++
		}
		w.mu.Unlock()
	}
}

func (w *overloadWatch) noteFailure(message string) {
	if w.firstFailure == "" {
		w.firstFailure = message
	}
}

// TestOverloadWave offers pgtender three times the logins it can serve
// (C, measured first with a closed loop of 64 clients) for
// -overload-seconds, open loop, from two loginstorm processes with up to
// 20,000 logins outstanding between them. It asserts that /metrics and
// /readyz answered within a second throughout, that pgtender's login
// counters reconcile with what the generators saw, that its goroutines and
// open files go back to their idle counts after the wave, and it reports
// the peak RSS per client connection held. make overload runs it.
func TestOverloadWave(t *testing.T) {
	if *overloadSeconds <= 0 {
		t.Skip("make overload runs it (-overload-seconds)")
	}
	duration := time.Duration(*overloadSeconds) * time.Second
	storm := goBinary(t, "github.com/pgtender/pgtender/cmd/loginstorm")
	metricsPort := freePort(t)
	pr := startProcessWith(t, processOptions{
		general: metricsGeneral(metricsPort) + "\nlog_connections = false\nlog_disconnections = false",
		pool:    "pool_size = 20",
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", metricsPort)
	ctx, cancel := context.WithTimeout(context.Background(), duration+5*time.Minute)
	defer cancel()
	stormArgs := func(extra ...string) []string {
		return append([]string{"-addr", pr.addr, "-user", appUser, "-database", appDB, "-password", appPassword,
			"-deadline", "5s", "-json", "-progress", "never", "-gate-ontime", "0"}, extra...)
	}

	capacity := runLoginstorm(t, ctx, storm, stormArgs("-c", "64", "-duration", "5s"))
	c := capacity.OnTimePerSec
	if c <= 0 {
		t.Fatalf("the closed loop served nothing: %+v", capacity)
	}
	families := scrape(t, base+"/metrics")
	idle := struct{ goroutines, fds, rss float64 }{
		mustSample(t, families, "go_goroutines", nil), mustSample(t, families, "process_open_fds", nil),
		mustSample(t, families, "process_resident_memory_bytes", nil)}
	before, err := loginstorm.ScrapeLoginCounters(ctx, http.DefaultClient, base+"/metrics", namespace)
	if err != nil {
		t.Fatal(err)
	}

	watch := &overloadWatch{readyStatuses: map[int]int{}}
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); watch.watch(watchCtx, base) }()

	rate := overloadMultiple * c / overloadGenerators
	summaries := make([]loginstorm.Summary, overloadGenerators)
	var wg sync.WaitGroup
	for g := range overloadGenerators {
		wg.Add(1)
		go func() {
			defer wg.Done()
			summaries[g] = runLoginstorm(t, ctx, storm, stormArgs("-rate", strconv.FormatFloat(rate, 'f', 0, 64),
				"-max-outstanding", strconv.Itoa(overloadOutstanding/overloadGenerators),
				"-duration", duration.String(), "-seed", strconv.Itoa(g+1)))
		}()
	}
	wg.Wait()

	// After the wave: every client gone and the counters still, then the
	// goroutines and open files back to their idle counts (the pool's
	// server connections aside).
	var settled struct{ goroutines, fds, servers, clients float64 }
	eventually(t, time.Minute, "goroutines and open files to settle after the wave", func() bool {
		families := scrape(t, base+"/metrics")
		settled.goroutines = mustSample(t, families, "go_goroutines", nil)
		settled.fds = mustSample(t, families, "process_open_fds", nil)
		settled.clients = mustSample(t, families, namespace+"clients", nil)
		settled.servers, _ = sample(families, namespace+"sv_total", map[string]string{"user": appUser, "database": appDB})
		return settled.clients == 0 && settled.goroutines <= idle.goroutines+2*settled.servers+2 &&
			settled.fds <= idle.fds+settled.servers
	})
	after, err := loginstorm.ScrapeLoginCounters(ctx, http.DefaultClient, base+"/metrics", namespace)
	if err != nil {
		t.Fatal(err)
	}
	stopWatch()
	<-watched

	whole := loginstorm.SumCounts(summaries...)
	for _, row := range loginstorm.Reconcile(whole, 0, before, after) {
		t.Logf("reconcile %-45s generator %7d server %9.0f in [%d, %d] %v %s", row.Name, row.Generator, row.Server, row.ServerMin, row.ServerMax, row.Match, row.Note)
		if !row.Match {
			t.Errorf("%s: the server's %v is outside [%d, %d] (%s)", row.Name, row.Server, row.ServerMin, row.ServerMax, row.Note)
		}
	}
	for g, s := range summaries {
		t.Logf("generator %d: planned %d, on time %d, late %d, failed %v, refused %v, p99 %.3fs; dispatch %+v",
			g, s.Planned, s.OnTime, s.Late, s.Failed, s.RefusedBySQL, s.Latency.P99, s.Dispatch)
	}
	offered := float64(whole.Planned) / duration.Seconds()
	t.Logf("C %.0f logins/s (closed loop, 64 clients); offered %.0f logins/s (%.2f C) for %v; served on time %d of %d (%.0f/s, %.2f C); skipped at the outstanding bound %d",
		c, offered, offered/c, duration, whole.OnTime, whole.Planned, float64(whole.OnTime)/duration.Seconds(), float64(whole.OnTime)/duration.Seconds()/c, whole.Failed[loginstorm.ClassSkipped])

	watch.mu.Lock()
	defer watch.mu.Unlock()
	perClient := 0.0
	if watch.peakClients > 0 {
		perClient = (watch.peakRSS - idle.rss) / watch.peakClients
	}
	t.Logf("pgtender: RSS %.1f MiB idle, %.1f MiB at its peak (%.1f KiB per client at the peak of %.0f clients); goroutines %.0f idle, %.0f at the peak, %.0f after; open files %.0f idle, %.0f at the peak, %.0f after; logins in flight at the peak %.0f",
		idle.rss/(1<<20), watch.peakRSS/(1<<20), perClient/1024, watch.peakClients, idle.goroutines, watch.peakGoroutines, settled.goroutines,
		idle.fds, watch.peakFDs, settled.fds, watch.peakInFlight)
	t.Logf("watcher: %d scrapes of /metrics, %d failed, slowest %v; %d of /readyz, %d failed, slowest %v, statuses %v",
		watch.scrapes, watch.scrapeFailures, watch.slowestScrape.Round(time.Millisecond), watch.readyAnswers, watch.readyFailures,
		watch.slowestReady.Round(time.Millisecond), watch.readyStatuses)
	if watch.scrapeFailures > 0 || watch.readyFailures > 0 {
		t.Errorf("/metrics or /readyz did not answer within a second during the wave (first: %s)", watch.firstFailure)
	}
	if watch.scrapes < int(duration/overloadWatchEvery)/2 {
		t.Errorf("only %d scrapes in %v", watch.scrapes, duration)
	}
	if whole.OnTime == 0 {
		t.Error("no login was served on time during the wave")
	}
}

// runLoginstorm runs the loginstorm binary with args (which must include
// -json) and returns its summary. Exit code 1 (the gate not met) is a
// result, not a failure.
func runLoginstorm(t *testing.T, ctx context.Context, binary string, args []string) loginstorm.Summary {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil && cmd.ProcessState.ExitCode() != loginstorm.ExitGateNotMet {
		t.Errorf("loginstorm %v: %v\n%s", args, err, stderr.Bytes())
		return loginstorm.Summary{}
	}
	var summary loginstorm.Summary
	if err := json.Unmarshal(stdout.Bytes(), &summary); err != nil {
		t.Errorf("loginstorm's summary: %v\n%s", err, stdout.Bytes())
	}
	return summary
}
