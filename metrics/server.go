package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
)

// ReadyFunc reports whether pgtender should get traffic and, when not, why
// (pooler.Pooler.Ready).
type ReadyFunc func() (ready bool, reason string)

// NewRegistry returns the registry /metrics serves: the login recorder, the
// pooler collector, and the Go runtime and process collectors (their
// standard go_* and process_* names, not prefixed).
func NewRegistry(recorder *LoginRecorder, collector *Collector) *prometheus.Registry {
	registry := prometheus.NewRegistry()
	registry.MustRegister(
		recorder,
		collector,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return registry
}

// NewHealthHandler serves /healthz (200 "ok" while the process runs) and
// /readyz (200 "ready", or 503 with the reason).
func NewHealthHandler(ready ReadyFunc) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("/readyz", readyHandler(ready))
	return mux
}

// NewMetricsHandler serves /metrics from gatherer, plus /healthz and
// /readyz. log may be nil.
func NewMetricsHandler(gatherer prometheus.Gatherer, ready ReadyFunc, log *zap.Logger) *http.ServeMux {
	if log == nil {
		log = zap.NewNop()
	}
	mux := NewHealthHandler(ready)
	mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{
		// A collector error (which would be a bug) drops that metric from
		// the scrape and is logged, rather than failing the whole scrape.
		ErrorLog:      zap.NewStdLog(log.Named("metrics")),
		ErrorHandling: promhttp.ContinueOnError,
		// Enough for a Prometheus pair and a person with curl; more get a
		// 503 at once rather than pile up walks of every session.
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	}))
	return mux
}

func readyHandler(ready ReadyFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		ok, reason := ready()
		if !ok {
			if reason == "" {
				reason = "not ready"
			}
			writeText(w, http.StatusServiceUnavailable, reason)
			return
		}
		writeText(w, http.StatusOK, "ready")
	}
}

func writeText(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body+"\n")
}

// Options say which HTTP endpoints to serve.
type Options struct {
	// MetricsAddress serves /metrics, /healthz and /readyz; "" = none.
	MetricsAddress string
	// HealthAddress serves /healthz and /readyz; "" = none.
	HealthAddress string
	Gatherer      prometheus.Gatherer // for /metrics
	Ready         ReadyFunc
	Log           *zap.Logger // may be nil
}

// Addresses returns the addresses of openmetrics_host:openmetrics_port and
// of healthcheck_port (on every interface, as PgDog binds it), "" for a
// port of 0. When both ports are the same the metrics server answers the
// health endpoints as well and no second server is started.
func Addresses(host string, metricsPort, healthPort int) (metrics, health string) {
	if metricsPort != 0 {
		metrics = net.JoinHostPort(host, strconv.Itoa(metricsPort))
	}
	if healthPort != 0 && healthPort != metricsPort {
		health = net.JoinHostPort("", strconv.Itoa(healthPort))
	}
	return metrics, health
}

// Servers are the running HTTP endpoints.
type Servers struct {
	log     *zap.Logger
	servers []*http.Server
	addrs   []net.Addr
	wg      sync.WaitGroup
}

// Serve opens the endpoints opts asks for and serves them on their own
// goroutines until Shutdown. With no address it starts nothing. The
// sockets are open when it returns, so a port in use fails here.
func Serve(opts Options) (*Servers, error) {
	s := &Servers{log: opts.Log}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	type endpoint struct {
		address, name string
		handler       http.Handler
	}
	var endpoints []endpoint
	if opts.MetricsAddress != "" {
		endpoints = append(endpoints, endpoint{opts.MetricsAddress, "metrics", NewMetricsHandler(opts.Gatherer, opts.Ready, s.log)})
	}
	if opts.HealthAddress != "" {
		health := NewHealthHandler(opts.Ready)
		// PgDog answers every path of healthcheck_port with its health, so
		// a load balancer moved from PgDog may probe "/".
		health.HandleFunc("/{$}", readyHandler(opts.Ready))
		endpoints = append(endpoints, endpoint{opts.HealthAddress, "health", health})
	}
	var listeners []net.Listener
	for _, e := range endpoints {
		l, err := net.Listen("tcp", e.address)
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return nil, fmt.Errorf("%s endpoint: %w", e.name, err)
		}
		listeners = append(listeners, l)
	}
	for i, e := range endpoints {
		server := &http.Server{
			Handler:           e.handler,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       60 * time.Second,
			ErrorLog:          zap.NewStdLog(s.log.Named(e.name + "_http")),
		}
		s.servers = append(s.servers, server)
		s.addrs = append(s.addrs, listeners[i].Addr())
		s.log.Info("serving HTTP", zap.String("endpoint", e.name), zap.Stringer("address", listeners[i].Addr()))
		s.wg.Add(1)
		go func(l net.Listener, name string) {
			defer s.wg.Done()
			if err := server.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("HTTP endpoint failed", zap.String("endpoint", name), zap.Error(err))
			}
		}(listeners[i], e.name)
	}
	return s, nil
}

// Addrs are the addresses served, metrics first.
func (s *Servers) Addrs() []net.Addr { return s.addrs }

// Shutdown stops the endpoints, letting requests in progress finish until
// ctx ends, and returns once their goroutines have ended.
func (s *Servers) Shutdown(ctx context.Context) error {
	var errs []error
	for _, server := range s.servers {
		if err := server.Shutdown(ctx); err != nil {
			errs = append(errs, err)
			server.Close()
		}
	}
	s.wg.Wait()
	return errors.Join(errs...)
}

// Close stops the endpoints at once, cutting requests in progress.
func (s *Servers) Close() {
	for _, server := range s.servers {
		server.Close()
	}
	s.wg.Wait()
}
