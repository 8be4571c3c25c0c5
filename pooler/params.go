package pooler

import "strings"

// trackedParameters are the settings whose values follow a client from one
// server connection to the next in transaction mode: the ones Postgres
// reports with ParameterStatus whenever they change (GUC_REPORT) and that a
// client may set. They are what PgBouncer tracks, plus IntervalStyle and
// default_transaction_read_only. A client's value comes from its startup
// packet and from the ParameterStatus messages of its own server
// connections; a server connection's value from the ParameterStatus
// messages it sent. When a client is linked to a server connection whose
// values differ, pgtender sets the client's values first.
//
// Other settings (search_path, statement_timeout…) are not reported by
// Postgres and do not follow the client yet; see docs/pooling.md.
var trackedParameters = []string{
	"application_name",
	"client_encoding",
	"DateStyle",
	"default_transaction_read_only",
	"IntervalStyle",
	"standard_conforming_strings",
	"TimeZone",
}

// trackedParameter returns the canonical name of a tracked parameter, or ""
// when name is not tracked. Startup packets may spell names in any case.
func trackedParameter(name string) string {
	for _, tracked := range trackedParameters {
		if strings.EqualFold(name, tracked) {
			return tracked
		}
	}
	return ""
}

// parameterValues maps tracked parameter names to values.
type parameterValues map[string]string

// clone returns a copy of v.
func (v parameterValues) clone() parameterValues {
	c := make(parameterValues, len(v))
	for name, value := range v {
		c[name] = value
	}
	return c
}

// parseParameterStatus returns the name and value of a ParameterStatus
// body; ok is false when the body was cut short by the scanner's inspection
// limit or is malformed.
func parseParameterStatus(body []byte, length int) (name, value string, ok bool) {
	if len(body) != length {
		return "", "", false
	}
	nameEnd := indexZero(body)
	if nameEnd < 0 {
		return "", "", false
	}
	rest := body[nameEnd+1:]
	valueEnd := indexZero(rest)
	if valueEnd < 0 {
		return "", "", false
	}
	return string(body[:nameEnd]), string(rest[:valueEnd]), true
}

func indexZero(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

// unknownValue marks a server-side value pgtender could not read (a
// ParameterStatus longer than the inspection limit): it never equals a
// client's value, so the next client sets its own.
const unknownValue = "\x00unknown"

// setStatements returns the SET statements that bring a server connection
// whose values are server to the client's values, or "" when they agree.
// Values are quoted as string literals, which Postgres accepts for every
// one of these settings.
func setStatements(client, server parameterValues) string {
	var b strings.Builder
	for _, name := range trackedParameters {
		want, ok := client[name]
		if !ok || server[name] == want {
			continue
		}
		b.WriteString("SET ")
		b.WriteString(name)
		b.WriteString(" = ")
		b.WriteString(quoteLiteral(want))
		b.WriteString(";")
	}
	return b.String()
}

// quoteLiteral quotes s as a standard SQL string literal.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// inspectParameterStatus is how much of a ParameterStatus body the scanner
// copies out: every tracked value is far shorter (application_name is at
// most 63 bytes).
const inspectParameterStatus = 256
