// Command pgtender runs the pgtender connection pooler.
//
//	pgtender --config pgdog.toml --users users.toml
//	pgtender --check-config --config pgdog.toml --users users.toml
//	pgtender --version
//	pgtender --healthcheck http://127.0.0.1:9930/healthz
//
// SIGHUP reloads both files; SIGTERM and SIGINT drain (a second signal
// exits at once). Under systemd (Type=notify, $NOTIFY_SOCKET) it reports
// READY=1, RELOADING=1 and STOPPING=1 (internal/sdnotify).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/internal/sdnotify"
	"github.com/pgtender/pgtender/metrics"
	"github.com/pgtender/pgtender/pooler"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	flags := flag.NewFlagSet("pgtender", flag.ContinueOnError)
	configPath := flags.String("config", "pgdog.toml", "path to pgdog.toml")
	usersPath := flags.String("users", "users.toml", "path to users.toml (optional)")
	checkConfig := flags.Bool("check-config", false, "validate the configuration files, print every problem and exit")
	showVersion := flags.Bool("version", false, "print the version, the commit and the Go version, and exit")
	healthURL := flags.String("healthcheck", "", "GET this URL (pgtender's /healthz or /readyz), exit 0 on a 2xx answer and 1 otherwise; for a container HEALTHCHECK")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	build := readBuildVersion()
	if *showVersion {
		fmt.Println(build)
		return 0
	}
	if *healthURL != "" {
		return healthcheck(*healthURL, os.Stdout, os.Stderr)
	}
	if _, err := os.Stat(*usersPath); err != nil && !isFlagSet(flags, "users") {
		*usersPath = "" // the default users.toml is optional
	}

	cfg, err := config.Load(*configPath, *usersPath)
	if *checkConfig {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("configuration is valid: %s", *configPath)
		if *usersPath != "" {
			fmt.Printf(", %s", *usersPath)
		}
		fmt.Println()
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}

	log, err := newLogger(cfg.General)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtender:", err)
		return 1
	}
	defer log.Sync()

	general := cfg.General
	// The recorder runs with or without a metrics endpoint: the admin
	// console's SHOW LOGINS reads it too.
	recorder := metrics.NewLoginRecorder(general.OpenMetricsNamespace)
	p, err := pooler.New(cfg, log, recorder)
	if err != nil {
		log.Error("cannot start", zap.Error(err))
		return 1
	}
	// Without $NOTIFY_SOCKET (not under systemd's Type=notify) it sends
	// nothing.
	notifier := sdnotify.New(os.Getenv("NOTIFY_SOCKET"), log)
	// SHUTDOWN on the console is a SIGTERM that comes from inside; true
	// is SHUTDOWN WAIT_FOR_CLIENTS.
	consoleShutdown := make(chan bool, 1)
	p.SetConsoleHooks(pooler.ConsoleHooks{
		Version: build.Version,
		Reload:  func() error { return reload(p, log, notifier, *configPath, *usersPath) },
		Shutdown: func(waitForClients bool) {
			select {
			case consoleShutdown <- waitForClients:
			default: // one is on its way already
			}
		},
		Logins: func() []pooler.LoginFigure { return append(recorder.Figures(), metrics.ListenFigures(p)...) },
	})
	// Signals are caught from before the port opens: a SIGTERM that comes
	// as soon as a client can connect (a test, an orchestrator) must drain,
	// not kill the process by the default action. They wait in the channel
	// until the loop below reads them.
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	if err := p.Listen(); err != nil {
		log.Error("cannot listen", zap.Error(err))
		return 1
	}
	// The HTTP endpoints outlive the drain: /readyz answers "draining"
	// (503) from the first shutdown signal until Shutdown has returned, and
	// /metrics shows the drain. They close after. No port, no server.
	metricsAddress, healthAddress := metrics.Addresses(general.OpenMetricsHost, general.OpenMetricsPort, general.HealthcheckPort)
	options := metrics.Options{MetricsAddress: metricsAddress, HealthAddress: healthAddress, Ready: p.Ready, Log: log}
	if general.OpenMetricsPort != 0 {
		options.Gatherer = metrics.NewRegistry(recorder, metrics.NewCollector(general.OpenMetricsNamespace, p, log))
	}
	endpoints, err := metrics.Serve(options)
	if err != nil {
		log.Error("cannot serve HTTP", zap.Error(err))
		_ = p.Shutdown(context.Background()) // closes the listening sockets; nothing was served
		return 1
	}
	log.Info("pgtender started", zap.String("version", build.Version), zap.String("commit", build.Commit), zap.String("go", build.Go),
		zap.String("pooler_mode", string(cfg.General.PoolerMode)), zap.String("passthrough_auth", string(cfg.General.PassthroughAuth)),
		zap.Bool("systemd_notify", notifier.Enabled()))

	serveDone := make(chan error, 1)
	go func() { serveDone <- p.Serve() }()
	// The sockets listen since p.Listen: a client connecting from now on
	// waits in the accept queue until the accept loops Serve starts take
	// it, so units ordered after pgtender may start.
	notifier.Ready()

	reloadFiles := func() { _ = reload(p, log, notifier, *configPath, *usersPath) }
	for {
		select {
		case err := <-serveDone:
			stopEndpoints(endpoints, log)
			if !errors.Is(err, pooler.ErrServerClosed) {
				log.Error("serve failed", zap.Error(err))
				return 1
			}
			return 0
		case sig := <-signals:
			if sig == syscall.SIGHUP {
				reloadFiles()
				continue
			}
			notifier.Stopping()
			return drain(p, endpoints, log, sig, signals, reloadFiles)
		case waitForClients := <-consoleShutdown:
			// Either way pgtender stops: systemd hears it now, not when
			// the last client leaves.
			notifier.Stopping()
			if waitForClients {
				log.Info("shutting down: SHUTDOWN WAIT_FOR_CLIENTS on the admin console; not accepting, exiting when the clients have left",
					zap.Int64("clients", p.ClientCount()))
				return drainAfterClients(p, endpoints, log, signals, consoleShutdown, reloadFiles)
			}
			log.Info("shutting down: SHUTDOWN on the admin console")
			return drain(p, endpoints, log, syscall.SIGTERM, signals, reloadFiles)
		}
	}
}

