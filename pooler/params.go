package pooler

import (
	"sort"
	"strings"
)

// Session settings follow a client from one server connection to the next
// in transaction mode. A client's settings are the run-time parameters set
// at session level on its behalf: from its startup packet (parameters and
// options -c), and from what it ran since (SET, RESET, set_config(…,
// false), SET ROLE…), as the server reported them in a probe (probe.go)
// after a transaction that may have changed them. A server connection's
// settings are the same for its own session: what pgtender set on it, or
// probed. When a client is linked to a server connection whose settings
// differ, pgtender brings the server connection in line first
// (alignStatements), in one round trip; none when they agree, the usual case
// in a fleet whose clients all set the same things. A server connection
// handed to another client therefore carries none of the previous client's
// settings.
//
// Values are kept as current_setting() spells them ("5s", not the "5000"
// of pg_settings.setting), the same form set_config returns, so that a
// client and a server connection that agree compare equal.

// sessionSettings maps a lower-cased parameter name to its setting.
// A nil map is an empty one. Values are immutable once shared: callers
// clone before they change a map another goroutine may hold.
type sessionSettings map[string]setting

// setting is one parameter: its name as Postgres spells it, and its value.
type setting struct{ name, value string }

// settingKey is the key of name in a sessionSettings: parameter names are
// compared without regard to the case of ASCII letters, and only of those
// (guc_name_compare in src/backend/utils/misc/guc.c).
func settingKey(name string) string {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c >= 'A' && c <= 'Z' {
			folded := []byte(name)
			for j := i; j < len(folded); j++ {
				if c := folded[j]; c >= 'A' && c <= 'Z' {
					folded[j] = c + 'a' - 'A'
				}
			}
			return string(folded)
		}
	}
	return name
}

func (s sessionSettings) set(name, value string) {
	s[settingKey(name)] = setting{name: name, value: value}
}

// clone returns a copy of s.
func (s sessionSettings) clone() sessionSettings {
	c := make(sessionSettings, len(s))
	for key, value := range s {
		c[key] = value
	}
	return c
}

// equal reports whether s and other hold the same values.
func (s sessionSettings) equal(other sessionSettings) bool {
	if len(s) != len(other) {
		return false
	}
	for key, want := range s {
		if got, ok := other[key]; !ok || got.value != want.value {
			return false
		}
	}
	return true
}

// overlaid returns base with s on top: s's values win.
func (s sessionSettings) overlaid(base sessionSettings) sessionSettings {
	merged := base.clone()
	for key, value := range s {
		merged[key] = value
	}
	return merged
}

// alignStatements returns the SQL that brings a server connection whose
// settings are have to want, or "" when they agree: RESET for what have has
// and want lacks (back to the server's default: pgtender opens server
// connections with no run-time parameters), set_config for what differs.
// set_config takes the value as the server spells it, which a SET of a
// quoted literal does not for list parameters such as search_path.
func alignStatements(want, have sessionSettings) string {
	var resets, sets []string
	for key := range have {
		if _, ok := want[key]; !ok {
			resets = append(resets, "RESET "+quoteParameterName(key))
		}
	}
	for key, wanted := range want {
		if had, ok := have[key]; !ok || had.value != wanted.value {
			sets = append(sets, "pg_catalog.set_config("+quoteLiteral(wanted.name)+", "+quoteLiteral(wanted.value)+", false)")
		}
	}
	if len(resets) == 0 && len(sets) == 0 {
		return ""
	}
	// A stable order, for the logs and the tests.
	sort.Strings(resets)
	sort.Strings(sets)
	var b strings.Builder
	for _, reset := range resets {
		b.WriteString(reset)
		b.WriteString(";")
	}
	if len(sets) > 0 {
		b.WriteString("SELECT ")
		b.WriteString(strings.Join(sets, ", "))
		b.WriteString(";")
	}
	return b.String()
}

// quoteParameterName writes a parameter name for RESET: as it is when it is
// made of plain lower-case identifiers (a custom "app.tenant" must be
// written with its dot, unquoted), else each part double-quoted.
func quoteParameterName(name string) string {
	plain := name != ""
	for i := 0; i < len(name) && plain; i++ {
		c := name[i]
		plain = c == '_' || c == '.' || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9' && i > 0)
	}
	if plain {
		return name
	}
	parts := strings.Split(name, ".")
	for i, part := range parts {
		parts[i] = `"` + strings.ReplaceAll(part, `"`, `""`) + `"`
	}
	return strings.Join(parts, ".")
}

// quoteLiteral quotes s as an SQL string literal that reads the same
// whatever the session's standard_conforming_strings. pgtender's queries
// run in sessions whose settings a client chose; with the setting off, a
// backslash in a plain '...' literal starts an escape, so that a value
// ending in a backslash would take the closing quote as its own. A value
// with a backslash is therefore written as an escape string, E'...', which
// takes backslash escapes either way, each backslash doubled (the
// documentation's "String Constants with C-Style Escapes").
func quoteLiteral(s string) string {
	quoted := strings.ReplaceAll(s, "'", "''")
	if !strings.Contains(s, `\`) {
		return "'" + quoted + "'"
	}
	return "E'" + strings.ReplaceAll(quoted, `\`, `\\`) + "'"
}

// reportedParameters are the settings a client may change that Postgres
// reports with ParameterStatus whenever they change (GUC_REPORT). A client
// that sets one at startup is told its own value at login, as Postgres
// would tell it; a ParameterStatus for one while a client's request runs
// means its settings changed (a SET inside a function, say), so they are
// probed at the end of the transaction.
var reportedParameters = []string{
	"application_name",
	"client_encoding",
	"DateStyle",
	"default_transaction_read_only",
	"IntervalStyle",
	"standard_conforming_strings",
	"TimeZone",
}

// reportedParameter returns the canonical name of a reported parameter, or
// "" when name is not one. Startup packets may spell names in any case.
func reportedParameter(name string) string {
	for _, reported := range reportedParameters {
		if strings.EqualFold(name, reported) {
			return reported
		}
	}
	return ""
}

// parameterStatusName returns the parameter name at the start of a
// ParameterStatus body, or "" when the inspected bytes do not hold it.
func parameterStatusName(body []byte) string {
	if end := indexZero(body); end > 0 {
		return string(body[:end])
	}
	return ""
}

func indexZero(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

// inspectParameterStatus is how much of a ParameterStatus body the scanner
// copies out: enough for the name, which is all the relay needs.
const inspectParameterStatus = 64
