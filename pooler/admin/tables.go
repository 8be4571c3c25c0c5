package admin

// Table is the column set of one SHOW. Each starts with PgBouncer 1.25's
// columns for it, in its order and with its types (src/admin.c and
// src/stats.c of https://github.com/pgbouncer/pgbouncer), since exporters
// and scripts read them by name and scan them by type; pgtender's own
// columns come after them. docs/admin.md says what each column holds in
// pgtender.
type Table struct {
	PgBouncer []Column // PgBouncer's columns, in its order
	Own       []Column // pgtender's, after PgBouncer's
	all       []Column
}

func newTable(pgbouncerTypes string, pgbouncerNames []string, ownTypes string, ownNames ...string) *Table {
	t := &Table{PgBouncer: columns(pgbouncerTypes, pgbouncerNames), Own: columns(ownTypes, ownNames)}
	t.all = append(append([]Column(nil), t.PgBouncer...), t.Own...)
	return t
}

// Columns are the table's columns, PgBouncer's then pgtender's.
func (t *Table) Columns() []Column { return t.all }

// NewResult is an empty result with the table's columns.
func (t *Table) NewResult() *Result { return &Result{Columns: t.all} }

// columns builds a column list from PgBouncer's type letters ('s' text,
// 'i' int4, 'q' int8, 'N' numeric; its 'T', a time as text, is 's' here).
func columns(types string, names []string) []Column {
	if len(types) != len(names) {
		panic("admin: column types and names differ in number")
	}
	cols := make([]Column, len(names))
	for i, name := range names {
		var t Type
		switch types[i] {
		case 's':
			t = Text
		case 'i':
			t = Int4
		case 'q':
			t = Int8
		case 'N':
			t = Numeric
		default:
			panic("admin: bad column type " + string(types[i]))
		}
		cols[i] = Column{Name: name, Type: t}
	}
	return cols
}

func names(n ...string) []string { return n }

// The console's tables.
var (
	// Pools is SHOW POOLS; pgtender adds sv_idle_xact (linked server
	// connections whose client is idle in a transaction, counted in
	// sv_active too), cl_pinned (clients holding their server connection
	// for session state in transaction mode) and pool_size.
	Pools = newTable("ssiiiiiiiiiiiiiss", names(
		"database", "user", "cl_active", "cl_waiting", "cl_active_cancel_req", "cl_waiting_cancel_req",
		"sv_active", "sv_active_cancel", "sv_being_canceled", "sv_idle", "sv_used", "sv_tested", "sv_login",
		"maxwait", "maxwait_us", "pool_mode", "load_balance_hosts"),
		"iii", "sv_idle_xact", "cl_pinned", "pool_size")

	// Sockets is SHOW CLIENTS and SHOW SERVERS (PgBouncer's socket_header).
	Sockets = newTable("ssssssisissiiississii", names(
		"type", "user", "database", "replication", "state", "addr", "port", "local_addr", "local_port",
		"connect_time", "request_time", "wait", "wait_us", "close_needed", "ptr", "link", "remote_pid", "tls",
		"application_name", "prepared_statements", "id"),
		"")

	// Stats is SHOW STATS: totals since start, then averages over the last
	// stats_period (rates per second; times per transaction, query or
	// assignment), as stats.c computes them. Times are in microseconds.
	Stats = newTable("sNNNNNNNNNNNNNNNNNNNNNNNN", names(
		"database", "total_server_assignment_count", "total_xact_count", "total_query_count",
		"total_received", "total_sent", "total_xact_time", "total_query_time", "total_wait_time",
		"total_client_parse_count", "total_server_parse_count", "total_bind_count", "total_client_login_count",
		"avg_server_assignment_count", "avg_xact_count", "avg_query_count", "avg_recv", "avg_sent",
		"avg_xact_time", "avg_query_time", "avg_wait_time", "avg_client_parse_count",
		"avg_server_parse_count", "avg_bind_count", "avg_client_login_count"),
		"")

	// StatsTotals is SHOW STATS_TOTALS.
	StatsTotals = newTable("sNNNNNNNNNNNN", names(
		"database", "server_assignment_count", "xact_count", "query_count", "bytes_received", "bytes_sent",
		"xact_time", "query_time", "wait_time", "client_parse_count", "server_parse_count", "bind_count",
		"client_login_count"),
		"")

	// StatsAverages is SHOW STATS_AVERAGES (PgBouncer keeps the avg_
	// prefix on its last four columns).
	StatsAverages = newTable("sNNNNNNNNNNNN", names(
		"database", "server_assignment_count", "xact_count", "query_count", "bytes_received", "bytes_sent",
		"xact_time", "query_time", "wait_time", "avg_client_parse_count", "avg_server_parse_count",
		"avg_bind_count", "avg_client_login_count"),
		"")

	// Databases is SHOW DATABASES.
	Databases = newTable("ssissiiiissiiiiii", names(
		"name", "host", "port", "database", "force_user", "pool_size", "min_pool_size", "reserve_pool_size",
		"server_lifetime", "pool_mode", "load_balance_hosts", "max_connections", "current_connections",
		"max_client_connections", "current_client_connections", "paused", "disabled"),
		"")

	// Users is SHOW USERS; pgtender adds database (a users.toml entry is
	// per user and database) and source (users.toml, or passthrough for a
	// user learned from a verified login; no password either way).
	Users = newTable("ssssiiii", names(
		"name", "pool_size", "reserve_pool_size", "pool_mode", "max_user_connections", "current_connections",
		"max_user_client_connections", "current_client_connections"),
		"ss", "database", "source")

	// Config is SHOW CONFIG.
	Config = newTable("ssss", names("key", "value", "default", "changeable"), "")

	// Lists is SHOW LISTS.
	Lists = newTable("si", names("list", "items"), "")

	// Version is SHOW VERSION.
	Version = newTable("s", names("version"), "")

	// State is SHOW STATE.
	State = newTable("ss", names("key", "value"), "")

	// Logins is pgtender's SHOW LOGINS: one row per figure, as SHOW LISTS.
	Logins = newTable("", nil, "sq", "name", "value")

	// PreparedStatements is pgtender's SHOW PREPARED_STATEMENTS (PgBouncer
	// has none; PgDog's SHOW PREPARED STATEMENTS lists name, statement and
	// memory_used): one row per statement of each pool's registry, under
	// its server-side name.
	PreparedStatements = newTable("", nil, "ssssiiqs",
		"database", "user", "name", "search_path", "parameters", "prepared", "memory_used", "statement")
)
