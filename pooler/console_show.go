package pooler

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgtender/pgtender/auth"
	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/pooler/admin"
	"github.com/pgtender/pgtender/pooler/wire"
)

// consoleHelp is SHOW HELP's detail, PgBouncer's list (admin.c,
// admin_show_help) cut to the commands pgtender's console runs.
const consoleHelp = `
	SHOW HELP|CONFIG|DATABASES|POOLS|CLIENTS|SERVERS|USERS|VERSION
	SHOW STATS|STATS_TOTALS|STATS_AVERAGES|LISTS|STATE
	SHOW LOGINS|PREPARED_STATEMENTS
	PAUSE [<db>]
	RESUME [<db>]
	KILL_CLIENT <id>
	DISABLE <db>, ENABLE <db>
	RECONNECT [<db>]
	RELOAD
	SHUTDOWN
	SHUTDOWN WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS`

// consoleSettingAnswers are the one-column SHOWs PgBouncer answers for
// drivers that ask for a setting at connect (src/admin.c, fake_show and
// fake_param_list), with its values, except client_encoding: PgBouncer
// says "UTF-8" there, pgtender what the console's ParameterStatus said.
var consoleSettingAnswers = map[string]string{
	"client_encoding":               "UTF8",
	"default_transaction_isolation": "read committed",
	"standard_conforming_strings":   "on",
	"datestyle":                     "ISO",
	"timezone":                      "GMT",
}

// consoleShow appends the reply to SHOW subject (lower-cased).
func (p *Pooler) consoleShow(dst []byte, subject string) []byte {
	var result *admin.Result
	switch subject {
	case "help":
		dst = admin.AppendNotice(dst, "Console usage", consoleHelp)
		return wire.AppendCommandComplete(dst, "SHOW")
	case "pools":
		result = p.showPools()
	case "clients":
		result = p.showClients()
	case "servers":
		result = p.showServers()
	case "stats":
		result = p.showStats(admin.Stats, true, true)
	case "stats_totals":
		result = p.showStats(admin.StatsTotals, true, false)
	case "stats_averages":
		result = p.showStats(admin.StatsAverages, false, true)
	case "databases":
		result = p.showDatabases()
	case "users":
		result = p.showUsers()
	case "config":
		result = p.showConfig()
	case "lists":
		result = p.showLists()
	case "version":
		result = admin.Version.NewResult()
		result.Add(consoleVersion(p))
	case "state":
		result = p.showState()
	case "logins":
		result = p.showLogins()
	case "prepared_statements":
		result = p.showPreparedStatements()
	default:
		value, ok := consoleSettingAnswers[subject]
		if !ok {
			return consoleError(dst, sqlstateSyntaxError, fmt.Sprintf("unknown SHOW subject %q, use SHOW HELP;", subject))
		}
		result = &admin.Result{Columns: []admin.Column{{Name: subject, Type: admin.Text}}}
		result.Add(value)
	}
	return result.Append(dst, "SHOW")
}

// consoleVersion is what SHOW VERSION and server_version say.
func consoleVersion(p *Pooler) string {
	if hooks := p.consoleHooks.Load(); hooks != nil && hooks.Version != "" {
		return "pgtender " + hooks.Version
	}
	return "pgtender"
}

// consoleClient is what the console reads of one logged-in session.
type consoleClient struct {
	s       *session
	key     poolKey
	waiting time.Time // zero: not waiting for a server connection
	server  *ServerConn
	// applicationName and statements are the client's, read under s.mu.
	applicationName string
	statements      int
	// serverApplicationName and serverStatements are the linked server
	// connection's, read under s.mu, which guards them while it is linked.
	serverApplicationName string
	serverStatements      int
}

