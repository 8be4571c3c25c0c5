package pooler

import (
	"net"
	"testing"
	"time"

	"github.com/pgtender/pgtender/pooler/wire"
)

// loginParameters is what a client logging in now is told.
func loginParameters(p *Pool) map[string]string {
	params := map[string]string{}
	if current := p.params.Load(); current != nil {
		for _, param := range *current {
			params[param.name] = param.value
		}
	}
	return params
}

func TestStoreParamsFollowsNewServerConnections(t *testing.T) {
	pool := newPool(poolKey{user: "u", database: "d"}, poolSettings{}, nil)
	first := &ServerConn{params: map[string]string{"server_version": "15.8", "TimeZone": "UTC", "in_hot_standby": "on"}}
	pool.storeParams(first)
	before := pool.params.Load()
	if got := loginParameters(pool); got["TimeZone"] != "UTC" || got["in_hot_standby"] != "on" {
		t.Fatalf("first set: %v", got)
	}

	// A connection that reports the same set changes nothing, not even
	// the pointer logins load.
	pool.storeParams(&ServerConn{params: map[string]string{"server_version": "15.8", "TimeZone": "UTC", "in_hot_standby": "on"}})
	if pool.params.Load() != before {
		t.Error("the set was replaced by an equal one")
	}

	// After a failover or a changed configuration, the next connection
	// opened says what the server is now.
	pool.storeParams(&ServerConn{params: map[string]string{"server_version": "16.4", "TimeZone": "Asia/Kolkata", "in_hot_standby": "off"}})
	if got := loginParameters(pool); got["server_version"] != "16.4" || got["TimeZone"] != "Asia/Kolkata" || got["in_hot_standby"] != "off" {
		t.Errorf("after a new server connection: %v", got)
	}
	if params := *pool.params.Load(); params[0].name != "TimeZone" || params[2].name != "server_version" {
		t.Errorf("not sorted by name: %v", params)
	}
}

func TestNoteParameterStatus(t *testing.T) {
	pool := newPool(poolKey{user: "u", database: "d"}, poolSettings{}, nil)
	sc := &ServerConn{pool: pool, params: map[string]string{"in_hot_standby": "on", "default_transaction_read_only": "off", "TimeZone": "UTC"}}
	// Before the pool has a set, a report has nothing to update.
	sc.noteParameterStatus(parameterStatusBody("in_hot_standby", "off"))
	if pool.params.Load() != nil {
		t.Fatal("a report made a set")
	}
	pool.storeParams(sc)

	// A client's SET makes Postgres report these too: not the pool's.
	sc.noteParameterStatus(parameterStatusBody("default_transaction_read_only", "on"))
	sc.noteParameterStatus(parameterStatusBody("TimeZone", "Europe/Paris"))
	sc.noteParameterStatus([]byte("in_hot_standby\x00of")) // cut short by the inspection
	before := pool.params.Load()
	if got := loginParameters(pool); got["default_transaction_read_only"] != "off" || got["TimeZone"] != "UTC" || got["in_hot_standby"] != "on" {
		t.Errorf("after reports of client settings: %v", got)
	}

	// A promotion: every session reports in_hot_standby off.
	sc.noteParameterStatus(parameterStatusBody("in_hot_standby", "off"))
	if got := loginParameters(pool); got["in_hot_standby"] != "off" || len(got) != 3 {
		t.Errorf("after in_hot_standby off: %v", got)
	}
	for _, param := range *before {
		if param.name == "in_hot_standby" && param.value != "on" {
			t.Error("the set logins held was changed in place")
		}
	}
	timeZone := parameterStatusBody("TimeZone", "Europe/Paris")
	allocs := testing.AllocsPerRun(100, func() { sc.noteParameterStatus(timeZone) })
	if allocs != 0 {
		t.Errorf("a report of a client's setting: %v allocations", allocs)
	}
}

// parameterStatusBody is the body of a ParameterStatus message.
func parameterStatusBody(name, value string) []byte {
	return wire.AppendParameterStatus(nil, name, value)[wire.HeaderLen:]
}

