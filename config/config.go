// Package config holds pgtender's configuration: the PgDog-compatible
// pgdog.toml and users.toml formats, their defaults, strict decoding,
// validation and the difference between two loaded configurations.
//
// A *Config returned by Load is validated and must be treated as immutable:
// a reload builds a new *Config and the pooler applies the difference.
//
// Struct tags drive decoding, the redacted dump and the reload diff:
// `toml:"key"` is the PgDog key name, `secret:"true"` marks a password
// (never printed), `restart:"true"` marks a key a reload cannot change.
//
// Some keys are read but their feature is not built yet; Load accepts them
// only at their default (see notInEffect in keys.go).
package config

import (
	"runtime"
	"time"
)

// PoolerMode is how server connections are shared between clients.
type PoolerMode string

const (
	// PoolerModeTransaction links a server connection to a client for one
	// transaction (or one statement outside a transaction).
	PoolerModeTransaction PoolerMode = "transaction"
	// PoolerModeSession links a server connection to a client for the
	// client's whole session; it is reset with DISCARD ALL on return.
	PoolerModeSession PoolerMode = "session"
)

// AuthType is how configured users authenticate to pgtender.
type AuthType string

const (
	AuthSCRAM AuthType = "scram"
	AuthMD5   AuthType = "md5"
	AuthPlain AuthType = "plain"
	AuthTrust AuthType = "trust"
)

// PassthroughAuth says whether clients' passwords are checked against
// Postgres itself instead of users.toml, with PgDog's names.
type PassthroughAuth string

const (
	PassthroughDisabled                PassthroughAuth = "disabled"
	PassthroughEnabled                 PassthroughAuth = "enabled"
	PassthroughEnabledPlain            PassthroughAuth = "enabled_plain"
	PassthroughEnabledAllowChange      PassthroughAuth = "enabled_allow_change"
	PassthroughEnabledPlainAllowChange PassthroughAuth = "enabled_plain_allow_change"
)

// Enabled reports whether passthrough authentication is on in any form.
func (p PassthroughAuth) Enabled() bool { return p != "" && p != PassthroughDisabled }

// AllowsChange reports whether a client may present a password different
// from the verified one (it is verified against Postgres before use).
func (p PassthroughAuth) AllowsChange() bool {
	return p == PassthroughEnabledAllowChange || p == PassthroughEnabledPlainAllowChange
}

// RequiresTLS reports whether the mode needs client TLS (the non-plain modes).
func (p PassthroughAuth) RequiresTLS() bool {
	return p == PassthroughEnabled || p == PassthroughEnabledAllowChange
}

// TLSVerify is how pgtender checks Postgres's certificate.
type TLSVerify string

const (
	TLSVerifyDisabled   TLSVerify = "disabled"
	TLSVerifyPrefer     TLSVerify = "prefer"
	TLSVerifyVerifyCA   TLSVerify = "verify_ca"
	TLSVerifyVerifyFull TLSVerify = "verify_full"
)

// Milliseconds is a duration written in the TOML files as an integer number
// of milliseconds, as PgDog writes them. Load rejects values whose Duration
// would overflow.
type Milliseconds int64

// Duration converts m to a time.Duration.
func (m Milliseconds) Duration() time.Duration { return time.Duration(m) * time.Millisecond }

// Config is the whole loaded configuration: pgdog.toml plus users.toml.
type Config struct {
	General   General
	Admin     Admin
	Databases []Database
	Users     []User

	// ConfigPath and UsersPath are the files the config was loaded from,
	// kept so a reload reads the same files.
	ConfigPath string
	UsersPath  string

	// Lookup indexes built by Load; nil for a Config built by hand, in which
	// case the lookups scan the slices.
	databaseIndex map[string]int
	userIndex     map[userKey]int
}

type userKey struct{ name, database string }

