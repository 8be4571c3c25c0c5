package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtender/pgtender/pooler"
	"github.com/pgtender/pgtender/pooler/admin"
)

// The admin console, driven with pgx in simple protocol mode and with
// psql, and Debian's PgBouncer beside it for the columns.

const (
	consoleUser     = "admin"
	consolePassword = "console-secret"
)

// consolePooler starts a passthrough pgtender whose console is open.
func consolePooler(t *testing.T, general string) *testPooler {
	t.Helper()
	return startPooler(t, poolerOptions{
		general: `passthrough_auth = "enabled_plain"` + "\n" + general,
		pool:    "pool_size = 2\n\n[admin]\npassword = \"" + consolePassword + "\"",
	})
}

// consoleConnect logs in to database (the console's name or alias) at
// addr in simple protocol mode.
func consoleConnect(ctx context.Context, addr, user, password, database string) (*pgx.Conn, error) {
	host, port, _ := net.SplitHostPort(addr)
	cc, err := pgx.ParseConfig(fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable&connect_timeout=10",
		user, password, net.JoinHostPort(host, port), database))
	if err != nil {
		return nil, err
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	return pgx.ConnectConfig(ctx, cc)
}

func mustConsole(t *testing.T, ctx context.Context, addr, database string) *pgx.Conn {
	t.Helper()
	conn, err := consoleConnect(ctx, addr, consoleUser, consolePassword, database)
	if err != nil {
		t.Fatalf("console login: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// consoleResult is one SHOW's reply: its columns and its rows as text
// (nil for NULL).
type consoleResult struct {
	columns []admin.Column
	rows    [][]*string
}

func show(t *testing.T, ctx context.Context, conn *pgx.Conn, subject string) consoleResult {
	t.Helper()
	result, err := showErr(ctx, conn.PgConn(), subject)
	if err != nil {
		t.Fatalf("SHOW %s: %v", subject, err)
	}
	return result
}

func showErr(ctx context.Context, conn *pgconn.PgConn, subject string) (consoleResult, error) {
	multi := conn.Exec(ctx, "SHOW "+subject)
	var out consoleResult
	results := 0
	for multi.NextResult() {
		results++
		reader := multi.ResultReader()
		// The columns are read from the reader: pgconn's Result keeps
		// them only for a result with rows.
		for _, f := range reader.FieldDescriptions() {
			out.columns = append(out.columns, admin.Column{Name: f.Name, Type: admin.Type(f.DataTypeOID)})
		}
		for reader.NextRow() {
			values := make([]*string, len(reader.Values()))
			for i, v := range reader.Values() {
				if v != nil {
					s := string(v)
					values[i] = &s
				}
			}
			out.rows = append(out.rows, values)
		}
		if _, err := reader.Close(); err != nil {
			_ = multi.Close()
			return consoleResult{}, err
		}
	}
	if err := multi.Close(); err != nil {
		return consoleResult{}, err
	}
	if results != 1 {
		return consoleResult{}, fmt.Errorf("%d results", results)
	}
	return out, nil
}

// find is the first row whose column named key holds value, as a map of
// column name to text ("NULL" for NULL); nil when none does.
func (r consoleResult) find(key, value string) map[string]string {
	k := slices.IndexFunc(r.columns, func(c admin.Column) bool { return c.Name == key })
	for _, row := range r.rows {
		if k >= 0 && row[k] != nil && *row[k] == value {
			m := make(map[string]string, len(row))
			for i, v := range row {
				m[r.columns[i].Name] = "NULL"
				if v != nil {
					m[r.columns[i].Name] = *v
				}
			}
			return m
		}
	}
	return nil
}

func (r consoleResult) count(key, value string) int {
	k := slices.IndexFunc(r.columns, func(c admin.Column) bool { return c.Name == key })
	n := 0
	for _, row := range r.rows {
		if k >= 0 && row[k] != nil && *row[k] == value {
			n++
		}
	}
	return n
}

// TestConsoleShowsWhatClientsDid runs transactions through a pool and
// reads them back from the console: the clients, the server connections
// (with the backend pids Postgres reports), the pool counts and the
// totals.
func TestConsoleShowsWhatClientsDid(t *testing.T) {
	tp := consolePooler(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clients := []*pgx.Conn{tp.connect(t, ctx), tp.connect(t, ctx)}
	const transactions = 5
	var backendPIDs []string
	for _, c := range clients {
		for range transactions {
			var pid int
			if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(backendPIDs, strconv.Itoa(pid)) {
				backendPIDs = append(backendPIDs, strconv.Itoa(pid))
			}
		}
	}
	console := mustConsole(t, ctx, tp.addr, "admin")

	pools := show(t, ctx, console, "pools")
	checkColumns(t, "pools", pools.columns, admin.Pools)
	row := pools.find("database", appDB)
	if row == nil {
		t.Fatalf("SHOW POOLS has no row for %s: %v", appDB, pools.rows)
	}
	if row["user"] != appUser || row["cl_active"] != "2" || row["cl_waiting"] != "0" || row["pool_mode"] != "transaction" || row["pool_size"] != "2" {
		t.Errorf("SHOW POOLS row = %v, want 2 active clients of %s in a transaction pool of 2", row, appUser)
	}
	if idle := atoi(t, row["sv_idle"]); idle != len(backendPIDs) || row["sv_active"] != "0" {
		t.Errorf("SHOW POOLS: sv_idle %s sv_active %s, want %d idle (the backends the clients saw) and none active", row["sv_idle"], row["sv_active"], len(backendPIDs))
	}

	clientRows := show(t, ctx, console, "clients")
	checkColumns(t, "clients", clientRows.columns, admin.Sockets)
	for _, c := range clients {
		id := strconv.FormatUint(uint64(c.PgConn().PID()), 10)
		r := clientRows.find("id", id)
		if r == nil {
			t.Fatalf("SHOW CLIENTS has no client with id %s (the BackendKeyData pid): %v", id, clientRows.rows)
		}
		if r["type"] != "C" || r["user"] != appUser || r["database"] != appDB || r["state"] != "active" || r["addr"] != "127.0.0.1" || r["link"] != "" {
			t.Errorf("SHOW CLIENTS row %v", r)
		}
	}
	if n := clientRows.count("database", "admin"); n != 1 {
		t.Errorf("SHOW CLIENTS lists %d console clients, want 1 (this one)", n)
	}

	servers := show(t, ctx, console, "servers")
	checkColumns(t, "servers", servers.columns, admin.Sockets)
	for _, pid := range backendPIDs {
		r := servers.find("remote_pid", pid)
		if r == nil {
			t.Errorf("SHOW SERVERS has no server with remote_pid %s: %v", pid, servers.rows)
			continue
		}
		if r["type"] != "S" || r["state"] != "idle" || r["database"] != appDB || r["port"] != strconv.Itoa(pg.Port) {
			t.Errorf("SHOW SERVERS row %v", r)
		}
	}

	totals := show(t, ctx, console, "stats_totals")
	checkColumns(t, "stats_totals", totals.columns, admin.StatsTotals)
	r := totals.find("database", appDB)
	if r == nil {
		t.Fatalf("SHOW STATS_TOTALS has no row for %s", appDB)
	}
	// Each client's pgx login ran no query of its own through the pool;
	// each QueryRow is one transaction (a Query, its ReadyForQuery idle).
	if got := atoi(t, r["xact_count"]); got != 2*transactions {
		t.Errorf("xact_count = %d, want %d", got, 2*transactions)
	}
	if got := atoi(t, r["query_count"]); got != 2*transactions {
		t.Errorf("query_count = %d, want %d", got, 2*transactions)
	}
	// A client whose next transaction comes before its server connection
	// was released keeps it, without a new assignment.
	if got := atoi(t, r["server_assignment_count"]); got < 2 || got > 2*transactions {
		t.Errorf("server_assignment_count = %d, want 2 to %d", got, 2*transactions)
	}
	if got := atoi(t, r["client_login_count"]); got != 2 {
		t.Errorf("client_login_count = %d, want 2", got)
	}
	if atoi(t, r["bytes_received"]) == 0 || atoi(t, r["bytes_sent"]) == 0 || r["xact_time"] != "NULL" {
		t.Errorf("SHOW STATS_TOTALS row %v: want bytes both ways, NULL xact_time", r)
	}
	stats := show(t, ctx, console, "stats")
	checkColumns(t, "stats", stats.columns, admin.Stats)
	if r := stats.find("database", appDB); r == nil || r["total_xact_count"] != strconv.Itoa(2*transactions) {
		t.Errorf("SHOW STATS row %v", r)
	}
	checkColumns(t, "stats_averages", show(t, ctx, console, "stats_averages").columns, admin.StatsAverages)

	databases := show(t, ctx, console, "databases")
	checkColumns(t, "databases", databases.columns, admin.Databases)
	if r := databases.find("name", appDB); r == nil || r["port"] != strconv.Itoa(pg.Port) || r["pool_size"] != "2" ||
		r["current_client_connections"] != "2" || r["current_connections"] != strconv.Itoa(len(backendPIDs)) {
		t.Errorf("SHOW DATABASES row %v", r)
	}
	users := show(t, ctx, console, "users")
	checkColumns(t, "users", users.columns, admin.Users)
	if r := users.find("name", appUser); r == nil || r["source"] != "passthrough" || r["database"] != appDB || r["current_client_connections"] != "2" {
		t.Errorf("SHOW USERS row %v, want the passthrough user with its 2 clients", r)
	}
	config := show(t, ctx, console, "config")
	checkColumns(t, "config", config.columns, admin.Config)
	if r := config.find("key", "admin.password"); r == nil || r["value"] != "***" {
		t.Errorf("SHOW CONFIG's admin.password row %v, want the value masked", r)
	}
	if r := config.find("key", "port"); r == nil || r["changeable"] != "no" {
		t.Errorf("SHOW CONFIG's port row %v, want changeable no", r)
	}
	if r := config.find("key", "default_pool_size"); r == nil || r["changeable"] != "yes" {
		t.Errorf("SHOW CONFIG's default_pool_size row %v, want changeable yes", r)
	}
	lists := show(t, ctx, console, "lists")
	if r := lists.find("list", "used_clients"); r == nil || r["items"] != "3" {
		t.Errorf("SHOW LISTS used_clients %v, want 3 (two clients and the console)", r)
	}
	if r := show(t, ctx, console, "state").find("key", "paused"); r == nil || r["value"] != "no" {
		t.Errorf("SHOW STATE paused %v", r)
	}
	logins := show(t, ctx, console, "logins")
	if r := logins.find("name", "clients"); r == nil || r["value"] != "3" {
		t.Errorf("SHOW LOGINS clients %v, want 3", r)
	}
	// Nothing the console printed holds a password.
	for _, subject := range []string{"pools", "clients", "servers", "databases", "users", "config", "lists", "logins"} {
		for _, row := range show(t, ctx, console, subject).rows {
			for _, v := range row {
				if v != nil && (strings.Contains(*v, appPassword) || strings.Contains(*v, consolePassword)) {
					t.Errorf("SHOW %s shows a password: %v", subject, row)
				}
			}
		}
	}
}

// checkColumns checks a SHOW's columns against its table: PgBouncer's,
// then pgtender's.
func checkColumns(t *testing.T, subject string, got []admin.Column, table *admin.Table) {
	t.Helper()
	if !slices.Equal(got, table.Columns()) {
		t.Errorf("SHOW %s columns:\n got %v\nwant %v", subject, got, table.Columns())
	}
}

// TestConsoleSessionRules covers how the console treats what is not a
// well-formed console command, and who may log in.
func TestConsoleSessionRules(t *testing.T) {
	tp := consolePooler(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("wrong password", func(t *testing.T) {
		_, err := consoleConnect(ctx, tp.addr, consoleUser, wrongPassword, "admin")
		if sqlState(err) != "28P01" {
			t.Fatalf("login with a wrong password: %v, want 28P01", err)
		}
	})
	t.Run("wrong user", func(t *testing.T) {
		_, err := consoleConnect(ctx, tp.addr, appUser, consolePassword, "admin")
		if sqlState(err) != "28P01" {
			t.Fatalf("login as another user: %v, want 28P01", err)
		}
	})
	t.Run("alias", func(t *testing.T) {
		conn := mustConsole(t, ctx, tp.addr, "pgbouncer")
		if r := show(t, ctx, conn, "version"); len(r.rows) != 1 || !strings.HasPrefix(*r.rows[0][0], "pgtender") {
			t.Errorf("SHOW VERSION = %v", r.rows)
		}
	})
	conn := mustConsole(t, ctx, tp.addr, "admin")
	t.Run("unknown command", func(t *testing.T) {
		for _, query := range []string{"SHOW NOTHING", "FROB", "SHOW POOLS EXTRA WORDS", "select 1 + 1"} {
			_, err := conn.PgConn().Exec(ctx, query).ReadAll()
			if sqlState(err) != "42601" {
				t.Errorf("%q: %v, want 42601", query, err)
			}
		}
		if r := show(t, ctx, conn, "state"); len(r.rows) == 0 {
			t.Error("the session is not usable after an unknown command")
		}
	})
	t.Run("case and semicolon", func(t *testing.T) {
		results, err := conn.PgConn().Exec(ctx, "  show Pools ;").ReadAll()
		if err != nil || len(results) != 1 || string(results[0].CommandTag.String()) != "SHOW" {
			t.Fatalf("show Pools ; = %v, %v", results, err)
		}
	})
	t.Run("pretend settings", func(t *testing.T) {
		var encoding string
		if err := conn.QueryRow(ctx, "SHOW client_encoding").Scan(&encoding); err != nil || encoding != "UTF8" {
			t.Errorf("SHOW client_encoding = %q, %v", encoding, err)
		}
	})
	t.Run("not supported yet", func(t *testing.T) {
		for _, query := range []string{"KILL appdb", "SUSPEND", "WAIT_CLOSE", "SET default_pool_size = 5", "set\tserver_lifetime='100'"} {
			_, err := conn.PgConn().Exec(ctx, query).ReadAll()
			if sqlState(err) != "0A000" {
				t.Errorf("%q: %v, want 0A000", query, err)
			}
		}
	})
	t.Run("extended protocol", func(t *testing.T) {
		// pgx's default mode: Parse, Describe, Sync. It must get an
		// error, not a hang, and the session goes on.
		cc, err := pgx.ParseConfig(fmt.Sprintf("postgres://%s:%s@%s/admin?sslmode=disable", consoleUser, consolePassword, tp.addr))
		if err != nil {
			t.Fatal(err)
		}
		extended, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			t.Fatal(err)
		}
		defer extended.Close(ctx)
		var version string
		err = extended.QueryRow(ctx, "SHOW VERSION").Scan(&version)
		if sqlState(err) != "0A000" {
			t.Fatalf("an extended-protocol query: %v, want 0A000", err)
		}
		if _, err := extended.PgConn().Exec(ctx, "SHOW POOLS").ReadAll(); err != nil {
			t.Fatalf("a simple query after it: %v", err)
		}
	})
	t.Run("console closed", func(t *testing.T) {
		closed := startPooler(t, poolerOptions{general: `passthrough_auth = "enabled_plain"`})
		_, err := consoleConnect(ctx, closed.addr, consoleUser, consolePassword, "admin")
		if sqlState(err) != "28000" || !strings.Contains(errorMessage(err), "password is not set") {
			t.Fatalf("login to a closed console: %v, want 28000 saying why", err)
		}
	})
}

// TestConsoleKillClient ends one client with KILL_CLIENT: it is told
// 57P01, and the other client of the same pool goes on.
func TestConsoleKillClient(t *testing.T) {
	tp := consolePooler(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	victim, bystander := tp.connect(t, ctx), tp.connect(t, ctx)
	// The victim holds its server connection in a transaction.
	if _, err := victim.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	held := backendPID(t, ctx, victim)
	superuser := direct(t, ctx)
	console := mustConsole(t, ctx, tp.addr, "admin")
	if _, err := console.PgConn().Exec(ctx, "KILL_CLIENT 4294967295").ReadAll(); sqlState(err) != "42704" {
		t.Errorf("KILL_CLIENT of no client: %v, want 42704", err)
	}
	if _, err := console.PgConn().Exec(ctx, fmt.Sprintf("KILL_CLIENT %d", console.PgConn().PID())).ReadAll(); sqlState(err) != "55006" {
		t.Errorf("KILL_CLIENT of itself: %v, want 55006", err)
	}
	if _, err := console.PgConn().Exec(ctx, fmt.Sprintf("kill_client %d;", victim.PgConn().PID())).ReadAll(); err != nil {
		t.Fatalf("KILL_CLIENT: %v", err)
	}
	_, err := victim.Exec(ctx, "SELECT 1")
	if sqlState(err) != "57P01" {
		t.Errorf("the killed client's next query: %v, want 57P01", err)
	}
	var one int
	if err := bystander.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Errorf("the other client: %v", err)
	}
	// Its transaction was cut: the connection is closed, not rolled back
	// and given to another client.
	eventually(t, 10*time.Second, "the killed client's backend to end", func() bool {
		return !slices.Contains(backendPIDs(t, ctx, superuser), held)
	})
	eventually(t, 10*time.Second, "the killed client to leave SHOW CLIENTS", func() bool {
		return show(t, ctx, console, "clients").find("id", strconv.FormatUint(uint64(victim.PgConn().PID()), 10)) == nil
	})
	if !strings.Contains(tp.logs.String(), "admin console command") {
		t.Error("KILL_CLIENT was not logged")
	}
}

// TestConsolePsql runs psql against the console as an operator does.
func TestConsolePsql(t *testing.T) {
	tp := consolePooler(t, "")
	host, port, _ := net.SplitHostPort(tp.addr)
	for _, command := range []string{"SHOW POOLS", "SHOW HELP", "SHOW LOGINS"} {
		cmd := exec.Command(psqlPath(t), "-X", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", port, "-U", consoleUser, "-d", "pgbouncer", "-c", command)
		cmd.Env = append(os.Environ(), "PGPASSWORD="+consolePassword, "PGCONNECT_TIMEOUT=10", "PGSSLMODE=disable")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("psql -c %q: %v\n%s", command, err, out)
		}
		switch command {
		case "SHOW POOLS":
			if !strings.Contains(string(out), "cl_active") {
				t.Errorf("psql SHOW POOLS printed:\n%s", out)
			}
		case "SHOW HELP":
			if !strings.Contains(string(out), "KILL_CLIENT") {
				t.Errorf("psql SHOW HELP printed:\n%s", out)
			}
		}
	}
}

// TestConsoleLoginsFigures shows SHOW LOGINS with the figures the program
// hooks in: the recorder's counts move with the logins the test made.
func TestConsoleLoginsFigures(t *testing.T) {
	tp := consolePooler(t, "")
	figures := []pooler.LoginFigure{{Name: "logins_ok", Value: 7}}
	tp.SetConsoleHooks(pooler.ConsoleHooks{Version: "test", Logins: func() []pooler.LoginFigure { return figures }})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	console := mustConsole(t, ctx, tp.addr, "admin")
	logins := show(t, ctx, console, "logins")
	if r := logins.find("name", "logins_ok"); r == nil || r["value"] != "7" {
		t.Errorf("SHOW LOGINS logins_ok %v", r)
	}
	if r := logins.find("name", "login_slots"); r == nil || atoi(t, r["value"]) == 0 {
		t.Errorf("SHOW LOGINS login_slots %v", r)
	}
	if v := show(t, ctx, console, "version"); *v.rows[0][0] != "pgtender test" {
		t.Errorf("SHOW VERSION = %q", *v.rows[0][0])
	}
}

// pgbouncerOnlyColumns are the columns of PgBouncer's SHOWs that
// pgtender's console does not have, each with the reason: a concept
// pgtender does not have. The comparison test fails on any other.
var pgbouncerOnlyColumns = map[string]string{}

// pgbouncerRenamed are PgBouncer columns an older PgBouncer names
// otherwise than 1.25 does, by SHOW: pgtender has 1.25's name.
var pgbouncerRenamed = map[string]string{
	"databases.reserve_pool": "reserve_pool_size", // renamed in PgBouncer 1.24
}

// TestConsoleColumnsMatchPgBouncer runs each SHOW on Debian's PgBouncer
// and on pgtender and compares the columns: every PgBouncer column is
// pgtender's too, in PgBouncer's order and with its type, unless
// pgbouncerOnlyColumns gives the reason it is not. (Debian's PgBouncer
// may be older than the 1.25 whose columns pgtender's tables follow: the
// columns it lacks are newer ones, listed in the log.)
func TestConsoleColumnsMatchPgBouncer(t *testing.T) {
	bouncer := startPgBouncer(t, pg.Host, pg.Port, 2, "admin_users = "+appUser, "stats_users = "+appUser)
	tp := consolePooler(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ours := mustConsole(t, ctx, tp.addr, "pgbouncer")
	theirs, err := consoleConnect(ctx, bouncer, appUser, appPassword, "pgbouncer")
	if err != nil {
		t.Fatalf("PgBouncer's console: %v", err)
	}
	defer theirs.Close(ctx)
	var version string
	if err := theirs.QueryRow(ctx, "SHOW VERSION").Scan(&version); err != nil {
		t.Fatal(err)
	}
	t.Logf("comparing with %s", version)
	// SHOW STATE is last: a PgBouncer older than 1.21 does not know it,
	// and ends the session of a client that asks.
	for _, subject := range []string{"pools", "clients", "servers", "stats", "stats_totals", "stats_averages",
		"databases", "users", "config", "lists", "version", "state"} {
		theirResult, err := showErr(ctx, theirs.PgConn(), subject)
		if err != nil && strings.Contains(errorMessage(err), "invalid command") {
			t.Logf("SHOW %-14s not in %s", subject, version)
			continue
		}
		if err != nil {
			t.Errorf("PgBouncer's SHOW %s: %v", subject, err)
			continue
		}
		ourColumns := show(t, ctx, ours, subject).columns
		next, matched := 0, 0
		var missing, newer []string
		var renamed []string
		for _, c := range theirResult.columns {
			if name, ok := pgbouncerRenamed[subject+"."+c.Name]; ok {
				renamed = append(renamed, c.Name+" as "+name)
				c.Name = name
			}
			i := slices.IndexFunc(ourColumns, func(o admin.Column) bool { return o.Name == c.Name })
			switch {
			case i < 0:
				if reason, ok := pgbouncerOnlyColumns[subject+"."+c.Name]; ok {
					missing = append(missing, c.Name+" ("+reason+")")
				} else {
					t.Errorf("SHOW %s: PgBouncer has column %s (%v), pgtender has not", subject, c.Name, c.Type)
				}
			case i < next:
				t.Errorf("SHOW %s: column %s is out of PgBouncer's order", subject, c.Name)
			case ourColumns[i].Type != c.Type:
				t.Errorf("SHOW %s: column %s is %v, PgBouncer's is %v", subject, c.Name, ourColumns[i].Type, c.Type)
			default:
				matched++
				next = i + 1
			}
		}
		for _, o := range ourColumns {
			if !slices.ContainsFunc(theirResult.columns, func(c admin.Column) bool { return c.Name == o.Name || pgbouncerRenamed[subject+"."+c.Name] == o.Name }) {
				newer = append(newer, o.Name)
			}
		}
		t.Logf("SHOW %-14s %2d of PgBouncer's %2d columns matched (renamed since: %v); missing: %v; pgtender's not in this PgBouncer: %v",
			subject, matched, len(theirResult.columns), renamed, missing, newer)
	}
}

// TestConsoleReloadAndShutdown drives the pgtender binary from its
// console: RELOAD of a broken file fails, says why and changes nothing;
// RELOAD of a changed file applies it and keeps the server connection;
// SHUTDOWN drains and the process exits 0.
func TestConsoleReloadAndShutdown(t *testing.T) {
	const adminSection = "\n[admin]\npassword = \"" + consolePassword + "\"\n"
	pr := startProcessWith(t, processOptions{pool: "pool_size = 1", extraDatabases: adminSection})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := pr.connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close(context.Background())
	pid := backendPID(t, ctx, client)
	console := mustConsole(t, ctx, pr.addr, "pgbouncer")
	poolSize := func() string {
		return show(t, ctx, console, "databases").find("name", appDB)["pool_size"]
	}
	if got := poolSize(); got != "1" {
		t.Fatalf("pool_size = %s before the reload", got)
	}
	if v := *show(t, ctx, console, "version").rows[0][0]; !strings.HasPrefix(v, "pgtender ") {
		t.Errorf("SHOW VERSION = %q, want the binary's version", v)
	}

	port := atoi(t, strings.TrimPrefix(pr.addr, "127.0.0.1:"))
	writeFile(t, pr.configPath, "[general]\nport = \"not a number\"\n")
	_, err = console.PgConn().Exec(ctx, "RELOAD").ReadAll()
	if sqlState(err) != "F0000" || !strings.Contains(errorMessage(err), "general.port") {
		t.Fatalf("RELOAD of a broken file: %v, want F0000 naming general.port", err)
	}
	if got := poolSize(); got != "1" {
		t.Errorf("pool_size = %s after a failed reload", got)
	}

	writeFile(t, pr.configPath, processConfig(port, "", "pool_size = 3")+adminSection)
	if _, err := console.PgConn().Exec(ctx, "reload;").ReadAll(); err != nil {
		t.Fatalf("RELOAD: %v", err)
	}
	if got := poolSize(); got != "3" {
		t.Errorf("pool_size = %s after the reload, want 3", got)
	}
	if got := backendPID(t, ctx, client); got != pid {
		t.Errorf("the server connection changed across a pool-size RELOAD: %d -> %d", pid, got)
	}
	// SHOW LOGINS through the binary's hooks: the recorder counted the
	// logins so far (the client, the console), the kernel its queues.
	logins := show(t, ctx, console, "logins")
	if r := logins.find("name", "logins_ok"); r == nil || atoi(t, r["value"]) < 2 {
		t.Errorf("SHOW LOGINS logins_ok %v, want the client's and the console's logins", r)
	}
	if r := logins.find("name", "listen_queue_capacity.worker0"); r == nil || atoi(t, r["value"]) == 0 {
		t.Errorf("SHOW LOGINS listen_queue_capacity.worker0 %v", r)
	}
	if !strings.Contains(pr.output.String(), `"command":"RELOAD"`) {
		t.Error("RELOAD was not logged as a console command")
	}

	if _, err := console.PgConn().Exec(ctx, "SHUTDOWN").ReadAll(); err != nil {
		t.Fatalf("SHUTDOWN: %v", err)
	}
	if code := pr.waitExit(t, 15*time.Second); code != 0 {
		t.Fatalf("pgtender exited %d after SHUTDOWN", code)
	}
	if !strings.Contains(pr.output.String(), "SHUTDOWN on the admin console") {
		t.Error("the shutdown's cause was not logged")
	}
}

// TestConsoleDisableEnable refuses new logins to a database with DISABLE,
// leaves its logged-in clients alone, and admits logins again on ENABLE.
func TestConsoleDisableEnable(t *testing.T) {
	tp := consolePooler(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := tp.connect(t, ctx)
	console := mustConsole(t, ctx, tp.addr, "admin")
	for query, want := range map[string]string{"DISABLE": "42601", "DISABLE nosuchdb": "42704", "RECONNECT nosuchdb": "42704"} {
		if _, err := console.PgConn().Exec(ctx, query).ReadAll(); sqlState(err) != want {
			t.Errorf("%s: %v, want %s", query, err, want)
		}
	}
	if _, err := console.PgConn().Exec(ctx, "DISABLE "+appDB).ReadAll(); err != nil {
		t.Fatalf("DISABLE: %v", err)
	}
	_, err := tp.connectAs(ctx, appUser, appPassword, appDB)
	if sqlState(err) != "55000" || !strings.Contains(errorMessage(err), "ENABLE") {
		t.Errorf("a login to a disabled database: %v, want 55000 saying why", err)
	}
	if _, err := client.Exec(ctx, "SELECT 1"); err != nil {
		t.Errorf("a client logged in before DISABLE: %v", err)
	}
	if r := show(t, ctx, console, "databases").find("name", appDB); r["disabled"] != "1" {
		t.Errorf("SHOW DATABASES disabled = %s, want 1", r["disabled"])
	}
	if _, err := console.PgConn().Exec(ctx, "enable "+appDB+";").ReadAll(); err != nil {
		t.Fatalf("ENABLE: %v", err)
	}
	again, err := tp.connectAs(ctx, appUser, appPassword, appDB)
	if err != nil {
		t.Fatalf("a login after ENABLE: %v", err)
	}
	again.Close(ctx)
	if r := show(t, ctx, console, "databases").find("name", appDB); r["disabled"] != "0" {
		t.Errorf("SHOW DATABASES disabled = %s after ENABLE, want 0", r["disabled"])
	}
}

// TestConsoleReconnect replaces a pool's server connections with RECONNECT:
// the idle ones at once, the one a client holds in a transaction after
// the transaction; no client sees an error, and Postgres shows new
// backends.
func TestConsoleReconnect(t *testing.T) {
	tp := consolePooler(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	superuser := direct(t, ctx)
	holder, other := tp.connect(t, ctx), tp.connect(t, ctx)
	// Two server connections: the holder's transaction keeps one while
	// the other client's query takes a second.
	if _, err := holder.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	held := backendPID(t, ctx, holder)
	idle := backendPID(t, ctx, other)
	if held == idle {
		t.Fatal("the two clients shared a backend")
	}
	console := mustConsole(t, ctx, tp.addr, "admin")
	if _, err := console.PgConn().Exec(ctx, "RECONNECT "+appDB).ReadAll(); err != nil {
		t.Fatalf("RECONNECT: %v", err)
	}
	eventually(t, 10*time.Second, "the idle backend to be closed", func() bool {
		return !slices.Contains(backendPIDs(t, ctx, superuser), idle)
	})
	// The transaction goes on, on its own backend, to its end.
	if got := backendPID(t, ctx, holder); got != held {
		t.Errorf("the held transaction moved from backend %d to %d", held, got)
	}
	if _, err := holder.Exec(ctx, "COMMIT"); err != nil {
		t.Fatalf("COMMIT after RECONNECT: %v", err)
	}
	eventually(t, 10*time.Second, "the held backend to be closed after its transaction", func() bool {
		return !slices.Contains(backendPIDs(t, ctx, superuser), held)
	})
	for _, c := range []*pgx.Conn{holder, other} {
		if pid := backendPID(t, ctx, c); pid == held || pid == idle {
			t.Errorf("a client got old backend %d after RECONNECT", pid)
		}
	}
	if !strings.Contains(tp.logs.String(), `"command":"RECONNECT appdb"`) {
		t.Error("RECONNECT was not logged as a console command")
	}
}

// TestConsoleStatsAverages shows SHOW STATS_AVERAGES moving with the load:
// with stats_period at its least, transactions run through the pool give
// a nonzero rate in a window that holds them.
func TestConsoleStatsAverages(t *testing.T) {
	tp := consolePooler(t, "stats_period = 1000")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := tp.connect(t, ctx)
	console := mustConsole(t, ctx, tp.addr, "admin")
	if r := show(t, ctx, console, "stats_averages").find("database", appDB); r == nil || r["xact_count"] != "0" {
		t.Fatalf("averages before any transaction: %v, want 0", r)
	}
	eventually(t, 10*time.Second, "a nonzero avg xact_count", func() bool {
		for range 20 {
			if _, err := client.Exec(ctx, "SELECT 1"); err != nil {
				t.Fatal(err)
			}
		}
		r := show(t, ctx, console, "stats_averages").find("database", appDB)
		return r != nil && atoi(t, r["xact_count"]) > 0 && atoi(t, r["query_count"]) > 0
	})
}

// consoleExec runs one console command, for its error.
func consoleExec(ctx context.Context, console *pgx.Conn, command string) error {
	_, err := console.PgConn().Exec(ctx, command).ReadAll()
	return err
}

// goConsoleExec runs command on console in a goroutine; the channel gets
// its error.
func goConsoleExec(ctx context.Context, console *pgx.Conn, command string) <-chan error {
	done := make(chan error, 1)
	go func() { done <- consoleExec(ctx, console, command) }()
	return done
}

// goExec runs sql on conn in a goroutine; the channel gets its error.
func goExec(ctx context.Context, conn *pgx.Conn, sql string) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(ctx, sql)
		done <- err
	}()
	return done
}

// notWithin fails t if done yields within d: what it waits for must still
// be held.
func notWithin(t *testing.T, done <-chan error, d time.Duration, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s returned early: %v", what, err)
	case <-time.After(d):
	}
}

// within waits up to d for done and returns its error.
func within(t *testing.T, done <-chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
		return nil
	}
}

// pauseScene is what the PAUSE tests start from: a pooler whose
// checkout_timeout outlasts them, a client in a transaction (holder),
// another client logged in (other), and two console sessions.
type pauseScene struct {
	tp                              *testPooler
	holder, other, console, watcher *pgx.Conn
}

func newPauseScene(t *testing.T, ctx context.Context) pauseScene {
	t.Helper()
	tp := consolePooler(t, "checkout_timeout = 30000")
	scene := pauseScene{tp: tp, holder: tp.connect(t, ctx), other: tp.connect(t, ctx)}
	if _, err := scene.holder.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	scene.console, scene.watcher = mustConsole(t, ctx, tp.addr, "admin"), mustConsole(t, ctx, tp.addr, "pgbouncer")
	return scene
}

// TestConsolePauseResume: PAUSE waits for the transaction in flight, closes
// the pool's backends, holds a new transaction until RESUME, and shows in
// SHOW DATABASES; the errors PgBouncer gives (nothing to resume, no such
// database) come with SQLSTATEs.
func TestConsolePauseResume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	superuser := direct(t, ctx)
	scene := newPauseScene(t, ctx)
	tp, holder, waiter, console, watcher := scene.tp, scene.holder, scene.other, scene.console, scene.watcher
	held := backendPID(t, ctx, holder)

	paused := goConsoleExec(ctx, console, "PAUSE "+appDB)
	eventually(t, 10*time.Second, "the idle backends to be closed by PAUSE", func() bool {
		return slices.Equal(backendPIDs(t, ctx, superuser), []int32{held})
	})
	notWithin(t, paused, 200*time.Millisecond, "PAUSE with a transaction in flight")
	if r := show(t, ctx, watcher, "databases").find("name", appDB); r == nil || r["paused"] != "1" {
		t.Errorf("SHOW DATABASES while pausing: %v, want paused 1", r)
	}
	// The transaction in flight goes on; a new one waits.
	if got := backendPID(t, ctx, holder); got != held {
		t.Errorf("the transaction in flight moved from backend %d to %d", held, got)
	}
	queried := goExec(ctx, waiter, "SELECT 1")
	eventually(t, 10*time.Second, "the new transaction to wait in line", func() bool {
		r := show(t, ctx, watcher, "pools").find("database", appDB)
		return r != nil && r["cl_waiting"] == "1"
	})
	if _, err := holder.Exec(ctx, "COMMIT"); err != nil {
		t.Fatalf("COMMIT while pausing: %v", err)
	}
	if err := within(t, paused, 10*time.Second, "PAUSE"); err != nil {
		t.Fatalf("PAUSE: %v", err)
	}
	if pids := backendPIDs(t, ctx, superuser); len(pids) != 0 {
		t.Errorf("backends left when PAUSE returned: %v", pids)
	}
	notWithin(t, queried, 200*time.Millisecond, "a transaction while paused")
	if err := consoleExec(ctx, watcher, "PAUSE nosuchdb"); sqlState(err) != "42704" {
		t.Errorf("PAUSE of no database: %v, want 42704", err)
	}

	if err := consoleExec(ctx, console, "RESUME "+appDB); err != nil {
		t.Fatalf("RESUME: %v", err)
	}
	if err := within(t, queried, 10*time.Second, "the held transaction after RESUME"); err != nil {
		t.Fatalf("the held transaction after RESUME: %v", err)
	}
	if _, err := holder.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("a transaction after RESUME: %v", err)
	}
	if r := show(t, ctx, watcher, "databases").find("name", appDB); r == nil || r["paused"] != "0" {
		t.Errorf("SHOW DATABASES after RESUME: %v, want paused 0", r)
	}
	if err := consoleExec(ctx, console, "RESUME "+appDB); sqlState(err) != "55000" {
		t.Errorf("RESUME of a database not paused: %v, want 55000", err)
	}
	if err := consoleExec(ctx, console, "RESUME"); sqlState(err) != "55000" {
		t.Errorf("RESUME with nothing paused: %v, want 55000", err)
	}
	for _, command := range []string{"PAUSE " + appDB, "RESUME " + appDB} {
		if !strings.Contains(tp.logs.String(), `"command":"`+command+`"`) {
			t.Errorf("%s was not logged as a console command", command)
		}
	}
}

// TestConsolePauseCanceled: PAUSE of the whole pooler shows in SHOW
// STATE, and a CancelRequest from its client (psql's ^C) ends the wait
// with 57014 and resumes, as PgBouncer's cancel of a PAUSE does: the
// transaction that held it up and a new one both go on.
func TestConsolePauseCanceled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	scene := newPauseScene(t, ctx)
	holder, other, console, watcher := scene.holder, scene.other, scene.console, scene.watcher
	paused := goConsoleExec(ctx, console, "PAUSE")
	eventually(t, 10*time.Second, "SHOW STATE to say paused", func() bool {
		state := show(t, ctx, watcher, "state")
		return state.find("key", "paused")["value"] == "yes" && state.find("key", "active")["value"] == "no"
	})
	if err := consoleExec(ctx, watcher, "PAUSE "+appDB); sqlState(err) != "55000" {
		t.Errorf("PAUSE of a database while everything is paused: %v, want 55000", err)
	}
	if err := console.PgConn().CancelRequest(ctx); err != nil {
		t.Fatal(err)
	}
	if err := within(t, paused, 10*time.Second, "the canceled PAUSE"); sqlState(err) != "57014" {
		t.Fatalf("canceled PAUSE: %v, want 57014", err)
	}
	if got := show(t, ctx, watcher, "state").find("key", "paused")["value"]; got != "no" {
		t.Errorf("SHOW STATE paused after the cancel: %q, want no", got)
	}
	for _, c := range []*pgx.Conn{other, holder} {
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("a query after the canceled PAUSE: %v", err)
		}
	}
	if _, err := holder.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	// The console session goes on.
	if r := show(t, ctx, console, "databases").find("name", appDB); r == nil || r["paused"] != "0" {
		t.Errorf("SHOW DATABASES after the canceled PAUSE: %v", r)
	}
}

