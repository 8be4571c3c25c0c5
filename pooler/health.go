package pooler

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pgtender/pgtender/config"
)

// healthProbeInterval is how often every configured database is probed for
// readiness.
const healthProbeInterval = 5 * time.Second

// databaseHealth is what pgtender last learned about whether a configured
// database's server answers: from a probe, or from opening a real server
// connection.
type databaseHealth struct {
	mu      sync.Mutex // guards the fields below
	checked bool
	ok      bool
	err     string
	at      time.Time
}

func (h *databaseHealth) record(ok bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checked, h.ok, h.at = true, ok, time.Now()
	h.err = ""
	if err != nil {
		h.err = err.Error()
	}
}

// health returns the health record of a database, creating it.
func (p *Pooler) health(database string) *databaseHealth {
	p.healthMu.Lock()
	defer p.healthMu.Unlock()
	h, ok := p.databaseHealth[database]
	if !ok {
		h = &databaseHealth{}
		p.databaseHealth[database] = h
	}
	return h
}

// Ready reports whether the pooler should get traffic: it is listening,
// not draining, and at least one configured database answered its last
// check. When it is not ready, reason says why.
func (p *Pooler) Ready() (ready bool, reason string) {
	if !p.serveStarted.Load() {
		return false, "not listening yet"
	}
	if p.draining.Load() {
		return false, "draining"
	}
	if p.notAccepting.Load() {
		return false, "shutting down: not accepting, serving the clients logged in until they leave (SHUTDOWN WAIT_FOR_CLIENTS)"
	}
	if p.unready.Load() {
		return false, "shutting down: still serving until shutdown_readiness_delay has passed"
	}
	cfg := p.state.Load().cfg
	var failures []string
	for _, database := range cfg.Databases {
		h := p.health(database.Name)
		h.mu.Lock()
		checked, ok, msg := h.checked, h.ok, h.err
		h.mu.Unlock()
		switch {
		case ok:
			return true, ""
		case !checked:
			failures = append(failures, fmt.Sprintf("database %q: not checked yet", database.Name))
		default:
			failures = append(failures, fmt.Sprintf("database %q: %s", database.Name, msg))
		}
	}
	if len(cfg.Databases) == 0 {
		return true, ""
	}
	sort.Strings(failures)
	return false, "no configured database answers: " + strings.Join(failures, "; ")
}

// StopReadiness makes Ready report false from now on while the pooler
// keeps serving: the head start a shutdown gives a load balancer or
// Kubernetes to stop sending new connections before the listeners close
// (shutdown_readiness_delay).
func (p *Pooler) StopReadiness() { p.unready.Store(true) }

// probeDatabases checks that each configured database's server answers the
// protocol: it opens a TCP connection and sends SSLRequest, which Postgres
// answers with one byte before any authentication, so no credentials are
// needed (passthrough pools have none until a client brings them).
func (p *Pooler) probeDatabases(ctx context.Context) {
	cfg := p.state.Load().cfg
	timeout := cfg.General.ConnectTimeout.Duration()
	var wg sync.WaitGroup
	for _, database := range cfg.Databases {
		wg.Add(1)
		go func(database config.Database) {
			defer wg.Done()
			probeCtx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			err := probeServer(probeCtx, net.JoinHostPort(database.Host, strconv.Itoa(database.Port)))
			if ctx.Err() == nil {
				p.health(database.Name).record(err == nil, err)
			}
		}(database)
	}
	wg.Wait()
}

func probeServer(ctx context.Context, address string) error {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "tcp", address)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", address, err)
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	sslRequest := []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}
	if _, err := conn.Write(sslRequest); err != nil {
		return fmt.Errorf("probe %s: %w", address, err)
	}
	var answer [1]byte
	if _, err := conn.Read(answer[:]); err != nil {
		return fmt.Errorf("probe %s: no answer: %w", address, err)
	}
	if answer[0] != 'S' && answer[0] != 'N' {
		return fmt.Errorf("probe %s: answered %q, not like Postgres", address, answer[0])
	}
	return nil
}

// healthLoop probes the databases now and every healthProbeInterval.
func (p *Pooler) healthLoop() {
	defer p.wg.Done()
	ticker := time.NewTicker(healthProbeInterval)
	defer ticker.Stop()
	for {
		p.probeDatabases(p.ctx)
		select {
		case <-p.done:
			return
		case <-ticker.C:
		}
	}
}