// General is the [general] section of pgdog.toml. Every field's default is
// set by Defaults; zero values after Load are meaningful (0 = none/off) only
// where the field's comment says so.
type General struct {
	Host          string `toml:"host" restart:"true"`           // listen address, default "0.0.0.0"
	Port          int    `toml:"port" restart:"true"`           // listen port, default 6432
	Workers       int    `toml:"workers" restart:"true"`        // accept loops, each on its own SO_REUSEPORT socket; default GOMAXPROCS
	ListenBacklog int    `toml:"listen_backlog" restart:"true"` // listen(2) backlog per socket, default 1024 (capped by net.core.somaxconn)

	DefaultPoolSize int        `toml:"default_pool_size"` // default 10; PgDog's alias max_pool_size is accepted
	MinPoolSize     int        `toml:"min_pool_size"`     // default 1
	PoolerMode      PoolerMode `toml:"pooler_mode"`       // default transaction

	AuthType AuthType `toml:"auth_type"` // default scram
	// PassthroughAuth defaults to disabled. It needs a restart: the pooler
	// builds its passthrough registry once, at start. "enabled" and
	// "enabled_allow_change" need client TLS (TLSCertificate and
	// TLSPrivateKey).
	PassthroughAuth PassthroughAuth `toml:"passthrough_auth" restart:"true"`

	ConnectTimeout                 Milliseconds `toml:"connect_timeout"`                              // default 5000; at least 1
	CheckoutTimeout                Milliseconds `toml:"checkout_timeout"`                             // default 5000; at least 1
	ClientLoginTimeout             Milliseconds `toml:"client_login_timeout"`                         // default 60000; at least 1
	QueryTimeout                   Milliseconds `toml:"query_timeout"`                                // default 0 = none
	ClientIdleInTransactionTimeout Milliseconds `toml:"client_idle_in_transaction_timeout"`           // default 0 = none
	IdleTimeout                    Milliseconds `toml:"idle_timeout"`                                 // default 60000; 0 = idle server connections are kept
	ServerLifetime                 Milliseconds `toml:"server_lifetime"`                              // default 86400000; 0 = unlimited
	ShutdownTimeout                Milliseconds `toml:"shutdown_timeout"`                             // default 60000; 0 = do not wait for transactions
	ShutdownReadinessDelay         Milliseconds `toml:"shutdown_readiness_delay"`                     // extension, default 0: /readyz fails this long before the drain begins
	RollbackTimeout                Milliseconds `toml:"rollback_timeout"`                             // default 5000; at least 1
	StatsPeriod                    Milliseconds `toml:"stats_period"`                                 // default 15000 (PgDog's); at least 1000: the window of SHOW STATS's averages
	ClientWriteTimeout             Milliseconds `toml:"client_write_timeout"`                         // extension, default 60000; 0 = none
	HealthcheckInterval            Milliseconds `toml:"healthcheck_interval"`                         // default 30000; 0 = no check at checkout
	HealthcheckTimeout             Milliseconds `toml:"healthcheck_timeout"`                          // default 5000; at least 1
	IdleHealthcheckInterval        Milliseconds `toml:"idle_healthcheck_interval"`                    // default 30000; 0 = no background check
	IdleHealthcheckDelay           Milliseconds `toml:"idle_healthcheck_delay"`                       // default 5000
	PassthroughReverifyInterval    Milliseconds `toml:"passthrough_reverify_interval" restart:"true"` // extension, default 60000; 0 = never; read when the registry is made

	MaxClientConnections int `toml:"max_client_connections"` // extension, default 0 = limited only by file descriptors
	MaxMessageSize       int `toml:"max_message_size"`       // extension, bytes, default 67108864; a client message after login may be this long

	// Login admission control (extensions; docs/configuration.md).
	MaxLoginsInProgress int          `toml:"max_logins_in_progress" restart:"true"` // 0 = 16 per GOMAXPROCS
	LoginQueueTarget    Milliseconds `toml:"login_queue_target"`                    // default 50
	LoginQueueMaxAge    Milliseconds `toml:"login_queue_max_age"`                   // default 2000; 0 = no age limit

	OpenMetricsPort      int    `toml:"openmetrics_port" restart:"true"`      // 0 = no metrics endpoint
	OpenMetricsHost      string `toml:"openmetrics_host" restart:"true"`      // default "0.0.0.0"
	OpenMetricsNamespace string `toml:"openmetrics_namespace" restart:"true"` // default ""
	HealthcheckPort      int    `toml:"healthcheck_port" restart:"true"`      // 0 = no health endpoint

	TLSCertificate         string    `toml:"tls_certificate"`           // client-facing TLS certificate (PEM file); "" = no client TLS
	TLSPrivateKey          string    `toml:"tls_private_key"`           // its private key (PEM file)
	TLSClientRequired      bool      `toml:"tls_client_required"`       // refuse plaintext clients; default false
	TLSVerify              TLSVerify `toml:"tls_verify"`                // server side; default prefer
	TLSServerCACertificate string    `toml:"tls_server_ca_certificate"` // CA bundle (PEM file) for verify_ca / verify_full; "" = the system's roots

	// PreparedStatements: "extended" renames clients' named prepared
	// statements to pool-wide names in transaction mode; "disabled"
	// forwards them unchanged (named statements then work in session mode
	// only). PreparedStatementsLimit bounds the statements each server
	// connection holds (0: no bound).
	PreparedStatements      string `toml:"prepared_statements"`
	PreparedStatementsLimit int    `toml:"prepared_statements_limit"`

	LogConnections    bool `toml:"log_connections"`    // default true
	LogDisconnections bool `toml:"log_disconnections"` // default true
	// LogLevel and LogFormat need a restart: the logger is built once, at start.
	LogLevel  string `toml:"log_level" restart:"true"`  // "debug" | "info" | "warn" | "error"; default "info"
	LogFormat string `toml:"log_format" restart:"true"` // "text" | "json"; default text
}