// TestOwnQueryNoticesServerParameters: a report of in_hot_standby in reply
// to pgtender's own statement (bringing a server connection in line,
// ROLLBACK) reaches the pool's set too.
func TestOwnQueryNoticesServerParameters(t *testing.T) {
	pool := newPool(poolKey{user: "u", database: "d"}, poolSettings{}, nil)
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	sc := &ServerConn{conn: client, buf: make([]byte, 1024), pool: pool, params: map[string]string{"in_hot_standby": "on"}}
	sc.scanner.Inspect = inspectServerMessage
	pool.storeParams(sc)
	go func() {
		buf := make([]byte, 1024)
		_, _ = server.Read(buf) // the Query
		reply := wire.AppendParameterStatus(nil, "in_hot_standby", "off")
		reply = wire.AppendMessage(reply, 'C', []byte("SET\x00"))
		reply = wire.AppendReadyForQuery(reply, wire.TxIdle)
		_, _ = server.Write(reply)
	}()
	if err := sc.exec("SET x = 1", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := loginParameters(pool)["in_hot_standby"]; got != "off" {
		t.Errorf("in_hot_standby = %q after the report", got)
	}
}

// TestLoginsAreToldTheServerAsItIsNow: through the relay, a report of
// in_hot_standby off during a client's statement, and a new server
// connection after the old one died, change what the next client logging
// in is told; a client's own setting reported by the server does not.
func TestLoginsAreToldTheServerAsItIsNow(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.setReported("in_hot_standby", "on")
	h.fake.setReported("session_authorization", "srv")
	a := h.connect()
	if got := a.ParameterStatus("in_hot_standby"); got != "on" {
		t.Fatalf("first login told in_hot_standby = %q", got)
	}

	mustExec(t, a, "REPORT in_hot_standby off")
	mustExec(t, a, "REPORT session_authorization other") // a client's SET SESSION AUTHORIZATION
	b := h.connect()
	if got := b.ParameterStatus("in_hot_standby"); got != "off" {
		t.Errorf("after the promotion a login is told in_hot_standby = %q", got)
	}
	if got := b.ParameterStatus("session_authorization"); got != "srv" {
		t.Errorf("another client's SET reached a login: session_authorization = %q", got)
	}

	// The server's configuration changes; its old connection goes away
	// and the pool opens a new one.
	h.fake.setReported("TimeZone", "Asia/Kolkata")
	h.fake.setReported("in_hot_standby", "off")
	old := mustWhoami(t, a)
	// Killed once it is back in the pool: the client reads its reply
	// before readServer releases the connection, and a connection killed
	// while still linked ends the client's session (08006).
	h.waitIdle(1)
	h.fake.kill(old)
	waitFor(t, "the old connection to end", func() bool { return h.fake.byPID(old).Ended() })
	if pid := mustWhoami(t, a); pid == old {
		t.Fatal("the query ran on the killed connection")
	}
	c := h.connect()
	if got := c.ParameterStatus("TimeZone"); got != "Asia/Kolkata" {
		t.Errorf("after a new server connection a login is told TimeZone = %q", got)
	}
	if got := c.ParameterStatus("in_hot_standby"); got != "off" {
		t.Errorf("in_hot_standby = %q", got)
	}
}

// TestProbeNoticesServerParameters: a report of in_hot_standby inside the
// probe's reply, which pgtender reads itself and does not relay, reaches
// the pool's set too: the next client to log in is told the new value.
func TestProbeNoticesServerParameters(t *testing.T) {
	h := newHarness(t, nil)
	h.fake.setReported("in_hot_standby", "on")
	a := h.connect()
	if got := a.ParameterStatus("in_hot_standby"); got != "on" {
		t.Fatalf("first login told in_hot_standby = %q", got)
	}

	h.fake.reportDuringProbes("in_hot_standby", "off")
	mustExec(t, a, "SET search_path = tenant_1")
	h.waitIdle(1)
	if n := h.fake.connList()[0].probes(); n != 1 {
		t.Fatalf("the server connection got %d probes, want 1", n)
	}
	b := h.connect()
	if got := b.ParameterStatus("in_hot_standby"); got != "off" {
		t.Errorf("after a probe's reply reported the promotion a login is told in_hot_standby = %q", got)
	}
}
