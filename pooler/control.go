package pooler

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"
)

// The admin console's control of databases (console.go runs the
// commands): DISABLE and ENABLE, which refuse and admit new logins;
// RECONNECT, which replaces server connections; PAUSE and RESUME, which
// hold transactions back and let them go. All act on the running pooler,
// not on the configuration: a reload leaves a DISABLEd or PAUSEd database
// so, and a restart ends it.

// databaseDisabled reports whether logins to database are refused.
func (p *Pooler) databaseDisabled(database string) bool {
	disabled := p.disabled.Load()
	return disabled != nil && (*disabled)[database]
}

// setDatabaseDisabled refuses (true) or admits new logins to database.
// Clients logged in already are left alone, as PgBouncer's DISABLE
// leaves them.
func (p *Pooler) setDatabaseDisabled(database string, disabled bool) {
	p.disabledMu.Lock()
	defer p.disabledMu.Unlock()
	next := make(map[string]bool)
	if old := p.disabled.Load(); old != nil {
		maps.Copy(next, *old)
	}
	if disabled {
		next[database] = true
	} else {
		delete(next, database)
	}
	p.disabled.Store(&next)
}

// reconnectPools replaces the server connections of every pool of
// database ("" for every pool): the idle ones now, those in use when their
// clients give them back. It returns the pools it marked and the idle
// connections it closed.
func (p *Pooler) reconnectPools(database string) (pools, closed int) {
	now := time.Now()
	for _, pool := range p.poolList() {
		if database == "" || pool.key.database == database {
			pools++
			closed += pool.reconnect(now)
		}
	}
	return pools, closed
}

// pauseSet is what PAUSE holds: every database (all), or some.
type pauseSet struct {
	all       bool
	databases map[string]bool
}

// holds reports whether the pools of database are paused.
func (s pauseSet) holds(database string) bool { return s.all || s.databases[database] }

// any reports whether anything is paused.
func (s pauseSet) any() bool { return s.all || len(s.databases) > 0 }

// Errors of PAUSE and RESUME, told to the console's caller as 55000.
var (
	errAlreadyPaused = errors.New("already paused: RESUME first")
	errNotPaused     = errors.New("not paused")
)

// pauseDatabases pauses the pools of database ("" for every database), as
// PgBouncer's PAUSE does: transactions in flight go on to their end,
// after which their server connections are closed; new transactions wait
// in line until RESUME (or their checkout_timeout). Pools made while the
// pause is on start paused. waitPaused tells when the pause has taken
// hold. Pausing a database twice is allowed (the second PAUSE waits
// again); pausing while everything is paused is an error, as in
// PgBouncer (src/admin.c, admin_cmd_pause).
func (p *Pooler) pauseDatabases(database string) error {
	var idle []*ServerConn
	p.poolsMu.Lock()
	if p.paused.all {
		p.poolsMu.Unlock()
		return errAlreadyPaused
	}
	if database == "" {
		p.paused.all = true
	} else {
		if p.paused.databases == nil {
			p.paused.databases = make(map[string]bool)
		}
		p.paused.databases[database] = true
	}
	for _, pool := range p.pools {
		if p.paused.holds(pool.key.database) {
			idle = append(idle, pool.pause()...)
		}
	}
	p.poolsMu.Unlock()
	for _, sc := range idle {
		sc.close()
	}
	return nil
}

// resumeDatabases ends the pause of database, or with "" every pause (the
// whole pooler's and each database's). Resuming one database while the
// whole pooler is paused is an error: it would stay paused.
func (p *Pooler) resumeDatabases(database string) error {
	p.poolsMu.Lock()
	defer p.poolsMu.Unlock()
	switch {
	case database == "" && !p.paused.any():
		return errNotPaused
	case database == "":
		p.paused = pauseSet{}
	case p.paused.all:
		return fmt.Errorf("%w: every database is paused; RESUME without a database ends that pause", errAlreadyPaused)
	case !p.paused.databases[database]:
		return fmt.Errorf("database %s is %w", database, errNotPaused)
	default:
		delete(p.paused.databases, database)
	}
	for _, pool := range p.pools {
		if !p.paused.holds(pool.key.database) {
			pool.resume() // a pool not paused is left as it is
		}
	}
	return nil
}

// pauseState reports what is paused now, for SHOW DATABASES and SHOW
// STATE.
func (p *Pooler) pauseState() pauseSet {
	p.poolsMu.Lock()
	defer p.poolsMu.Unlock()
	return pauseSet{all: p.paused.all, databases: maps.Clone(p.paused.databases)}
}

// pausePollInterval is how often waitPaused looks whether the pools have
// drained.
const pausePollInterval = 10 * time.Millisecond

// waitPaused waits until every pool of database ("" for all) holds no
// server connection, the pause having taken hold, or until ctx ends
// (its cause is returned) or the pooler shuts down.
func (p *Pooler) waitPaused(ctx context.Context, database string) error {
	ticker := time.NewTicker(pausePollInterval)
	defer ticker.Stop()
	for {
		drained := true
		for _, pool := range p.poolList() {
			if (database == "" || pool.key.database == database) && !pool.drained() {
				drained = false
				break
			}
		}
		if drained {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-p.done:
			return ErrServerClosed
		case <-ticker.C:
		}
	}
}