// clientsGonePollInterval is how often drainAfterClients looks whether the
// clients have left.
const clientsGonePollInterval = 50 * time.Millisecond

// drainAfterClients is SHUTDOWN WAIT_FOR_CLIENTS, once the console has
// stopped accepting: the clients logged in are served until the last one
// leaves, however long that takes (as in PgBouncer), and then the pooler
// shuts down. A SIGTERM or SIGINT, or a plain SHUTDOWN from a console
// session still open, cuts the wait short with the drain SIGTERM runs
// (shutdown_timeout); SIGHUP still reloads.
func drainAfterClients(p *pooler.Pooler, endpoints *metrics.Servers, log *zap.Logger, signals chan os.Signal, consoleShutdown <-chan bool, reload func()) int {
	ticker := time.NewTicker(clientsGonePollInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ticker.C:
			if p.ClientCount() == 0 {
				log.Info("the last client has left")
				return drainNow(p, endpoints, log, "SHUTDOWN WAIT_FOR_CLIENTS", signals)
			}
		case sig := <-signals:
			if sig == syscall.SIGHUP {
				reload()
				continue
			}
			return drainNow(p, endpoints, log, sig.String(), signals)
		case waitForClients := <-consoleShutdown:
			if !waitForClients {
				return drainNow(p, endpoints, log, "SHUTDOWN", signals)
			}
		}
	}
}

// reloadMu makes each reload read the files and apply them as one step:
// SIGHUP and the console's RELOAD may come at once, and a reload that read
// the files first must not apply them after one that read them later.
var reloadMu sync.Mutex

