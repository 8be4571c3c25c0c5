package config

import (
	"fmt"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// maxMilliseconds is the largest time that still fits a time.Duration.
const maxMilliseconds = Milliseconds(math.MaxInt64 / int64(time.Millisecond))

var metricNamespace = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)

// validate checks the decoded config and records every problem. Checks that
// need a file which could not be read or parsed are skipped, so one broken
// file does not produce a cascade of follow-on problems.
func (l *loader) validate(c *Config) {
	if l.main.parsed {
		l.validateGeneral(&c.General)
		l.validateDatabases(c)
	}
	if l.adminSource != nil {
		l.validateAdmin(c)
	}
	if l.users != nil && l.users.parsed {
		l.validateUsers(c)
	}
}

func (l *loader) validateGeneral(g *General) {
	src := l.main
	l.between(src, "general.port", g.Port, 1, 65535)
	if strings.ContainsAny(g.Host, "*, \t") {
		// PgBouncer's listen_addr takes "*" and comma-separated lists;
		// pgtender listens on one address (a name would only fail later,
		// at start, in the resolver).
		l.problem(src, "general.host", "%q is not one address: use \"0.0.0.0\" (every IPv4 address), \"::\" (every address, IPv4 too where the system maps it) or one address or host name", g.Host)
	}
	l.atLeast(src, "general.workers", g.Workers, 1)
	l.atLeast(src, "general.listen_backlog", g.ListenBacklog, 1)
	poolOK := l.atLeast(src, l.defaultPoolPath, g.DefaultPoolSize, 1)
	minOK := l.atLeast(src, "general.min_pool_size", g.MinPoolSize, 0)
	if poolOK && minOK && g.MinPoolSize > g.DefaultPoolSize {
		l.problem(src, "general.min_pool_size", "%d is larger than default_pool_size (%d)", g.MinPoolSize, g.DefaultPoolSize)
	}
	l.atLeast(src, "general.max_client_connections", g.MaxClientConnections, 0)
	l.between(src, "general.max_message_size", g.MaxMessageSize, 1024, 1<<30)
	l.atLeast(src, "general.max_logins_in_progress", g.MaxLoginsInProgress, 0)
	l.between(src, "general.openmetrics_port", g.OpenMetricsPort, 0, 65535)
	l.between(src, "general.healthcheck_port", g.HealthcheckPort, 0, 65535)
	if g.OpenMetricsNamespace != "" && !metricNamespace.MatchString(g.OpenMetricsNamespace) {
		l.problem(src, "general.openmetrics_namespace", "must be a Prometheus name prefix: letters, digits, '_' and ':', not starting with a digit")
	}

	l.poolerMode(src, "general.pooler_mode", g.PoolerMode)
	l.oneOf(src, "general.auth_type", string(g.AuthType), []string{"scram", "md5", "plain", "trust"}, nil)
	l.oneOf(src, "general.passthrough_auth", string(g.PassthroughAuth), []string{
		"disabled", "enabled", "enabled_plain", "enabled_allow_change", "enabled_plain_allow_change"}, nil)
	l.oneOf(src, "general.tls_verify", string(g.TLSVerify), []string{"disabled", "prefer", "verify_ca", "verify_full"}, nil)
	l.oneOf(src, "general.prepared_statements", g.PreparedStatements, []string{"disabled", "extended"}, []string{"extended_anonymous", "full"})
	l.atLeast(src, "general.prepared_statements_limit", g.PreparedStatementsLimit, 0)
	l.oneOf(src, "general.log_level", g.LogLevel, []string{"debug", "info", "warn", "error"}, nil)
	l.oneOf(src, "general.log_format", g.LogFormat, []string{"text", "json"}, nil)

	for _, t := range []struct {
		key string
		v   Milliseconds
		min Milliseconds // 1 where 0 would leave a wait unbounded
	}{
		{"connect_timeout", g.ConnectTimeout, 1},
		{"checkout_timeout", g.CheckoutTimeout, 1},
		{"client_login_timeout", g.ClientLoginTimeout, 1},
		{"rollback_timeout", g.RollbackTimeout, 1},
		{"stats_period", g.StatsPeriod, 1000},
		{"client_write_timeout", g.ClientWriteTimeout, 0},
		{"healthcheck_interval", g.HealthcheckInterval, 0},
		{"healthcheck_timeout", g.HealthcheckTimeout, 1},
		{"idle_healthcheck_interval", g.IdleHealthcheckInterval, 0},
		{"idle_healthcheck_delay", g.IdleHealthcheckDelay, 0},
		{"query_timeout", g.QueryTimeout, 0},
		{"client_idle_in_transaction_timeout", g.ClientIdleInTransactionTimeout, 0},
		{"idle_timeout", g.IdleTimeout, 0},
		{"server_lifetime", g.ServerLifetime, 0},
		{"shutdown_timeout", g.ShutdownTimeout, 0},
		{"shutdown_readiness_delay", g.ShutdownReadinessDelay, 0},
		{"passthrough_reverify_interval", g.PassthroughReverifyInterval, 0},
		{"login_queue_target", g.LoginQueueTarget, 1},
		{"login_queue_max_age", g.LoginQueueMaxAge, 0},
	} {
		l.milliseconds(src, "general."+t.key, t.v, t.min)
	}

	l.notInEffect(src, g)

	hasCert, hasKey := g.TLSCertificate != "", g.TLSPrivateKey != ""
	if hasCert && !hasKey {
		l.problem(src, "general.tls_certificate", "is set but tls_private_key is not; client TLS needs both")
	}
	if hasKey && !hasCert {
		l.problem(src, "general.tls_private_key", "is set but tls_certificate is not; client TLS needs both")
	}
	if g.TLSClientRequired && !g.ClientTLS() {
		l.problem(src, "general.tls_client_required", "requires client TLS: set tls_certificate and tls_private_key")
	}
	if g.PassthroughAuth.RequiresTLS() && !g.ClientTLS() {
		l.problem(src, "general.passthrough_auth",
			"%q needs client TLS (clients send cleartext passwords): set tls_certificate and tls_private_key, or use %q to accept cleartext passwords without TLS",
			g.PassthroughAuth, plainVariant(g.PassthroughAuth))
	}
	// The files are read here so that --check-config finds a wrong path or
	// a key that does not match its certificate; the pooler reads them
	// again when it starts and on each reload.
	if _, err := g.LoadCertificate(); err != nil {
		l.problem(src, "general.tls_certificate", "%v", err)
	}
	if _, err := g.LoadServerCA(); err != nil {
		l.problem(src, "general.tls_server_ca_certificate", "%v", err)
	}
}

