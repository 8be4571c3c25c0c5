package pooler

import (
	"bytes"
	"slices"
	"strings"
)

// A client is told at login the ParameterStatus set of its pool's server
// connections (server_version, TimeZone, in_hot_standby,
// default_transaction_read_only…), so that it knows the server as a direct
// connection would. That set is what the server connection opened last
// reported at its own start (storeParams): after a failover, a promotion,
// or an ALTER SYSTEM or ALTER DATABASE … SET followed by new server
// connections, new clients are told what the server says now, not what the
// pool's first connection said. Logins only load the set; it is replaced,
// never changed in place, and only when a value differs.
//
// A server connection in use also reports changes (ParameterStatus). Most
// reported parameters are also a client's to SET, so such a report may be
// one client's own doing and is not taken for the pool's. in_hot_standby
// is the server's alone (a client cannot set it), and once a standby is
// promoted each session reports it off at its next statement: a report of
// it from any server connection updates the set (noteParameterStatus).

// storeParams takes the ParameterStatus set a newly opened server
// connection reported as the one the pool's client logins are told, when
// it differs from the one they are told now.
func (p *Pool) storeParams(sc *ServerConn) {
	if len(sc.params) == 0 {
		return
	}
	p.paramsMu.Lock()
	defer p.paramsMu.Unlock()
	if current := p.params.Load(); current != nil && sameParameters(*current, sc.params) {
		return // the usual case: nothing changed
	}
	params := make([]serverParameter, 0, len(sc.params))
	for name, value := range sc.params {
		params = append(params, serverParameter{name: name, value: value, key: settingKey(name)})
	}
	// Sorted, so that every login sends the set in the same order.
	slices.SortFunc(params, compareParameters)
	p.params.Store(&params)
}

func compareParameters(a, b serverParameter) int { return strings.Compare(a.name, b.name) }

// sameParameters reports whether params holds exactly the values of
// reported.
func sameParameters(params []serverParameter, reported map[string]string) bool {
	if len(params) != len(reported) {
		return false
	}
	for _, param := range params {
		if value, ok := reported[param.name]; !ok || value != param.value {
			return false
		}
	}
	return true
}

// reportParameter takes a new value of a parameter only the server changes
// (serverOwnedParameter), which a server connection of the pool reported
// while in use, into the set client logins are told.
func (p *Pool) reportParameter(name, value string) {
	p.paramsMu.Lock()
	defer p.paramsMu.Unlock()
	current := p.params.Load()
	if current == nil {
		return // the first server connection's set comes with it
	}
	i := slices.IndexFunc(*current, func(param serverParameter) bool { return param.name == name })
	if i >= 0 && (*current)[i].value == value {
		return
	}
	params := slices.Clone(*current)
	if i >= 0 {
		params[i].value = value
	} else {
		params = append(params, serverParameter{name: name, value: value, key: settingKey(name)})
		slices.SortFunc(params, compareParameters)
	}
	p.params.Store(&params)
}

// serverOwnedParameter reports whether a reported parameter is one that no
// client can change in its session: in_hot_standby (GUC_REPORT and
// PGC_INTERNAL in src/backend/utils/misc/guc_tables.c), which Postgres
// reports turned off once a standby is promoted (ReportChangedGUCOptions in
// src/backend/utils/misc/guc.c).
func serverOwnedParameter(name []byte) bool {
	return string(name) == "in_hot_standby"
}

// noteParameterStatus looks at a ParameterStatus sc sent while in use (its
// body, or the first bytes of it that were inspected) and takes a new value
// of a server-owned parameter into its pool's login set. Anything else is
// left to the relay and the probe. It allocates only for such a report.
func (sc *ServerConn) noteParameterStatus(body []byte) {
	nameEnd := bytes.IndexByte(body, 0)
	if nameEnd <= 0 || !serverOwnedParameter(body[:nameEnd]) {
		return
	}
	value := body[nameEnd+1:]
	valueEnd := bytes.IndexByte(value, 0)
	if valueEnd < 0 {
		return // cut short by the inspection: not a value to trust
	}
	sc.pool.reportParameter(string(body[:nameEnd]), string(value[:valueEnd]))
}