// Admin is the [admin] section: the virtual admin database.
type Admin struct {
	Name     string `toml:"name"`                   // default "admin"
	User     string `toml:"user"`                   // default "admin"
	Password string `toml:"password" secret:"true"` // empty = admin console locked
}

// Database is one [[databases]] entry: a name clients connect to and the
// Postgres server behind it.
type Database struct {
	Name         string     `toml:"name"`                   // the name clients use
	Host         string     `toml:"host"`                   // default "127.0.0.1"
	Port         int        `toml:"port"`                   // default 5432
	DatabaseName string     `toml:"database_name"`          // database on the server; default Name
	User         string     `toml:"user"`                   // server user override; empty = the client's user
	Password     string     `toml:"password" secret:"true"` // server password override
	PoolSize     int        `toml:"pool_size"`              // 0 = inherit
	MinPoolSize  int        `toml:"min_pool_size"`          // -1 = inherit (set by Defaults)
	PoolerMode   PoolerMode `toml:"pooler_mode"`            // empty = inherit

	Line int `toml:"-"` // line of the entry in pgdog.toml, for messages
}

// User is one [[users]] entry of users.toml.
type User struct {
	Name           string     `toml:"name"`
	Database       string     `toml:"database"`
	Password       string     `toml:"password" secret:"true"`        // plaintext, "md5<hex>" or "SCRAM-SHA-256$..." secret
	PoolSize       int        `toml:"pool_size"`                     // 0 = inherit
	MinPoolSize    int        `toml:"min_pool_size"`                 // -1 = inherit (set by Defaults)
	PoolerMode     PoolerMode `toml:"pooler_mode"`                   // empty = inherit
	ServerUser     string     `toml:"server_user"`                   // empty = Name (a database's user wins, as in PgDog)
	ServerPassword string     `toml:"server_password" secret:"true"` // empty = Password when plaintext (a database's password wins)

	Line int `toml:"-"` // line of the entry in users.toml, for messages
}

// Defaults returns the default of every key. Databases and Users are empty;
// the defaults of one entry are DefaultDatabase and DefaultUser.
func Defaults() Config {
	return Config{
		General: General{
			Host:                        "0.0.0.0",
			Port:                        6432,
			Workers:                     runtime.GOMAXPROCS(0),
			ListenBacklog:               1024,
			DefaultPoolSize:             10,
			MinPoolSize:                 1,
			PoolerMode:                  PoolerModeTransaction,
			AuthType:                    AuthSCRAM,
			PassthroughAuth:             PassthroughDisabled,
			ConnectTimeout:              5000,
			CheckoutTimeout:             5000,
			ClientLoginTimeout:          60000,
			IdleTimeout:                 60000,
			ServerLifetime:              86400000,
			ShutdownTimeout:             60000,
			RollbackTimeout:             5000,
			StatsPeriod:                 15000,
			ClientWriteTimeout:          60000,
			HealthcheckInterval:         30000,
			HealthcheckTimeout:          5000,
			IdleHealthcheckInterval:     30000,
			IdleHealthcheckDelay:        5000,
			PassthroughReverifyInterval: 60000,
			MaxMessageSize:              64 << 20,
			LoginQueueTarget:            50,
			LoginQueueMaxAge:            2000,
			OpenMetricsHost:             "0.0.0.0",
			TLSVerify:                   TLSVerifyPrefer,
			PreparedStatements:          "extended",
			PreparedStatementsLimit:     500,
			LogConnections:              true,
			LogDisconnections:           true,
			LogLevel:                    "info",
			LogFormat:                   "text",
		},
		Admin: Admin{Name: "admin", User: "admin"},
	}
}

