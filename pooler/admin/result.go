package admin

import (
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgtender/pgtender/pooler/wire"
)

// Type is a column's type OID, one of the four the SHOW tables use of
// those PgBouncer's console sends (src/pktbuf.c,
// pktbuf_write_RowDescription): exporters that scan a column into a
// number rely on it.
type Type uint32

const (
	Text    Type = 25   // 's' and 'T' (a time formatted as text) in PgBouncer
	Int4    Type = 23   // 'i'
	Int8    Type = 20   // 'q'
	Numeric Type = 1700 // 'N': PgBouncer's 64-bit counters
)

func (t Type) String() string {
	switch t {
	case Text:
		return "text"
	case Int4:
		return "int4"
	case Int8:
		return "int8"
	case Numeric:
		return "numeric"
	}
	return fmt.Sprintf("Type(%d)", uint32(t))
}

// size is the type's typlen in RowDescription: fixed for the integers,
// -1 (variable) for the others.
func (t Type) size() int16 {
	switch t {
	case Int4:
		return 4
	case Int8:
		return 8
	}
	return -1
}

// Column is one column of a result.
type Column struct {
	Name string
	Type Type
}

// Result is a console result set: its columns and rows. A row's values
// are nil (NULL), string, int, int64 or uint64, one per column.
type Result struct {
	Columns []Column
	Rows    [][]any
}

// Add appends a row; it panics if the row's width is not the columns'
// (a programming error in the table that built it, caught by its tests).
func (r *Result) Add(values ...any) {
	if len(values) != len(r.Columns) {
		panic(fmt.Sprintf("admin: row of %d values for %d columns", len(values), len(r.Columns)))
	}
	r.Rows = append(r.Rows, values)
}

// Append frames the result as the server sends a query's result:
// RowDescription, a DataRow per row (text format), and CommandComplete
// with tag ("SHOW", as PgBouncer tags every SHOW).
func (r *Result) Append(dst []byte, tag string) []byte {
	fields := make([]pgproto3.FieldDescription, len(r.Columns))
	for i, c := range r.Columns {
		fields[i] = pgproto3.FieldDescription{Name: []byte(c.Name), DataTypeOID: uint32(c.Type), DataTypeSize: c.Type.size(), TypeModifier: -1}
	}
	dst = mustEncode(dst, &pgproto3.RowDescription{Fields: fields})
	values := make([][]byte, len(r.Columns))
	for _, row := range r.Rows {
		for i, v := range row {
			values[i] = formatValue(v)
		}
		dst = mustEncode(dst, &pgproto3.DataRow{Values: values})
	}
	return wire.AppendCommandComplete(dst, tag)
}

// formatValue is one value's text, nil for NULL.
func formatValue(v any) []byte {
	switch v := v.(type) {
	case nil:
		return nil
	case string:
		return []byte(v)
	case int:
		return strconv.AppendInt(nil, int64(v), 10)
	case int64:
		return strconv.AppendInt(nil, v, 10)
	case uint64:
		return strconv.AppendUint(nil, v, 10)
	}
	panic(fmt.Sprintf("admin: value of type %T", v))
}

// AppendNotice appends a NoticeResponse of severity NOTICE, code 00000,
// with message and detail (PgBouncer answers SHOW HELP so).
func AppendNotice(dst []byte, message, detail string) []byte {
	return mustEncode(dst, &pgproto3.NoticeResponse{Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: "00000", Message: message, Detail: detail})
}

// mustEncode appends msg; encoding fails only for a message over 1 GiB,
// which no console result reaches.
func mustEncode(dst []byte, msg pgproto3.BackendMessage) []byte {
	out, err := msg.Encode(dst)
	if err != nil {
		panic("BUG: encoding a console result: " + err.Error())
	}
	return out
}
