package wire

import "fmt"

// Backend messages the pooler decodes off the hot path: the rows of a query
// it runs itself (probing a server connection's session settings) and the
// fields of an error. Layouts are in the PostgreSQL documentation, "Message
// Formats" and "Error and Notice Message Fields".

// Fields of an ErrorResponse or NoticeResponse the pooler looks at; the
// documentation lists the rest.
const (
	FieldSeverity             byte = 'S' // localized severity
	FieldSeverityNonLocalized byte = 'V' // ERROR, FATAL, ...; never translated
	FieldCode                 byte = 'C' // SQLSTATE
	FieldMessage              byte = 'M' // primary message
)

// DecodeDataRow appends the column values of a DataRow body to values and
// returns the extended slice: nil for SQL NULL, otherwise the value's bytes
// aliasing body (an empty value is empty but not nil). The column count is
// read as 0..65535, as libpq and pgproto3 read it; a value length below -1,
// one longer than what is left, or bytes after the last value are errors
// wrapping ErrMalformedMessage, and then values is returned as it was
// given (its spare capacity may have been written). Pass values[:0] of a
// reused slice to decode without allocating.
func DecodeDataRow(body []byte, values [][]byte) ([][]byte, error) {
	if len(body) < 2 {
		return values, malformed("DataRow", "no column count")
	}
	given := values
	n := int(getUint16(body))
	off := 2
	for i := range n {
		if len(body)-off < 4 {
			return given, malformed("DataRow", fmt.Sprintf("column %d of %d: no length", i, n))
		}
		length := int(int32(getUint32(body[off:])))
		off += 4
		switch {
		case length == -1:
			values = append(values, nil)
		case length < 0 || length > len(body)-off:
			return given, malformed("DataRow", fmt.Sprintf("column %d of %d: length %d with %d bytes left", i, n, length, len(body)-off))
		default:
			values = append(values, body[off:off+length:off+length])
			off += length
		}
	}
	if off != len(body) {
		return given, malformed("DataRow", fmt.Sprintf("%d bytes after %d columns", len(body)-off, n))
	}
	return values, nil
}

// NextField splits the first field off an ErrorResponse or NoticeResponse
// body (a field type byte, then the value as a NUL-terminated string; a
// zero byte ends the list) and returns the type, the value without its
// NUL, aliasing body, the body after the field, and true; or false at the
// zero byte that ends the list or at the end of body. Walk a body with
//
//	for typ, value, rest, ok := wire.NextField(body); ok; typ, value, rest, ok = wire.NextField(rest) {
//
// body may be just the first bytes of the message (the Scanner's inspected
// bytes): a last value that body ends in the middle of is returned as far
// as it goes, with an empty rest, so a prefix match on it still works. A
// type byte alone at the end of body is not a field.
func NextField(body []byte) (typ byte, value, rest []byte, ok bool) {
	if len(body) < 2 || body[0] == 0 {
		return 0, nil, nil, false
	}
	value, off, terminated := cstring(body, 1)
	if !terminated {
		return body[0], body[1:len(body):len(body)], body[len(body):], true
	}
	return body[0], value, body[off:], true
}

// ErrorFields returns the SQLSTATE code and the primary message of an
// ErrorResponse or NoticeResponse body, aliasing body; a field the body
// lacks is nil, and of a field sent twice the last counts. Like NextField,
// it accepts the first bytes of a body. Comparisons such as
// string(code) == "57014" do not allocate.
func ErrorFields(body []byte) (code, message []byte) {
	for typ, value, rest, ok := NextField(body); ok; typ, value, rest, ok = NextField(rest) {
		switch typ {
		case FieldCode:
			code = value
		case FieldMessage:
			message = value
		}
	}
	return code, message
}
