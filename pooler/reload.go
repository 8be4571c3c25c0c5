package pooler

import (
	"go.uber.org/zap"

	"github.com/pgtender/pgtender/config"
)

// Reload applies a new configuration. Pools whose server endpoint and mode
// are unchanged keep their connections and take new sizes in place; pools
// whose endpoint or mode changed are closed (linked connections close when
// their clients let go of them) and created again on next use, each
// client moving to the new pool, and taking its mode, at its next
// transaction (session.followReplacedPool); pools whose database or user
// is gone are closed and their clients drained (endRemovedSessions).
// Passthrough users learned at run time are
// kept while their database exists; a user removed from users.toml is
// removed under passthrough too: its pool is closed and its verified
// password forgotten, so its next login is verified against Postgres
// again (with the pool settings it now gets). Keys that need a restart
// are logged.
func (p *Pooler) Reload(cfg *config.Config) error {
	// SIGHUP and the console's RELOAD may come at once: each applies its
	// configuration against the one the other left.
	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	old := p.state.Load()
	diff := config.Diff(old.cfg, cfg)
	if cfg.General.PassthroughAuth != old.cfg.General.PassthroughAuth {
		// passthrough_auth changes only on restart: the registry and every
		// pool were built for the running mode, so keep it.
		running := *cfg
		running.General.PassthroughAuth = old.cfg.General.PassthroughAuth
		cfg = &running
	}
	state, err := newRuntimeState(cfg)
	if err != nil {
		return err
	}
	if len(diff.RestartRequired) > 0 {
		p.log.Warn("reload: these settings change only on restart", zap.Strings("keys", diff.RestartRequired))
	}
	p.state.Store(state)

	// removed reports whether users.toml had an entry for (user, database)
	// before this reload and has none now.
	removed := func(user, database string) bool {
		_, was := old.cfg.User(user, database)
		_, is := cfg.User(user, database)
		return was && !is
	}
	p.poolsMu.Lock()
	var closed, removedPools []*Pool
	for key, pool := range p.pools {
		endpoint, settings, ok := poolConfig(cfg, key)
		ok = ok && servesPool(cfg, key)
		if removed(key.user, key.database) {
			ok = false
		}
		if !ok || endpoint != pool.endpoint || settings.mode != pool.settings.Load().mode {
			delete(p.pools, key)
			closed = append(closed, pool)
			if !ok {
				pool.removed.Store(true) // before close: a session that sees it retired sees this too
				removedPools = append(removedPools, pool)
			}
			continue
		}
		pool.resize(settings)
	}
	p.publishPoolsLocked()
	p.poolsMu.Unlock()
	for _, pool := range closed {
		pool.close()
	}
	p.endRemovedSessions(removedPools)
	p.createConfiguredPools()
	for _, key := range p.registry.Keys() {
		if _, ok := cfg.Database(key.Database); !ok || removed(key.User, key.Database) {
			p.registry.Forget(key)
		}
	}
	p.log.Info("configuration reloaded", zap.Int("changed_keys", len(diff.Changed)), zap.Int("pools_closed", len(closed)))
	return nil
}

// endRemovedSessions drains the sessions of pools a reload removed, as
// the SIGTERM drain does for all: one in no transaction is told FATAL
// 57P01 and closed now, and one in a transaction when it ends
// (session.endIfLeaving); new logins to a removed database get 3D000.
// PgBouncer closes such clients at once, transactions and all
// (src/janitor.c, kill_database); a reload is not meant to cut a
// transaction.
func (p *Pooler) endRemovedSessions(removed []*Pool) {
	if len(removed) == 0 {
		return
	}
	keys := make(map[poolKey]bool, len(removed))
	names := make([]string, 0, len(removed))
	for _, pool := range removed {
		keys[pool.key] = true
		names = append(names, pool.key.String())
	}
	p.log.Info("reload removed pools: their clients are ended, each when its transaction in flight ends", zap.Strings("pools", names))
	for _, s := range p.sessionList() {
		// user and database are written before loggedIn is set; a session
		// still logging in finds its pool gone (3D000) or ends at its first
		// transaction (followReplacedPool).
		if !s.loggedIn.Load() || s.console {
			continue
		}
		if key := (poolKey{user: s.user, database: s.database}); keys[key] {
			s.endIfIdleBecause(removedMessage(key))
		}
	}
}