// TestConsoleShutdownWaitForClients runs SHUTDOWN WAIT_FOR_CLIENTS on the
// binary: new connections are refused and /readyz fails at once, while the
// clients logged in (the console's too) are served as before, a
// transaction included; the process exits 0 when the last one leaves.
func TestConsoleShutdownWaitForClients(t *testing.T) {
	const adminSection = "\n[admin]\npassword = \"" + consolePassword + "\"\n"
	healthPort := freePort(t)
	pr := startProcessWith(t, processOptions{
		general:        fmt.Sprintf("healthcheck_port = %d", healthPort),
		pool:           "pool_size = 2",
		extraDatabases: adminSection,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	readyz := fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort)
	eventually(t, 10*time.Second, "/readyz to answer 200", func() bool { return httpStatus(readyz) == http.StatusOK })
	client, err := pr.connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close(context.Background())
	if _, err := client.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	console, err := consoleConnect(ctx, pr.addr, consoleUser, consolePassword, "pgbouncer")
	if err != nil {
		t.Fatal(err)
	}
	defer console.Close(context.Background())
	if err := consoleExec(ctx, console, "SHUTDOWN WAIT_FOR_CLIENTS"); err != nil {
		t.Fatalf("SHUTDOWN WAIT_FOR_CLIENTS: %v", err)
	}
	if _, err := pr.connect(ctx); err == nil {
		t.Fatal("a new connection was accepted after SHUTDOWN WAIT_FOR_CLIENTS")
	}
	if got := httpStatus(readyz); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz after SHUTDOWN WAIT_FOR_CLIENTS: %d, want 503", got)
	}
	if got := show(t, ctx, console, "state").find("key", "shutting_down")["value"]; got != "yes" {
		t.Errorf("SHOW STATE shutting_down = %q, want yes", got)
	}
	// The clients logged in are served as before, across transactions.
	for _, sql := range []string{"SELECT 1", "COMMIT", "SELECT 1", "BEGIN", "SELECT 1", "COMMIT"} {
		if _, err := client.Exec(ctx, sql); err != nil {
			t.Fatalf("%s after SHUTDOWN WAIT_FOR_CLIENTS: %v", sql, err)
		}
	}
	select {
	case <-pr.exited:
		t.Fatal("pgtender exited with clients logged in")
	case <-time.After(300 * time.Millisecond):
	}
	client.Close(ctx)
	select {
	case <-pr.exited:
		t.Fatal("pgtender exited with the console's client logged in")
	case <-time.After(300 * time.Millisecond):
	}
	console.Close(ctx)
	if code := pr.waitExit(t, 15*time.Second); code != 0 {
		t.Fatalf("pgtender exited %d after its last client left", code)
	}
	for _, line := range []string{"SHUTDOWN WAIT_FOR_CLIENTS on the admin console", "the last client has left", `"msg":"drained"`} {
		if !strings.Contains(pr.output.String(), line) {
			t.Errorf("the log lacks %q", line)
		}
	}
}