// consoleClients reads the logged-in sessions, in id order. A session
// that has not logged in is left out: its user and database are still
// being written by its serve goroutine.
func (p *Pooler) consoleClients() []consoleClient {
	sessions := p.sessionList()
	out := make([]consoleClient, 0, len(sessions))
	for _, s := range sessions {
		if !s.loggedIn.Load() {
			continue
		}
		c := consoleClient{s: s, key: poolKey{user: s.user, database: s.database}}
		s.mu.Lock()
		c.waiting = s.waitingSince
		c.server = s.server
		c.applicationName = s.settings["application_name"].value
		c.statements = len(s.statements)
		if c.server != nil {
			c.serverApplicationName = c.server.settings["application_name"].value
			c.serverStatements = c.server.statements.lru.Len()
		}
		s.mu.Unlock()
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b consoleClient) int { return cmp.Compare(a.s.processID, b.s.processID) })
	return out
}

// showPools is SHOW POOLS. cl_active counts the pool's logged-in clients
// that are not waiting, linked or not, as PgBouncer counts them (an idle
// client is "active" there), and cl_waiting those waiting: both from the
// sessions, so that a login waiting in the pool's queue for its first
// connection counts in neither. sv_active counts linked server
// connections, those whose client is idle in a transaction too
// (sv_idle_xact says how many). docs/admin.md lists the columns that are
// always 0.
func (p *Pooler) showPools() *admin.Result {
	clients := p.poolClients()
	result := admin.Pools.NewResult()
	for _, st := range sortedPoolStats(p.PoolStats()) {
		c := clients[poolKey{user: st.User, database: st.Database}]
		linked := st.ServersActive + st.ServersIdleInTransaction
		login := max(st.ServersTotal-st.ServersIdle-linked-st.ServersTested, 0)
		maxwait, maxwaitMicros := secondsAndMicros(st.MaxWait)
		result.Add(st.Database, st.User, c.active, c.waiting, 0, 0,
			linked, 0, 0, st.ServersIdle, 0, st.ServersTested, login,
			maxwait, maxwaitMicros, string(st.Mode), nil,
			st.ServersIdleInTransaction, st.ClientsPinned, st.Size)
	}
	return result
}

// poolClientCount is one pool's logged-in clients: waiting for a server
// connection, and the others.
type poolClientCount struct{ active, waiting int }

func (c poolClientCount) total() int { return c.active + c.waiting }

// poolClients counts the logged-in clients of each pool, the console's
// left out.
func (p *Pooler) poolClients() map[poolKey]poolClientCount {
	counts := make(map[poolKey]poolClientCount)
	for _, c := range p.consoleClients() {
		if c.s.console {
			continue
		}
		n := counts[c.key]
		if c.waiting.IsZero() {
			n.active++
		} else {
			n.waiting++
		}
		counts[c.key] = n
	}
	return counts
}

// secondsAndMicros splits d as PgBouncer's wait and wait_us columns do:
// whole seconds, and the microseconds beyond them.
func secondsAndMicros(d time.Duration) (int, int) {
	return int(d / time.Second), int(d % time.Second / time.Microsecond)
}

// sortedPoolStats orders pools by database, then user, as PgBouncer lists
// them.
func sortedPoolStats(stats []PoolStats) []PoolStats {
	slices.SortFunc(stats, func(a, b PoolStats) int {
		return cmp.Or(cmp.Compare(a.Database, b.Database), cmp.Compare(a.User, b.User))
	})
	return stats
}

// consoleTime is how the console writes a moment, in PgBouncer's format
// (lib/usual/time.c, format_time_s, for its 'T' columns), to the second;
// in UTC, where PgBouncer uses the local time zone.
func consoleTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

// addrParts splits an address into SHOW CLIENTS's addr and port.
func addrParts(addr net.Addr) (string, int) {
	if tcp, ok := addr.(*net.TCPAddr); ok {
		return tcp.IP.String(), tcp.Port
	}
	if addr == nil {
		return "", 0
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String(), 0
	}
	n, _ := strconv.Atoi(port)
	return host, n
}

// tlsText is SHOW CLIENTS's tls: the protocol version and cipher suite,
// empty for a plain connection.
func tlsText(conn net.Conn) string {
	tc, ok := conn.(*tls.Conn)
	if !ok {
		return ""
	}
	state := tc.ConnectionState()
	return strings.Replace(tls.VersionName(state.Version), "TLS ", "TLSv", 1) + "/" + tls.CipherSuiteName(state.CipherSuite)
}

