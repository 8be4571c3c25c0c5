package pooler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/pooler/sqlscan"
	"github.com/pgtender/pgtender/pooler/wire"
)

// How a client's session settings follow it (params.go has the model):
// the startup packet's are checked with Postgres at login
// (startupSettings); they, and whatever the client set since, are brought
// onto each server connection it is linked to (alignServer); and after a
// transaction that may have changed them, the server connection is probed
// before it goes back to the pool (probeAtRest).

// Startup parameters that are not settings: the protocol's own, and
// options, whose -c switches are.
func isProtocolParameter(name string) bool {
	switch strings.ToLower(name) {
	case "user", "database", "options", "replication":
		return true
	}
	return strings.HasPrefix(name, "_pq_.")
}

// startupSettingsOf collects the settings a startup packet asks for: its
// run-time parameters and the -c switches of its options, later ones
// winning as in Postgres (options are applied after the other parameters,
// postinit.c process_startup_options). An options value Postgres would not
// parse is refused as Postgres refuses it.
func startupSettingsOf(startup *wire.Startup) (sessionSettings, *clientError) {
	var settings sessionSettings
	var options string
	for _, param := range startup.Parameters {
		if strings.EqualFold(param.Name, "options") {
			options = param.Value
			continue
		}
		if isProtocolParameter(param.Name) {
			continue
		}
		if settings == nil {
			settings = make(sessionSettings)
		}
		settings.set(param.Name, param.Value)
	}
	if options != "" {
		switches, err := wire.ParseStartupOptions(options)
		if err != nil {
			return nil, fatalError(sqlstateSyntaxError, err.Error(), err)
		}
		for _, sw := range switches {
			if settings == nil {
				settings = make(sessionSettings)
			}
			settings.set(sw.Name, sw.Value)
		}
	}
	return settings, nil
}

// validSettings remembers, per pool, the startup settings Postgres accepted
// and the value it canonicalised each to, so that a fleet whose clients
// all send the same parameters pays for the check once.
type validSettings struct {
	mu     sync.RWMutex
	values map[setting]string // (name, value as sent) → value as Postgres spells it
}

// maxValidSettings bounds the memory a stream of distinct values (every
// client its own application_name) can take; past it, values are checked
// at every login that sends them.
const maxValidSettings = 4096

func (v *validSettings) lookup(s setting) (string, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	value, ok := v.values[s]
	return value, ok
}

func (v *validSettings) store(s setting, canonical string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.values == nil {
		v.values = make(map[setting]string)
	}
	if len(v.values) < maxValidSettings {
		v.values[s] = canonical
	}
}

// sharedSettings holds a few canonical startup settings for sessions to
// share: a fleet's clients send the same startup packet, and a session
// holding a map of its own would pay for it as long as it stays connected,
// idle or not. Sharing is safe because a sessionSettings is never changed
// in place once built (a change makes a new one: overlaid). An entry is
// only ever a map built from validSettings, which keeps a value Postgres
// accepted for the pool's lifetime, so it is never stale; a set of settings
// not among them is built as before and replaces the oldest entry.
type sharedSettings struct {
	entries [sharedSettingsEntries]atomic.Pointer[sessionSettings]
	next    atomic.Uint32
}

const sharedSettingsEntries = 4

// find returns the shared canonical form of settings (the settings of a
// startup packet), or nil when none is held. A setting matches when
// validSettings gives its value as the entry holds it, under the name the
// client spelled.
func (shared *sharedSettings) find(settings sessionSettings, valid *validSettings) sessionSettings {
	var candidates [sharedSettingsEntries]sessionSettings
	matching := false
	for i := range shared.entries {
		if entry := shared.entries[i].Load(); entry != nil && len(*entry) == len(settings) {
			candidates[i], matching = *entry, true
		}
	}
	if !matching {
		return nil
	}
	for key, s := range settings {
		value, ok := valid.lookup(s)
		if !ok {
			return nil
		}
		matching = false
		for i, candidate := range candidates {
			if candidate == nil {
				continue
			}
			if got, ok := candidate[key]; !ok || got.name != s.name || got.value != value {
				candidates[i] = nil
				continue
			}
			matching = true
		}
		if !matching {
			return nil
		}
	}
	for _, candidate := range candidates {
		if candidate != nil {
			return candidate
		}
	}
	return nil
}