// TestConsoleShutdownWhilePaused: a shutdown during a pause ends a PAUSE
// still waiting (57P01) and the transactions waiting in line, and returns
// once the transaction in flight has ended.
func TestConsoleShutdownWhilePaused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	scene := newPauseScene(t, ctx)
	tp, holder, waiter, console, watcher := scene.tp, scene.holder, scene.other, scene.console, scene.watcher
	paused := goConsoleExec(ctx, console, "PAUSE")
	queried := goExec(ctx, waiter, "SELECT 1")
	eventually(t, 10*time.Second, "the new transaction to wait in line", func() bool {
		r := show(t, ctx, watcher, "pools").find("database", appDB)
		return r != nil && r["cl_waiting"] == "1"
	})
	shutdownCtx, stop := context.WithTimeout(ctx, 20*time.Second)
	defer stop()
	shutdown := make(chan error, 1)
	go func() { shutdown <- tp.Shutdown(shutdownCtx) }()
	if err := within(t, paused, 10*time.Second, "PAUSE at shutdown"); sqlState(err) != "57P01" {
		t.Errorf("PAUSE at shutdown: %v, want 57P01", err)
	}
	if err := within(t, queried, 10*time.Second, "a waiting transaction at shutdown"); err == nil {
		t.Error("a transaction waiting while paused ran during the shutdown")
	}
	if _, err := holder.Exec(ctx, "COMMIT"); err != nil {
		t.Errorf("COMMIT of the transaction in flight at shutdown: %v", err)
	}
	if err := within(t, shutdown, 15*time.Second, "Shutdown"); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// TestConsolePreparedStatements: SHOW PREPARED_STATEMENTS lists the
