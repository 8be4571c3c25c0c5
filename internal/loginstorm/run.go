package loginstorm

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Exit codes.
const (
	ExitGateMet    = 0
	ExitGateNotMet = 1
	ExitUsage      = 2
)

// Main runs loginstorm with the command-line arguments and returns the exit
// code: 0 the gate was met, 1 it was not, 2 a usage or setup error.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := ParseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return ExitUsage
	}
	if err != nil {
		fmt.Fprintf(stderr, "loginstorm: %v\n", err)
		return ExitUsage
	}
	progress := cfg.Progress == "always" || (cfg.Progress == "auto" && isTerminal(stdout))
	summary, err := Run(ctx, cfg, progressWriter(progress, stdout))
	if err != nil {
		fmt.Fprintf(stderr, "loginstorm: %v\n", err)
		return ExitUsage
	}
	if cfg.JSON {
		encoder := json.NewEncoder(stdout)
		encoder.SetIndent("", "  ")
		if err := encoder.Encode(summary); err != nil {
			fmt.Fprintf(stderr, "loginstorm: %v\n", err)
			return ExitUsage
		}
	} else {
		summary.WriteText(stdout)
	}
	if summary.Gate.Met {
		return ExitGateMet
	}
	return ExitGateNotMet
}

func progressWriter(enabled bool, stdout io.Writer) io.Writer {
	if enabled {
		return stdout
	}
	return nil
}

func isTerminal(out io.Writer) bool {
	file, ok := out.(*os.File)
	if !ok {
		return false
	}
	info, err := file.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}

// Run performs a run as configured. A progress line goes to progress every
// second when it is not nil. The error is a setup error (the metrics could
// not be scraped); login failures are in the summary.
func Run(ctx context.Context, cfg Config, progress io.Writer) (Summary, error) {
	client := &Client{Address: cfg.Address, Deadline: cfg.Deadline, LateWindow: cfg.LateWindow, Query: cfg.Query, Graceful: cfg.Graceful}
	httpClient := &http.Client{Timeout: 10 * time.Second}
	var before LoginCounters
	if cfg.MetricsURL != "" {
		// Logins of an earlier run that the server is still ending would
		// be counted in this run's change: let it finish first.
		var err error
		if before, err = scrapeSettled(ctx, httpClient, cfg, nil); err != nil {
			return Summary{}, err
		}
	}

	held, hold := openHeld(ctx, cfg, client)
	defer func() {
		for _, conn := range held {
			client.CloseHeld(conn)
		}
	}()

	collector := NewCollector()
	login := func(ctx context.Context, sequence int64, elapsed time.Duration) Outcome {
		return client.Login(ctx, cfg.planFor(sequence, elapsed))
	}
	// Every loop ends by itself: the plan is bounded in count or time, and
	// each login by its deadline. This context is a backstop.
	runLimit := cfg.Duration
	if cfg.Count > 0 && cfg.OpenLoop() {
		runLimit = time.Duration(float64(cfg.Count) / cfg.Rate * float64(time.Second))
	}
	backstop := runLimit + cfg.Deadline + cfg.LateWindow + 10*time.Second
	if cfg.Count > 0 && !cfg.OpenLoop() {
		backstop = 0 // closed loop by count: bounded by the count and the deadline
	}
	runContext, cancel := context.WithCancel(ctx)
	defer cancel()
	if backstop > 0 {
		var cancelTimeout context.CancelFunc
		runContext, cancelTimeout = context.WithTimeout(runContext, backstop)
		defer cancelTimeout()
	}

	stopProgress := startProgress(runContext, progress, collector)
	start := time.Now()
	summaryMode := ""
	var dispatch *DispatchStats
	if cfg.OpenLoop() {
		planned := cfg.Count
		if planned == 0 {
			planned = int64(cfg.Rate * cfg.Duration.Seconds())
		}
		summaryMode = fmt.Sprintf("open loop, %g logins/s, %d planned, max outstanding %d", cfg.Rate, planned, cfg.MaxOutstanding)
		stats := OpenLoop(runContext, RealClock{}, cfg.Rate, planned, cfg.MaxOutstanding, login, collector.Record)
		dispatch = &stats
	} else {
		summaryMode = fmt.Sprintf("closed loop, %d workers", cfg.Workers)
		if cfg.Count > 0 {
			summaryMode += fmt.Sprintf(", %d logins", cfg.Count)
		} else {
			summaryMode += fmt.Sprintf(", %s", cfg.Duration)
		}
		ClosedLoop(runContext, RealClock{}, cfg.Workers, cfg.Count, cfg.Duration, login, collector.Record)
	}
	elapsed := time.Since(start)
	stopProgress()

	summary := collector.Summarize(elapsed, cfg.GateOnTime)
	summary.Mode = summaryMode
	summary.Dispatch = dispatch
	summary.Interrupted = ctx.Err() != nil
	summary.Settings = map[string]string{
		"target": cfg.Address, "deadline": cfg.Deadline.String(), "late_window": cfg.LateWindow.String(),
		"query": cfg.Query, "graceful_close": strconv.FormatBool(cfg.Graceful),
		"wrong_share": fmt.Sprint(cfg.WrongShare), "abandon": string(cfg.Abandon), "abandon_share": fmt.Sprint(cfg.AbandonShare),
		"targets": strconv.Itoa(len(cfg.Targets)), "passwords": strconv.Itoa(len(cfg.Passwords)),
	}
	if cfg.Hold > 0 {
		summary.Held = &hold
	}
	if cfg.MetricsURL != "" {
		held := int64(hold.Opened)
		after, err := scrapeSettled(ctx, httpClient, cfg, func(after LoginCounters) bool {
			return !slices.ContainsFunc(Reconcile(summary, held, before, after), func(row ReconcileRow) bool { return !row.Match })
		})
		if err != nil {
			return summary, err
		}
		summary.Reconciliation = Reconcile(summary, held, before, after)
	}
	return summary, nil
}