func (l *loader) validateDatabases(c *Config) {
	src := l.main
	if len(c.Databases) == 0 {
		l.ps.add(src.path, 0, "databases", "at least one [[databases]] entry is required")
		return
	}
	first := map[string]int{}
	for i, d := range c.Databases {
		p := fmt.Sprintf("databases[%d]", i)
		switch {
		case !src.present[p+".name"]:
			l.problem(src, p+".name", "required: the database name clients connect to")
		case d.Name == "":
			l.problem(src, p+".name", "must not be empty")
		default:
			if j, dup := first[d.Name]; dup {
				l.problem(src, p+".name", "duplicate database name %q (first defined at line %d)", d.Name, c.Databases[j].Line)
			} else {
				first[d.Name] = i
			}
			if d.Name == c.Admin.Name {
				l.problem(src, p+".name", "%q is the admin console's database ([admin] name); clients could not reach this entry", d.Name)
			}
		}
		if d.Host == "" {
			l.problem(src, p+".host", "must not be empty")
		}
		l.between(src, p+".port", d.Port, 1, 65535)
		if src.present[p+".database_name"] && d.DatabaseName == "" {
			l.problem(src, p+".database_name", "must not be empty (leave it out to use name)")
		}
		if d.Password != "" && PasswordKindOf(d.Password) != PasswordPlain {
			l.problem(src, p+".password", "must be the plaintext password: pgtender logs in to Postgres with it, and cannot with an %s", PasswordKindOf(d.Password))
		}
		l.poolSizes(src, p, d.PoolSize, d.MinPoolSize, d.PoolerMode, c.General.DefaultPoolSize, c.General.MinPoolSize)
	}
}

func (l *loader) validateAdmin(c *Config) {
	src, a := l.adminSource, c.Admin
	if a.Name == "" {
		l.problem(src, "admin.name", "must not be empty")
	}
	if a.User == "" {
		l.problem(src, "admin.user", "must not be empty")
	}
	// The admin login always uses auth_type, passthrough or not (as in PgDog).
	if l.main.parsed {
		l.secretMatchesAuth(src, "admin.password", a.Password, c.General.AuthType)
	} else if PasswordKindOf(a.Password) == PasswordSCRAM {
		l.wellFormedSCRAM(src, "admin.password", a.Password)
	}
}