// statements clients prepared in a pool under their server-side names,
// with the text, the declared parameters and whether Postgres prepared
// them; two clients preparing one text share one row.
func TestConsolePreparedStatements(t *testing.T) {
	tp := consolePooler(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const text = "SELECT $1::int + 41"
	for _, name := range []string{"mine", "theirs"} {
		client := tp.connect(t, ctx)
		if _, err := client.PgConn().Prepare(ctx, name, text, []uint32{23}); err != nil {
			t.Fatalf("Prepare %s: %v", name, err)
		}
		results := client.PgConn().ExecPrepared(ctx, name, [][]byte{[]byte("1")}, nil, nil).Read()
		err := results.Err
		if err != nil || len(results.Rows) != 1 || string(results.Rows[0][0]) != "42" {
			t.Fatalf("running %s: %v, %v", name, results.Rows, err)
		}
	}
	console := mustConsole(t, ctx, tp.addr, "admin")
	result := show(t, ctx, console, "prepared_statements")
	checkColumns(t, "prepared_statements", result.columns, admin.PreparedStatements)
	if n := result.count("statement", text); n != 1 {
		t.Fatalf("SHOW PREPARED_STATEMENTS has %d rows of %q, want 1 (shared by both clients): %v", n, text, result.rows)
	}
	r := result.find("statement", text)
	if r["database"] != appDB || r["user"] != appUser || !strings.HasPrefix(r["name"], "pgtender_") ||
		r["parameters"] != "1" || r["prepared"] != "1" || atoi(t, r["memory_used"]) < len(text) {
		t.Errorf("SHOW PREPARED_STATEMENTS row: %v", r)
	}
}