// pointerText is SHOW CLIENTS's ptr and link: an address that names the
// object while it lives, empty for none.
func pointerText[T any](v *T) string {
	if v == nil {
		return ""
	}
	return fmt.Sprintf("%p", v)
}

// showClients is SHOW CLIENTS: one row per logged-in client, the console's
// included. A client's id is its BackendKeyData process id, which
// KILL_CLIENT takes; request_time is NULL (pgtender does not keep when a
// client last sent a request).
func (p *Pooler) showClients() *admin.Result {
	result := admin.Sockets.NewResult()
	now := time.Now()
	for _, c := range p.consoleClients() {
		s := c.s
		state := "active"
		var wait time.Duration
		if !c.waiting.IsZero() {
			state = "waiting"
			wait = now.Sub(c.waiting)
		}
		addr, port := addrParts(s.tcp.RemoteAddr())
		localAddr, localPort := addrParts(s.tcp.LocalAddr())
		waitSeconds, waitMicros := secondsAndMicros(wait)
		// s.conn is replaced only during login, which has ended.
		result.Add("C", s.user, s.database, "none", state, addr, port, localAddr, localPort,
			consoleTime(s.connectedAt), nil, waitSeconds, waitMicros, 0,
			pointerText(s), pointerText(c.server), 0, tlsText(s.conn), c.applicationName, c.statements, int64(s.processID))
	}
	return result
}

// showServers is SHOW SERVERS: the linked server connections (state
// active, with their client as link) and the idle ones (state idle,
// request_time when they went back to the pool). A connection being
// opened or health-checked is counted in SHOW POOLS but not listed. A
// server connection's id is its backend's pid, as remote_pid.
func (p *Pooler) showServers() *admin.Result {
	result := admin.Sockets.NewResult()
	type row struct {
		sc              *ServerConn
		client          *session
		requestTime     time.Time
		applicationName string
		statements      int
	}
	var rows []row
	for _, c := range p.consoleClients() {
		if c.server != nil {
			rows = append(rows, row{sc: c.server, client: c.s, applicationName: c.serverApplicationName, statements: c.serverStatements})
		}
	}
	pools := p.poolList()
	linked := make(map[*ServerConn]bool, len(rows))
	for _, r := range rows {
		linked[r.sc] = true
	}
	for _, pool := range pools {
		// The pool's lock guards its idle connections' fields: nothing
		// else touches a connection while it is idle.
		pool.mu.Lock()
		for _, sc := range pool.idle {
			if linked[sc] {
				continue // released since its client was read: listed once, as linked
			}
			rows = append(rows, row{sc: sc, requestTime: sc.idleSince,
				applicationName: sc.settings["application_name"].value, statements: sc.statements.lru.Len()})
		}
		pool.mu.Unlock()
	}
	slices.SortFunc(rows, func(a, b row) int {
		return cmp.Or(cmp.Compare(a.sc.pool.key.database, b.sc.pool.key.database),
			cmp.Compare(a.sc.pool.key.user, b.sc.pool.key.user), cmp.Compare(a.sc.processID, b.sc.processID))
	})
	for _, r := range rows {
		sc := r.sc
		state := "idle"
		var link string
		if r.client != nil {
			state = "active"
			link = pointerText(r.client)
		}
		addr, port := addrParts(sc.conn.RemoteAddr())
		localAddr, localPort := addrParts(sc.conn.LocalAddr())
		result.Add("S", sc.pool.key.user, sc.pool.key.database, "none", state, addr, port, localAddr, localPort,
			consoleTime(sc.createdAt), consoleTime(r.requestTime), 0, 0, 0,
			pointerText(sc), link, int64(sc.processID), tlsText(sc.conn), r.applicationName, r.statements, int64(sc.processID))
	}
	return result
}