// settleTime bounds how long a scrape waits for the server to settle (a
// variable for tests).
var settleTime = 2 * time.Second

// scrapeSettled scrapes until the server has no login in flight (when it
// exports logins_in_flight), its counters stopped moving between two
// scrapes, and done (if not nil) accepts them, or for at most settleTime.
// The server counts a login when it notices the client's close, a moment
// after the client has moved on, and connections the clients gave up on
// may still wait in its accept queue. The result is marked Unsettled when
// the server was still busy at the end.
func scrapeSettled(ctx context.Context, httpClient *http.Client, cfg Config, done func(LoginCounters) bool) (LoginCounters, error) {
	limit := time.Now().Add(settleTime)
	var previous *LoginCounters
	for {
		counters, err := ScrapeLoginCounters(ctx, httpClient, cfg.MetricsURL, cfg.MetricsNamespace)
		if err != nil {
			return counters, err
		}
		settled := (!counters.HasInFlight || counters.InFlight == 0) && previous != nil &&
			maps.Equal(previous.Results, counters.Results) && maps.Equal(previous.Abandoned, counters.Abandoned)
		if settled && (done == nil || done(counters)) {
			return counters, nil
		}
		if time.Now().After(limit) || ctx.Err() != nil {
			counters.Unsettled = !settled
			return counters, nil
		}
		previous = &counters
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

// openHeld opens cfg.Hold logged-in connections, a few at a time, each
// bounded by the deadline. Held connections use the targets in order and the
// first password, never a wrong one.
func openHeld(ctx context.Context, cfg Config, client *Client) ([]net.Conn, HoldSummary) {
	summary := HoldSummary{Wanted: cfg.Hold}
	if cfg.Hold == 0 {
		return nil, summary
	}
	var mutex sync.Mutex
	var held []net.Conn
	next := make(chan int)
	var group sync.WaitGroup
	for range min(cfg.Hold, 32) {
		group.Go(func() {
			for index := range next {
				target := cfg.Targets[index%len(cfg.Targets)]
				password := target.Password
				if password == "" {
					password = cfg.Passwords[0]
				}
				conn, outcome := client.Open(ctx, Plan{Sequence: int64(index), Target: target, Password: password})
				mutex.Lock()
				if conn != nil && outcome.Class == ClassOnTime {
					held = append(held, conn)
				} else {
					summary.Failed++
				}
				mutex.Unlock()
			}
		})
	}
	for index := range cfg.Hold {
		if ctx.Err() != nil {
			break
		}
		next <- index
	}
	close(next)
	group.Wait()
	// Idle connections must stay idle: clear the login deadline.
	for _, conn := range held {
		_ = conn.SetDeadline(time.Time{})
	}
	summary.Opened = len(held)
	return held, summary
}

// startProgress prints a progress line every second until the returned
// function is called. It returns a no-op when out is nil.
func startProgress(ctx context.Context, out io.Writer, collector *Collector) func() {
	if out == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(time.Second)
		defer ticker.Stop()
		start := time.Now()
		var lastDone int64
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-ticker.C:
				progress := collector.Progress()
				fmt.Fprintf(out, "%5.0fs  %7d ended/s  on time %8d  failed %6d  p99 %s\n",
					now.Sub(start).Seconds(), progress.Done-lastDone, progress.OnTime, progress.Failures, progress.P99.Round(time.Microsecond))
				lastDone = progress.Done
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