// DefaultDatabase is a [[databases]] entry before its keys are applied.
// DatabaseName is filled from Name after decoding when it is not set.
func DefaultDatabase() Database {
	return Database{Host: "127.0.0.1", Port: 5432, MinPoolSize: -1}
}

// DefaultUser is a [[users]] entry before its keys are applied.
func DefaultUser() User { return User{MinPoolSize: -1} }

// Database returns the [[databases]] entry clients know as name.
func (c *Config) Database(name string) (Database, bool) {
	if c.databaseIndex != nil {
		i, ok := c.databaseIndex[name]
		if !ok {
			return Database{}, false
		}
		return c.Databases[i], true
	}
	for _, d := range c.Databases {
		if d.Name == name {
			return d, true
		}
	}
	return Database{}, false
}

// User returns the users.toml entry for (name, database).
func (c *Config) User(name, database string) (User, bool) {
	if c.userIndex != nil {
		i, ok := c.userIndex[userKey{name, database}]
		if !ok {
			return User{}, false
		}
		return c.Users[i], true
	}
	for _, u := range c.Users {
		if u.Name == name && u.Database == database {
			return u, true
		}
	}
	return User{}, false
}

// PoolSettings is everything the pooler needs to run one (user, database)
// pool. It is comparable: a reload can keep a pool whose settings are equal
// in the old and the new config.
type PoolSettings struct {
	User, Database string // client-visible names

	ServerHost     string
	ServerPort     int
	ServerDatabase string

	// ServerUser and ServerPassword open server connections. ServerPassword
	// is empty when no plaintext password is configured; under passthrough
	// the auth layer supplies the client's verified password instead.
	ServerUser, ServerPassword string

	PoolSize, MinPoolSize int
	PoolerMode            PoolerMode
}

// PoolSettings resolves one (user, database) pool. ok is false when the
// database does not exist; the user need not be in users.toml (passthrough
// users).
//
// pool_size, min_pool_size and pooler_mode come from the user entry, else
// the database entry, else [general]. The server host, port and database
// come from the database entry. ServerUser and ServerPassword are each
// resolved as PgDog resolves them (pgdog/src/backend/pool/address.rs): the
// database's user/password, else the user's server_user/server_password,
// else the user's own name/password (the password only when it is
// plaintext, not an md5 or SCRAM secret). MinPoolSize is capped at PoolSize.
func (c *Config) PoolSettings(user, database string) (PoolSettings, bool) {
	db, ok := c.Database(database)
	if !ok {
		return PoolSettings{}, false
	}
	u, hasUser := c.User(user, database)
	if !hasUser {
		u = DefaultUser()
		u.Name, u.Database = user, database
	}
	s := PoolSettings{
		User:           user,
		Database:       database,
		ServerHost:     db.Host,
		ServerPort:     db.Port,
		ServerDatabase: db.DatabaseName,
		PoolSize:       c.General.DefaultPoolSize,
		MinPoolSize:    c.General.MinPoolSize,
		PoolerMode:     c.General.PoolerMode,
	}
	if s.ServerDatabase == "" {
		s.ServerDatabase = db.Name
	}

	switch {
	case u.PoolSize > 0:
		s.PoolSize = u.PoolSize
	case db.PoolSize > 0:
		s.PoolSize = db.PoolSize
	}
	switch {
	case u.MinPoolSize >= 0:
		s.MinPoolSize = u.MinPoolSize
	case db.MinPoolSize >= 0:
		s.MinPoolSize = db.MinPoolSize
	}
	s.MinPoolSize = min(s.MinPoolSize, s.PoolSize)
	switch {
	case u.PoolerMode != "":
		s.PoolerMode = u.PoolerMode
	case db.PoolerMode != "":
		s.PoolerMode = db.PoolerMode
	}

	switch {
	case db.User != "":
		s.ServerUser = db.User
	case u.ServerUser != "":
		s.ServerUser = u.ServerUser
	default:
		s.ServerUser = user
	}
	switch {
	case db.Password != "":
		s.ServerPassword = db.Password
	case u.ServerPassword != "":
		s.ServerPassword = u.ServerPassword
	case PasswordKindOf(u.Password) == PasswordPlain:
		s.ServerPassword = u.Password
	}
	return s, true
}
