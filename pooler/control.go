package pooler

import (
	"maps"
	"time"
)

// The admin console's control of databases (console.go runs the
// commands): DISABLE and ENABLE, which refuse and admit new logins, and
// RECONNECT, which replaces server connections. Both act on the running
// pooler, not on the configuration: a reload leaves a DISABLEd database
// disabled, and a restart enables it.

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