// add makes canonical shared, in place of the oldest entry.
func (shared *sharedSettings) add(canonical sessionSettings) {
	i := (shared.next.Add(1) - 1) % sharedSettingsEntries
	shared.entries[i].Store(&canonical)
}

// checkStartupSettings asks Postgres whether it accepts the settings a
// client's startup packet asks for, on a server connection of the pool,
// with set_config(…, true) in a statement of its own (so nothing stays
// set), and returns them spelled as Postgres spells them. A setting
// Postgres refuses is refused at login with Postgres's own SQLSTATE and
// message, as a direct connection would be, instead of being admitted and
// then failing the client's every statement. Settings already checked are
// taken from the pool's cache.
func (p *Pool) checkStartupSettings(ctx context.Context, settings sessionSettings) (sessionSettings, error) {
	if shared := p.sharedSettings.find(settings, &p.validSettings); shared != nil {
		return shared, nil
	}
	var unchecked []setting
	canonical := make(sessionSettings, len(settings))
	for key, s := range settings {
		if value, ok := p.validSettings.lookup(s); ok {
			canonical[key] = setting{name: s.name, value: value}
			continue
		}
		unchecked = append(unchecked, s)
	}
	if len(unchecked) == 0 {
		p.sharedSettings.add(canonical)
		return canonical, nil
	}
	var sql strings.Builder
	sql.WriteString(ownQueryPrefix + "SELECT ")
	for i, s := range unchecked {
		if i > 0 {
			sql.WriteString(", ")
		}
		sql.WriteString("pg_catalog.set_config(" + quoteLiteral(s.name) + ", " + quoteLiteral(s.value) + ", true)")
	}
	sc, err := p.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(p.settings.Load().rollbackTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var values []string
	_, err = sc.query(sql.String(), deadline, func(row [][]byte) error {
		for _, value := range row {
			values = append(values, string(value))
		}
		return nil
	}, nil)
	if _, refused := errors.AsType[*serverError](err); err != nil && !refused {
		p.Discard(sc)
		return nil, err
	}
	p.Release(sc)
	if err != nil {
		return nil, err
	}
	if len(values) != len(unchecked) {
		return nil, fmt.Errorf("checking startup settings: %d values for %d settings", len(values), len(unchecked))
	}
	for i, s := range unchecked {
		p.validSettings.store(s, values[i])
		canonical[settingKey(s.name)] = setting{name: s.name, value: values[i]}
		if isCustomSetting(s.name) {
			p.customNames.learn(s.name) // the client's own are probed anyway when the pool is full
		}
	}
	p.sharedSettings.add(canonical)
	return canonical, nil
}

// startupSettingsError is what a client sees when checking its startup
// settings failed: Postgres's refusal as Postgres would have sent it (a
// FATAL at login), or the failure to check.
func (s *session) startupSettingsError(err error) *clientError {
	if refused, ok := errors.AsType[*serverError](err); ok {
		code := refused.code
		if code == sqlstateCantChangeRuntimeParam {
			// A parameter Postgres takes only at connection start: pgtender
			// cannot give it to a server connection that is already open.
			code = sqlstateFeatureNotSupported
		}
		return &clientError{severity: wire.SeverityFatal, code: code, message: refused.message, err: err, result: LoginRejected}
	}
	return s.checkoutError(err)
}

// alignServer brings a server connection the client is about to be linked
// to in line with the client's settings, in one round trip when they
// differ and none when they agree. It is called before the link is made,
// by the serve goroutine, which owns sc until it links it.
func (s *session) alignServer(sc *ServerConn) error {
	s.mu.Lock()
	want := s.settings
	s.mu.Unlock()
	statements := alignStatements(want, sc.settings)
	if statements == "" {
		return nil
	}
	if err := sc.exec(ownQueryPrefix+statements, sc.pool.settings.Load().rollbackTimeout); err != nil {
		// Part of it may have run: what the connection carries is unknown.
		return err
	}
	sc.settings = want // shared, never changed in place
	return nil
}

// probeDueLocked reports whether the link's server connection must be probed
// before it is released. s.mu must be held.
func (s *session) probeDueLocked() bool {
	return s.mode == config.PoolerModeTransaction && (s.settingsMayHaveChanged || s.pinned)
}

// probeAtRest probes sc, which is at rest, and takes in what it found:
// the client's settings become what the server says it now has, on top of
// the startup ones (a RESET or DISCARD ALL goes back to those, as in
// Postgres); and the server connection is pinned to the client while its
// session holds what cannot follow the client (sessionPins). It reports
// whether sc may go back to the pool. The serve goroutine does not write
// to sc meanwhile (s.probing). s.mu must be held on entry and is held on
// return; it is released during the probe.
func (s *session) probeAtRest(sc *ServerConn) (release bool, err error) {
	if s.untrackedSettings {
		// Nothing a probe finds could let sc go to another client.
		s.settingsMayHaveChanged = false
		s.pinLocked(sc, zap.String("holds", "a custom parameter set under a name pgtender cannot see"))
		return false, nil
	}
	s.probing = true
	s.settingsMayHaveChanged = false
	customNames := s.customNamesToProbe(sc)
	s.mu.Unlock()

	result, leftover, err := sc.probe(customNames, func(notification []byte) { _ = s.write(notification) })

	s.mu.Lock()
	s.probing = false
	s.readBudget = false // the probe's deadlines replaced it
	s.cond.Broadcast()
	if s.woken {
		// A wake-up came during the probe: one that ends the session
		// (finish, forceClose), whose deadline the probe's own replaced,
		// or one only noted (wakeReaderLocked): give it now.
		s.wakeReaderLocked(sc)
	}
	if err != nil {
		return false, fmt.Errorf("probing the session's state: %w", err)
	}
	sc.settings = result.settings
	s.settings = result.settings.overlaid(s.startupSettings)
	if result.pins.any() {
		s.pinLocked(sc, zap.Stringer("holds", result.pins))
	} else {
		s.unpinLocked(sc)
	}
	if leftover > 0 {
		// Notifications that came after the probe's reply: the client's.
		if err := s.write(sc.buf[:leftover]); err != nil {
			return false, err
		}
	}
	return !s.pinned, nil
}

// probe runs the probe on sc, which is at rest, within rollback_timeout;
// see query for notify and leftover.
func (sc *ServerConn) probe(customNames []string, notify func([]byte)) (result probeResult, leftover int, err error) {
	deadline := time.Now().Add(sc.pool.settings.Load().rollbackTimeout)
	query := probeQuery(customNames)
	leftover, err = sc.query(query, deadline, result.takeProbeRow, notify)
	if refused, ok := errors.AsType[*serverError](err); ok && refused.code == sqlstateQueryCanceled {
		// The probe's first statement, which reads the timeouts before
		// overriding them, runs under the client's statement_timeout,
		// which a very small one can cancel. Its transaction rolled back,
		// so it is run again, once; the retry can be cancelled the same
		// way.
		result = probeResult{}
		leftover, err = sc.query(query, deadline, result.takeProbeRow, notify)
	}
	result.finish()
	return result, leftover, err
}

// pinLocked pins sc to the client, if it is not already, counting and
// logging it with what the session holds. s.mu must be held.
func (s *session) pinLocked(sc *ServerConn, holds zap.Field) {
	if s.pinned {
		return
	}
	s.pinned = true
	sc.pool.stats.pinnedClients.Add(1)
	s.pooler.log.Info("server connection pinned to its client", s.logFields(holds)...)
}

// unpinLocked ends a pin of sc to the client, if any. s.mu must be held.
func (s *session) unpinLocked(sc *ServerConn) {
	if s.pinned {
		s.pinned = false
		sc.pool.stats.pinnedClients.Add(-1)
	}
}

// customSettings are the custom parameters ("app.tenant": a name with a
// dot, which pg_settings does not list) seen set by any client of a pool.
// The probe asks for each by name: a name learnt from one client's SET
// also covers another client that sets it where pgtender cannot see (in
// a function), as long as one client showed it and that transaction is
// probed for another reason (a custom parameter sends no ParameterStatus).
// The set only grows, up to maxCustomSettings.
type customSettings struct {
	mu    sync.Mutex
	names atomic.Pointer[[]string] // sorted; replaced, never changed in place
}

// maxCustomSettings bounds the names a pool probes for, and those a
// client is known to set (session.ownCustomNames). An application uses a
// handful. Past the pool's bound a client's own names are still probed for
// it; past the client's, it is pinned to its server connection as if it
// had set one pgtender cannot name (session.untrackedSettings).
const maxCustomSettings = 64

// list returns the names; the slice must not be changed.
func (c *customSettings) list() []string {
	if names := c.names.Load(); names != nil {
		return *names
	}
	return nil
}

// learn adds name (lower-cased) and reports whether the set holds it.
func (c *customSettings) learn(name string) bool {
	name = settingKey(name)
	names := c.list()
	if _, found := slices.BinarySearch(names, name); found {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	names = c.list()
	i, found := slices.BinarySearch(names, name)
	if found {
		return true
	}
	if len(names) >= maxCustomSettings {
		return false
	}
	grown := slices.Insert(slices.Clone(names), i, name)
	c.names.Store(&grown)
	return true
}

// isCustomSetting reports whether a parameter name is a custom one, which
// pg_settings does not show.
func isCustomSetting(name string) bool { return strings.Contains(name, ".") }

// customSettingNames lists the custom parameters the probe must ask for by
// name: those any client of the pool set, and those the client or the
// server connection carry (a pool that stopped learning still probes its
// clients' own); customNamesToProbe adds the names the client was seen to
// set.
func customSettingNames(pool *Pool, client, server sessionSettings) []string {
	names := pool.customNames.list()
	for _, settings := range []sessionSettings{client, server} {
		for key := range settings {
			if isCustomSetting(key) && !slices.Contains(names, key) {
				names = append(slices.Clip(names), key)
			}
		}
	}
	return names
}

// customNamesToProbe lists the custom parameters a probe of sc, linked to
// the client, must ask for: customSettingNames, and the names the client
// was seen to set, whose values no probe may have read yet. s.mu must be
// held, or the caller be the serve goroutine once no readServer runs.
func (s *session) customNamesToProbe(sc *ServerConn) []string {
	names := customSettingNames(sc.pool, s.settings, sc.settings)
	for _, name := range s.ownCustomNames {
		if !slices.Contains(names, name) {
			names = append(slices.Clip(names), name)
		}
	}
	return names
}

// noteCustomSettings takes in the custom parameters a text the client sent
// sets at session level, as the SQL scanner captured them (feedText), before
// the text goes to a server: each becomes one of the client's own names,
// probed for it from then on, and is shared with the pool's other clients
// (customSettings), whose probes then find it even when one of them sets it
// where its text does not show it. A text that may set one whose name it
// does not show (sqlscan.Effects.MaySetUnnamedCustom) marks the client for
// good (untrackedSettings). Only transaction mode needs it: a session-mode
// server connection is reset with DISCARD ALL when its client leaves.
//
// It runs on the serve goroutine, the only writer of ownCustomNames, and
// allocates only for a name the client had not set before.
func (s *session) noteCustomSettings(effects sqlscan.Effects) {
	if s.mode != config.PoolerModeTransaction {
		return
	}
	untracked := effects.MaySetUnnamedCustom()
	own := s.ownCustomNames
	var added []string
	for i := range s.sql.NumCustomNames() {
		name := s.sql.CustomName(i)
		if containsCustomName(own, name) { // the scanner reports each name once per text
			continue
		}
		key := settingKey(string(name))
		s.pool.customNames.learn(key)
		if len(own)+len(added) >= maxCustomSettings {
			untracked = true
			continue
		}
		added = append(added, key)
	}
	if len(added) == 0 && (!untracked || s.untrackedSettings) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(added) > 0 {
		s.ownCustomNames = append(slices.Clip(own), added...)
	}
	if untracked {
		// Pinned from the next release point on (probeAtRest), closed
		// when the client leaves (returnServer).
		s.untrackedSettings = true
	}
}

// containsCustomName reports whether names (lower-cased) holds name,
// compared as Postgres compares parameter names: ASCII letters without
// regard to case (guc_name_compare in src/backend/utils/misc/guc.c).
func containsCustomName(names []string, name []byte) bool {
	for _, known := range names {
		if len(known) != len(name) {
			continue
		}
		equal := true
		for i := 0; i < len(name) && equal; i++ {
			c := name[i]
			if c >= 'A' && c <= 'Z' {
				c += 'a' - 'A'
			}
			equal = c == known[i]
		}
		if equal {
			return true
		}
	}
	return false
}