// showDatabases is SHOW DATABASES, from the running configuration; the
// console's own database is not listed. current_connections counts the
// database's open server connections and current_client_connections its
// logged-in clients.
func (p *Pooler) showDatabases() *admin.Result {
	cfg := p.state.Load().cfg
	servers := make(map[string]int)
	for _, st := range p.PoolStats() {
		servers[st.Database] += st.ServersTotal
	}
	clients := make(map[string]int)
	for key, c := range p.poolClients() {
		clients[key.database] += c.total()
	}
	paused := p.pauseState()
	result := admin.Databases.NewResult()
	for _, db := range sortedDatabases(cfg) {
		serverDatabase := cmp.Or(db.DatabaseName, db.Name)
		poolSize := cmp.Or(db.PoolSize, cfg.General.DefaultPoolSize)
		minPoolSize := db.MinPoolSize
		if minPoolSize < 0 {
			minPoolSize = cfg.General.MinPoolSize
		}
		mode := cmp.Or(db.PoolerMode, cfg.General.PoolerMode)
		result.Add(db.Name, db.Host, db.Port, serverDatabase, db.User, poolSize, minPoolSize, 0,
			int(cfg.General.ServerLifetime.Duration()/time.Second), string(mode), nil,
			0, servers[db.Name], 0, clients[db.Name], zeroOne(paused.holds(db.Name)), zeroOne(p.databaseDisabled(db.Name)))
	}
	return result
}

func sortedDatabases(cfg *config.Config) []config.Database {
	dbs := slices.Clone(cfg.Databases)
	slices.SortStableFunc(dbs, func(a, b config.Database) int { return cmp.Compare(a.Name, b.Name) })
	return dbs
}

// showUsers is SHOW USERS: the users.toml entries, then the users the
// passthrough registry holds a verified password for. A user has a row
// per database, since its entries and pools are per (user, database).
func (p *Pooler) showUsers() *admin.Result {
	cfg := p.state.Load().cfg
	servers := make(map[poolKey]int)
	for _, st := range p.PoolStats() {
		servers[poolKey{user: st.User, database: st.Database}] += st.ServersTotal
	}
	clients := p.poolClients()
	type entry struct {
		key    poolKey
		source string
	}
	var entries []entry
	seen := make(map[poolKey]bool)
	for _, u := range cfg.Users {
		key := poolKey{user: u.Name, database: u.Database}
		entries = append(entries, entry{key, "users.toml"})
		seen[key] = true
	}
	passthrough := p.registry.Keys()
	slices.SortFunc(passthrough, func(a, b auth.Key) int {
		return cmp.Or(cmp.Compare(a.User, b.User), cmp.Compare(a.Database, b.Database))
	})
	for _, k := range passthrough {
		if key := (poolKey{user: k.User, database: k.Database}); !seen[key] {
			entries = append(entries, entry{key, "passthrough"})
			seen[key] = true
		}
	}
	result := admin.Users.NewResult()
	for _, e := range entries {
		settings, ok := cfg.PoolSettings(e.key.user, e.key.database)
		var poolSize, mode any
		if ok {
			poolSize, mode = strconv.Itoa(settings.PoolSize), string(settings.PoolerMode)
		}
		result.Add(e.key.user, poolSize, "0", mode, 0, servers[e.key], 0, clients[e.key].total(), e.key.database, e.source)
	}
	return result
}

// showConfig is SHOW CONFIG: the [general] and [admin] keys, secrets
// masked.
func (p *Pooler) showConfig() *admin.Result {
	result := admin.Config.NewResult()
	for _, s := range p.state.Load().cfg.Settings() {
		changeable := "no"
		if s.Changeable {
			changeable = "yes"
		}
		result.Add(s.Key, s.Value, s.Default, changeable)
	}
	return result
}

