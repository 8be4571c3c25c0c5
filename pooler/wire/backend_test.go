package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// appendDataRowBody is the inverse of DecodeDataRow, for the tests: the
// pooler never writes rows itself.
func appendDataRowBody(dst []byte, values [][]byte) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(values)))
	for _, v := range values {
		if v == nil {
			dst = binary.BigEndian.AppendUint32(dst, 0xffffffff)
			continue
		}
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(v)))
		dst = append(dst, v...)
	}
	return dst
}

// sameValues compares column values, telling NULL from empty.
func sameValues(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if (a[i] == nil) != (b[i] == nil) || !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func TestDecodeDataRow(t *testing.T) {
	for _, seed := range dataRowSeeds() {
		t.Run(seed.name, func(t *testing.T) {
			want := seed.msg.(*pgproto3.DataRow)
			body := bodyOf(t, want)

			// pgproto3 → ours, appended after what values held.
			old := []byte("kept")
			values, err := DecodeDataRow(body, [][]byte{old})
			if err != nil {
				t.Fatalf("DecodeDataRow: %v", err)
			}
			if !sameValues(values[1:], want.Values) || &values[0][0] != &old[0] {
				t.Fatalf("decoded %q, want [kept] + %q", values, want.Values)
			}

			// ours → pgproto3 (through the test encoder, which the fuzz
			// target relies on).
			again := appendDataRowBody(nil, values[1:])
			if !bytes.Equal(again, body) {
				t.Fatalf("re-encoded % x, want % x", again, body)
			}
			var got pgproto3.DataRow
			if err := got.Decode(again); err != nil || !sameValues(got.Values, want.Values) {
				t.Fatalf("pgproto3 decoded %q, %v", got.Values, err)
			}
		})
	}
}

func TestDecodeDataRowMalformed(t *testing.T) {
	valid := appendDataRowBody(nil, [][]byte{[]byte("ab"), nil})
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"empty", nil},
		{"half a count", []byte{0}},
		{"count without columns", []byte{0, 1}},
		{"truncated length", []byte{0, 1, 0, 0, 0}},
		{"value shorter than its length", []byte{0, 1, 0, 0, 0, 3, 'a', 'b'}},
		{"length -2", []byte{0, 1, 0xff, 0xff, 0xff, 0xfe}},
		{"length MinInt32", []byte{0, 1, 0x80, 0, 0, 0}},
		{"length over the body", []byte{0, 1, 0x7f, 0xff, 0xff, 0xff, 'a'}},
		{"count 0xffff (negative as int16)", []byte{0xff, 0xff, 0, 0, 0, 0}},
		{"fewer columns than counted", valid[:len(valid)-4]},
		{"trailing byte", append(valid[:len(valid):len(valid)], 0)},
		{"more columns than counted", append([]byte{0, 1}, appendDataRowBody(nil, [][]byte{[]byte("x"), []byte("y")})[2:]...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			given := make([][]byte, 1, 8)
			values, err := DecodeDataRow(tc.body, given)
			if !errors.Is(err, ErrMalformedMessage) {
				t.Fatalf("DecodeDataRow(% x) = %q, %v; want ErrMalformedMessage", tc.body, values, err)
			}
			if len(values) != 1 {
				t.Fatalf("on error values has %d elements, want the 1 given", len(values))
			}
		})
	}
}

func TestErrorFields(t *testing.T) {
	full := encode(t, &pgproto3.ErrorResponse{
		Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "57014",
		Message: "COPY from stdin failed: client gave up", Detail: "d", Routine: "r",
	})[HeaderLen:]
	for _, tc := range []struct {
		name          string
		body          []byte
		code, message string
		hasCode       bool
		hasMessage    bool
	}{
		{"full", full, "57014", "COPY from stdin failed: client gave up", true, true},
		{"message cut off", full[:bytes.Index(full, []byte("failed"))+6], "57014", "COPY from stdin failed", true, true},
		{"code cut off", full[:bytes.Index(full, []byte("570"))+3], "570", "", true, false},
		{"type byte alone at the end", full[:bytes.IndexByte(full, FieldMessage)+1], "57014", "", true, false},
		{"empty", nil, "", "", false, false},
		{"terminator only", []byte{0}, "", "", false, false},
		{"empty code", cat("C\x00M\x00\x00"), "", "", true, true},
		{"last wins", cat("C1\x00C2\x00\x00"), "2", "", true, false},
		{"after the terminator", cat("\x00C1\x00"), "", "", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, message := ErrorFields(tc.body)
			if string(code) != tc.code || string(message) != tc.message || (code != nil) != tc.hasCode || (message != nil) != tc.hasMessage {
				t.Fatalf("ErrorFields = %q (nil %v), %q (nil %v); want %q, %q", code, code == nil, message, message == nil, tc.code, tc.message)
			}
		})
	}
}

func TestNextFieldWalk(t *testing.T) {
	want := pgproto3.ErrorResponse{
		Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "28P01",
		Message: `password authentication failed for user "ü"`, Hint: strings.Repeat("h", 300),
	}
	body := encode(t, &want)[HeaderLen:]
	var got pgproto3.ErrorResponse
	n := 0
	for typ, value, rest, ok := NextField(body); ok; typ, value, rest, ok = NextField(rest) {
		n++
		switch typ {
		case FieldSeverity:
			got.Severity = string(value)
		case FieldSeverityNonLocalized:
			got.SeverityUnlocalized = string(value)
		case FieldCode:
			got.Code = string(value)
		case FieldMessage:
			got.Message = string(value)
		case 'H':
			got.Hint = string(value)
		default:
			t.Fatalf("field %q", typ)
		}
	}
	if n != 5 || got.Severity != want.Severity || got.SeverityUnlocalized != want.SeverityUnlocalized ||
		got.Code != want.Code || got.Message != want.Message || got.Hint != want.Hint {
		t.Fatalf("%d fields: %+v, want %+v", n, got, want)
	}
}

// TestDecodeAllocs checks that the decoders allocate nothing when the
// caller provides the values slice: they run on the statement path of every
// client.
func TestDecodeAllocs(t *testing.T) {
	parse := bodyOf(t, parseSeeds()[2].msg)
	bind := bodyOf(t, bindSeeds()[0].msg)
	target := bodyOf(t, targetSeeds()[0].msg)
	row := bodyOf(t, dataRowSeeds()[2].msg)
	errBody := encode(t, &pgproto3.ErrorResponse{Severity: "ERROR", Code: "57014", Message: "canceling statement"})[HeaderLen:]
	values := make([][]byte, 0, 8)
	buf := make([]byte, 0, 1024)
	allocs := testing.AllocsPerRun(100, func() {
		p, err := DecodeParse(parse)
		if err != nil {
			panic(err)
		}
		_, statement, rest, err := BindNames(bind)
		if err != nil {
			panic(err)
		}
		if _, _, err := DecodeTarget(target); err != nil {
			panic(err)
		}
		if _, err := DecodeDataRow(row, values[:0]); err != nil {
			panic(err)
		}
		code, _ := ErrorFields(errBody)
		if string(code) != "57014" {
			panic("code")
		}
		b := AppendParse(buf[:0], p.Name, p.Query, p.ParamTypes)
		b = AppendBindPrefix(b, len(bind), rest, nil, statement)
		b = AppendDescribe(b, TargetStatement, statement)
		b = AppendClose(b, TargetStatement, statement)
		b = AppendSync(b)
		_ = AppendFlush(b)
	})
	if allocs != 0 {
		t.Fatalf("decoders and encoders: %.1f allocs", allocs)
	}
}