func (l *loader) validateUsers(c *Config) {
	src, g := l.users, &c.General
	needPassword := !g.PassthroughAuth.Enabled() && g.AuthType != AuthTrust
	first := map[userKey]int{}
	for i, u := range c.Users {
		p := fmt.Sprintf("users[%d]", i)
		nameOK, dbOK := l.required(src, p+".name", u.Name), l.required(src, p+".database", u.Database)
		db, dbExists := c.Database(u.Database)
		if dbOK && l.main.parsed && !dbExists {
			l.problem(src, p+".database", "no [[databases]] entry is named %q in %s", u.Database, l.main.path)
		}
		if nameOK && dbOK {
			k := userKey{u.Name, u.Database}
			if j, dup := first[k]; dup {
				l.problem(src, p+".name", "duplicate user %q for database %q (first defined at line %d)", u.Name, u.Database, c.Users[j].Line)
			} else {
				first[k] = i
			}
		}
		switch {
		case !l.main.parsed: // auth_type and passthrough_auth are unknown
			if PasswordKindOf(u.Password) == PasswordSCRAM {
				l.wellFormedSCRAM(src, p+".password", u.Password)
			}
		case u.Password == "" && needPassword:
			l.problem(src, p+".password", "required: passthrough_auth is %q and auth_type is %q", g.PassthroughAuth, g.AuthType)
		case !g.PassthroughAuth.Enabled():
			l.secretMatchesAuth(src, p+".password", u.Password, g.AuthType)
		case PasswordKindOf(u.Password) == PasswordSCRAM:
			l.wellFormedSCRAM(src, p+".password", u.Password)
		}
		if u.ServerPassword != "" && PasswordKindOf(u.ServerPassword) != PasswordPlain {
			l.problem(src, p+".server_password", "must be the plaintext password: pgtender logs in to Postgres with it, and cannot with an %s", PasswordKindOf(u.ServerPassword))
		}
		inheritSize, inheritMin := g.DefaultPoolSize, g.MinPoolSize
		if dbExists {
			if db.PoolSize > 0 {
				inheritSize = db.PoolSize
			}
			if db.MinPoolSize >= 0 {
				inheritMin = db.MinPoolSize
			}
		}
		l.poolSizes(src, p, u.PoolSize, u.MinPoolSize, u.PoolerMode, inheritSize, inheritMin)
	}
}

// poolSizes checks an entry's pool_size, min_pool_size and pooler_mode
// (each present only when written) and that the sizes it ends up with are
// consistent. A conflict is reported on the entry only when the entry sets
// one of the two sizes; otherwise it is the inherited level's problem.
func (l *loader) poolSizes(src *source, p string, size, minSize int, mode PoolerMode, inheritSize, inheritMin int) {
	sizeSet, minSet := src.present[p+".pool_size"], src.present[p+".min_pool_size"]
	sizeOK, minOK := true, true
	if sizeSet {
		sizeOK = l.atLeast(src, p+".pool_size", size, 1)
	}
	if minSet {
		minOK = l.atLeast(src, p+".min_pool_size", minSize, 0)
	}
	if src.present[p+".pooler_mode"] {
		l.poolerMode(src, p+".pooler_mode", mode)
	}
	if !sizeOK || !minOK || !(sizeSet || minSet) {
		return
	}
	if !sizeSet {
		size = inheritSize
	}
	if !minSet {
		minSize = inheritMin
	}
	if size < 1 || minSize < 0 || minSize <= size { // an invalid inherited value is reported where it is set
		return
	}
	if minSet {
		l.problem(src, p+".min_pool_size", "%d is larger than the pool size (%d)", minSize, size)
	} else {
		l.problem(src, p+".pool_size", "%d is smaller than the inherited min_pool_size (%d)", size, minSize)
	}
}

// secretMatchesAuth checks that a stored password can serve auth_type:
// SCRAM cannot be verified against an md5 secret, nor md5 against a SCRAM
// secret. plain works with every kind (pgtender hashes the cleartext).
func (l *loader) secretMatchesAuth(src *source, path, password string, auth AuthType) {
	switch kind := PasswordKindOf(password); {
	case kind == PasswordSCRAM:
		if l.wellFormedSCRAM(src, path, password) && auth == AuthMD5 {
			l.problem(src, path, `is a SCRAM secret, which cannot verify auth_type "md5"; use auth_type "scram", or a plaintext or md5 password`)
		}
	case kind == PasswordMD5 && auth == AuthSCRAM:
		l.problem(src, path, `is an md5 secret, which cannot verify auth_type "scram"; use auth_type "md5", or a plaintext or SCRAM password`)
	}
}