// showLists is SHOW LISTS, PgBouncer's rows (admin.c, admin_show_lists)
// counted from pgtender's structures: pgtender keeps no free lists, so
// free_clients and free_servers are 0; dns_* are 0 because it resolves
// through Go's resolver without a cache of its own.
func (p *Pooler) showLists() *admin.Result {
	cfg := p.state.Load().cfg
	var loggedIn, linked int
	for _, c := range p.consoleClients() {
		loggedIn++
		if c.server != nil {
			linked++
		}
	}
	stats := p.PoolStats()
	var idle int
	for _, st := range stats {
		idle += st.ServersIdle
	}
	users := make(map[poolKey]bool, len(cfg.Users))
	for _, u := range cfg.Users {
		users[poolKey{user: u.Name, database: u.Database}] = true
	}
	for _, k := range p.registry.Keys() {
		users[poolKey{user: k.User, database: k.Database}] = true
	}
	result := admin.Lists.NewResult()
	result.Add("databases", len(cfg.Databases))
	result.Add("users", len(users))
	result.Add("peers", 0)
	result.Add("pools", len(stats))
	result.Add("peer_pools", 0)
	result.Add("free_clients", 0)
	result.Add("used_clients", loggedIn)
	result.Add("login_clients", max(int(p.clientCount.Load())-loggedIn, 0))
	result.Add("free_servers", 0)
	result.Add("used_servers", linked+idle)
	result.Add("dns_names", 0)
	result.Add("dns_zones", 0)
	result.Add("dns_queries", 0)
	result.Add("dns_pending", 0)
	return result
}

// zeroOne is SHOW DATABASES's paused and disabled: 1 or 0.
func zeroOne(b bool) int {
	if b {
		return 1
	}
	return 0
}

// showState is SHOW STATE, as PgBouncer's (src/admin.c, show_state):
// active when nothing pauses the whole pooler, paused when PAUSE without
// a database does (a database's own pause shows in SHOW DATABASES),
// suspended never (SUSPEND is not supported), and shutting down.
func (p *Pooler) showState() *admin.Result {
	yesNo := func(b bool) string {
		if b {
			return "yes"
		}
		return "no"
	}
	pausedAll := p.pauseState().all
	result := admin.State.NewResult()
	result.Add("active", yesNo(!pausedAll))
	result.Add("paused", yesNo(pausedAll))
	result.Add("suspended", "no")
	result.Add("shutting_down", yesNo(p.draining.Load() || p.notAccepting.Load()))
	return result
}

// showPreparedStatements is pgtender's SHOW PREPARED_STATEMENTS: the
// statements each pool's registry holds (prepared.go), pools ordered as
// in SHOW POOLS, statements by name. The registry holds statements of
// pools whose prepared_statements renaming is on; a statement a client
// prepared stays its client's after the registry forgets it, and is not
// listed then.
func (p *Pooler) showPreparedStatements() *admin.Result {
	result := admin.PreparedStatements.NewResult()
	pools := p.poolList()
	slices.SortFunc(pools, func(a, b *Pool) int {
		return cmp.Or(cmp.Compare(a.key.database, b.key.database), cmp.Compare(a.key.user, b.key.user))
	})
	for _, pool := range pools {
		for _, stmt := range pool.statements.list() {
			result.Add(pool.key.database, pool.key.user, stmt.name, stmt.searchPath, stmt.parameters,
				zeroOne(stmt.prepared), stmt.bytes, stmt.query)
		}
	}
	return result
}

// showLogins is pgtender's SHOW LOGINS: the login figures the metrics
// export, for an operator with only psql at hand during a login storm.
func (p *Pooler) showLogins() *admin.Result {
	result := admin.Logins.NewResult()
	result.Add("clients", p.clientCount.Load())
	result.Add("login_slots", int64(cap(p.loginSlots.held)))
	result.Add("login_slots_held", int64(len(p.loginSlots.held)))
	result.Add("shed_no_login_slot", int64(p.shedCounts.noLoginSlot.Load()))
	result.Add("shed_queue_age", int64(p.shedCounts.queueAge.Load()))
	result.Add("shed_slow_client", int64(p.shedCounts.slowClient.Load()))
	if hooks := p.consoleHooks.Load(); hooks != nil && hooks.Logins != nil {
		for _, f := range hooks.Logins() {
			result.Add(f.Name, f.Value)
		}
	}
	return result
}