// reload re-reads both files; a broken file leaves the running config as
// it is, and the error says why (logged here; the console's RELOAD shows
// it to its caller too). systemd hears RELOADING=1 before and READY=1
// after, whatever the outcome: pgtender serves on either way (nothing is
// sent once the drain has begun).
func reload(p *pooler.Pooler, log *zap.Logger, notifier *sdnotify.Notifier, configPath, usersPath string) error {
	reloadMu.Lock()
	defer reloadMu.Unlock()
	notifier.Reloading()
	defer notifier.Ready()
	cfg, err := config.Load(configPath, usersPath)
	if err == nil {
		err = p.Reload(cfg)
	}
	if err != nil {
		log.Error("reload failed; keeping the running configuration", zap.Error(err))
	}
	return err
}

// stopEndpoints closes the HTTP endpoints, after the pooler has stopped.
func stopEndpoints(endpoints *metrics.Servers, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := endpoints.Shutdown(ctx); err != nil {
		log.Warn("HTTP endpoints did not stop in time", zap.Error(err))
	}
}

// drain shuts down gracefully; a second signal exits at once. With
// shutdown_readiness_delay, /readyz answers 503 for that long while
// pgtender goes on serving, so that a load balancer or Kubernetes stops
// sending new connections before the listeners close; then Shutdown marks
// the pooler draining and closes the listening sockets, and transactions
// in flight have shutdown_timeout to finish. Both are read from the
// running configuration, so a reload changes them.
func drain(p *pooler.Pooler, endpoints *metrics.Servers, log *zap.Logger, sig os.Signal, signals chan os.Signal, reload func()) int {
	if delay := p.Config().General.ShutdownReadinessDelay.Duration(); delay > 0 {
		p.StopReadiness()
		log.Info("shutting down: not ready, still serving for shutdown_readiness_delay", zap.String("signal", sig.String()), zap.Duration("shutdown_readiness_delay", delay))
		if !waitOrSignal(delay, signals, log, reload) {
			endpoints.Close()
			return 1
		}
	}
	return drainNow(p, endpoints, log, sig.String(), signals)
}

// drainNow is the drain after shutdown_readiness_delay: Shutdown, bounded
// by shutdown_timeout; a second SIGTERM or SIGINT exits at once. cause
// names what began it, for the log.
func drainNow(p *pooler.Pooler, endpoints *metrics.Servers, log *zap.Logger, cause string, signals chan os.Signal) int {
	timeout := p.Config().General.ShutdownTimeout.Duration() // after the delay: a reload during it counts
	log.Info("draining: no new connections; transactions in flight may finish", zap.String("cause", cause), zap.Duration("shutdown_timeout", timeout))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Shutdown(ctx) }()
	for {
		select {
		case err := <-done:
			if err != nil {
				log.Warn("shutdown_timeout expired; closed the remaining connections", zap.Error(err))
			} else {
				log.Info("drained")
			}
			stopEndpoints(endpoints, log)
			return 0
		case sig := <-signals:
			if sig == syscall.SIGHUP {
				continue
			}
			log.Warn("second signal: exiting at once", zap.String("signal", sig.String()))
			endpoints.Close()
			return 1
		}
	}
}

// waitOrSignal waits for d, reloading on SIGHUP meanwhile (pgtender is
// still serving), and reports false if a second SIGTERM or SIGINT came
// first (the caller exits at once).
func waitOrSignal(d time.Duration, signals chan os.Signal, log *zap.Logger, reload func()) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
			return true
		case sig := <-signals:
			if sig == syscall.SIGHUP {
				reload()
				continue
			}
			log.Warn("second signal: exiting at once", zap.String("signal", sig.String()))
			return false
		}
	}
}

func newLogger(general config.General) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(general.LogLevel)
	if err != nil {
		return nil, fmt.Errorf("log_level: %w", err)
	}
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(level)
	zc.Encoding = "json"
	if general.LogFormat == "text" {
		zc.Encoding = "console"
		zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	}
	zc.DisableStacktrace = true
	// Sampling keeps a storm of identical lines (refused logins, checkout
	// timeouts) from making logging the bottleneck: per second, the first
	// 100 of each message are logged, then every 100th.
	zc.Sampling = &zap.SamplingConfig{Initial: 100, Thereafter: 100}
	return zc.Build()
}

func isFlagSet(flags *flag.FlagSet, name string) bool {
	set := false
	flags.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}