func (l *loader) wellFormedSCRAM(src *source, path, password string) bool {
	if _, err := ParseSCRAMSecret(password); err != nil {
		l.problem(src, path, "%v", err)
		return false
	}
	return true
}

func (l *loader) required(src *source, path, v string) bool {
	switch {
	case !src.present[path]:
		l.problem(src, path, "required")
	case v == "":
		l.problem(src, path, "must not be empty")
	default:
		return true
	}
	return false
}

func (l *loader) poolerMode(src *source, path string, m PoolerMode) {
	l.oneOf(src, path, string(m), []string{"transaction", "session"}, []string{"statement"})
}

// oneOf checks an enumerated value. allowed are the values pgtender reads;
// notYet are PgDog's values pgtender does not implement yet. Messages offer
// only the allowed values in effect: an allowed value listed in notInEffect
// is reported there.
func (l *loader) oneOf(src *source, path, v string, allowed, notYet []string) {
	var offer []string
	for _, a := range allowed {
		if !notInEffectValue(path, strconv.Quote(a)) {
			offer = append(offer, a)
		}
	}
	switch {
	case slices.Contains(allowed, v):
	case slices.Contains(notYet, v):
		l.problem(src, path, "%q is not supported by pgtender yet; use %s", v, quoteList(offer))
	default:
		l.problem(src, path, "%q is not one of %s", v, quoteList(offer))
	}
}

func (l *loader) atLeast(src *source, path string, v, lo int) bool {
	if v >= lo {
		return true
	}
	if lo == 0 {
		l.problem(src, path, "must not be negative")
	} else {
		l.problem(src, path, "must be at least %d", lo)
	}
	return false
}

func (l *loader) between(src *source, path string, v, lo, hi int) {
	if v < lo || v > hi {
		l.problem(src, path, "must be between %d and %d", lo, hi)
	}
}

func (l *loader) milliseconds(src *source, path string, v, lo Milliseconds) {
	switch {
	case v < lo && lo == 0:
		l.problem(src, path, "must not be negative")
	case v < lo:
		l.problem(src, path, "must be at least %d (milliseconds)", lo)
	case v > maxMilliseconds:
		l.problem(src, path, "must be at most %d (milliseconds)", maxMilliseconds)
	}
}

// plainVariant names the mode that behaves like p without requiring TLS.
func plainVariant(p PassthroughAuth) PassthroughAuth {
	if p == PassthroughEnabledAllowChange {
		return PassthroughEnabledPlainAllowChange
	}
	return PassthroughEnabledPlain
}

// notInEffect reports the keys of the notInEffect table set to a value
// whose feature is not built yet. A value already reported (a wrong type, a
// value out of range or not among the allowed ones) is not reported again.
func (l *loader) notInEffect(src *source, g *General) {
	fields := tagIndex(reflect.TypeFor[General]())
	for _, k := range notInEffect {
		key, ok := strings.CutPrefix(k.Key, "general.")
		f := fields[key]
		if !ok || f == nil {
			panic("config: notInEffect names no [general] key: " + k.Key)
		}
		v := formatValue(reflect.ValueOf(g).Elem().FieldByIndex(f.index), false)
		switch {
		case !k.notYet(v):
		case len(k.NotYet) > 0:
			l.problem(src, k.Key, "%s is not supported by pgtender yet (planned: %s); use %s", v, k.Why, k.NotYet[v])
		case k.Default == `""`:
			l.problem(src, k.Key, "not supported by pgtender yet (planned: %s); leave it out", k.Why)
		default:
			l.problem(src, k.Key, "not supported by pgtender yet (planned: %s); leave it out or set it to %s", k.Why, k.Default)
		}
	}
}

// notYet reports whether value (TOML text) of the key is not in effect yet.
func (k PlannedKey) notYet(value string) bool {
	if len(k.NotYet) == 0 {
		return value != k.Default
	}
	_, listed := k.NotYet[value]
	return listed
}

// notInEffectValue reports whether value (TOML text) of the key at path is
// not in effect yet.
func notInEffectValue(path, value string) bool {
	for _, k := range notInEffect {
		if k.Key == path {
			return k.notYet(value)
		}
	}
	return false
}
