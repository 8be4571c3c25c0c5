package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// paramTypes is the raw parameter type section for oids.
func paramTypes(oids ...uint32) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(oids)))
	for _, oid := range oids {
		b = binary.BigEndian.AppendUint32(b, oid)
	}
	return b
}

// cat concatenates byte strings, for hand-built malformed bodies.
func cat(parts ...string) []byte { return []byte(strings.Join(parts, "")) }

func TestDecodeParse(t *testing.T) {
	for _, seed := range parseSeeds() {
		t.Run(seed.name, func(t *testing.T) {
			want := seed.msg.(*pgproto3.Parse)
			body := bodyOf(t, want)

			// pgproto3 → ours.
			p, err := DecodeParse(body)
			if err != nil {
				t.Fatalf("DecodeParse: %v", err)
			}
			if string(p.Name) != want.Name || string(p.Query) != want.Query {
				t.Fatalf("decoded name %q query %q, want %q %q", p.Name, p.Query, want.Name, want.Query)
			}
			if !bytes.Equal(p.ParamTypes, paramTypes(want.ParameterOIDs...)) {
				t.Fatalf("ParamTypes % x, want % x", p.ParamTypes, paramTypes(want.ParameterOIDs...))
			}
			if p.ParamCount() != len(want.ParameterOIDs) {
				t.Fatalf("ParamCount %d, want %d", p.ParamCount(), len(want.ParameterOIDs))
			}
			for i, oid := range want.ParameterOIDs {
				if p.ParamOID(i) != oid {
					t.Fatalf("ParamOID(%d) = %d, want %d", i, p.ParamOID(i), oid)
				}
			}

			// ours → pgproto3, renamed as the pooler will rename it.
			b := appended(t, AppendParse([]byte(prefix), []byte("pgtender_1"), p.Query, p.ParamTypes))
			got, ok := receiveFrontend(t, b).(*pgproto3.Parse)
			if !ok {
				t.Fatalf("decoded as %T", got)
			}
			if got.Name != "pgtender_1" || got.Query != want.Query || !slices.Equal(got.ParameterOIDs, want.ParameterOIDs) {
				t.Fatalf("pgproto3 decoded %+v, want %+v renamed", got, want)
			}

			// Same name: byte for byte what pgproto3 wrote.
			if again := AppendParse(nil, p.Name, p.Query, p.ParamTypes); !bytes.Equal(again, encode(t, want)) {
				t.Fatalf("re-encoded % x\nwant % x", again, encode(t, want))
			}
		})
	}
}

func TestAppendParseNilParamTypes(t *testing.T) {
	b := AppendParse(nil, nil, []byte("SHOW search_path"), nil)
	if want := encode(t, &pgproto3.Parse{Query: "SHOW search_path"}); !bytes.Equal(b, want) {
		t.Fatalf("% x, pgproto3 encodes % x", b, want)
	}
}

// TestDecodeParseAliases checks that the decoded slices are views of the
// body, and that appending to Name or Query cannot overwrite what follows.
func TestDecodeParseAliases(t *testing.T) {
	body := bodyOf(t, &pgproto3.Parse{Name: "S_1", Query: "select $1", ParameterOIDs: []uint32{oidText}})
	p, err := DecodeParse(body)
	if err != nil {
		t.Fatal(err)
	}
	if &p.Name[0] != &body[0] || &p.ParamTypes[len(p.ParamTypes)-1] != &body[len(body)-1] {
		t.Fatal("decoded slices do not alias the body")
	}
	before := slices.Clone(body)
	_ = append(p.Name, 'x')
	_ = append(p.Query, 'x')
	if !bytes.Equal(body, before) {
		t.Fatal("appending to a decoded name overwrote the body")
	}
}

func TestDecodeParseMalformed(t *testing.T) {
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"empty", nil},
		{"name not terminated", cat("S_1")},
		{"query not terminated", cat("S_1\x00select 1")},
		{"no count", cat("S_1\x00select 1\x00")},
		{"half a count", cat("S_1\x00select 1\x00\x00")},
		{"count without OIDs", cat("S_1\x00select 1\x00\x00\x01")},
		{"truncated OID", cat("S_1\x00select 1\x00\x00\x01\x00\x00\x00")},
		{"fewer OIDs than counted", append(cat("S_1\x00q\x00"), paramTypes(1, 2, 3)[:2+4*2]...)},
		{"count 0xffff (negative as int16)", cat("S_1\x00q\x00\xff\xff\x00\x00\x00\x19")},
		{"trailing byte after OIDs", append(cat("S_1\x00q\x00"), append(paramTypes(oidInt4), 0)...)},
		{"trailing bytes after zero count", cat("\x00q\x00\x00\x00junk")},
		{"more OIDs than counted", append(cat("\x00q\x00"), append(paramTypes(oidInt4), 0, 0, 0, 25)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := DecodeParse(tc.body)
			if !errors.Is(err, ErrMalformedMessage) {
				t.Fatalf("DecodeParse(% x) = %+v, %v; want ErrMalformedMessage", tc.body, p, err)
			}
		})
	}
}

func TestBindNames(t *testing.T) {
	for _, seed := range bindSeeds() {
		t.Run(seed.name, func(t *testing.T) {
			want := seed.msg.(*pgproto3.Bind)
			body := bodyOf(t, want)
			portal, statement, rest, err := BindNames(body)
			if err != nil {
				t.Fatalf("BindNames: %v", err)
			}
			if string(portal) != want.DestinationPortal || string(statement) != want.PreparedStatement {
				t.Fatalf("names %q %q, want %q %q", portal, statement, want.DestinationPortal, want.PreparedStatement)
			}
			if wantRest := len(want.DestinationPortal) + len(want.PreparedStatement) + 2; rest != wantRest {
				t.Fatalf("rest %d, want %d", rest, wantRest)
			}

			// Every prefix that holds both NULs gives the same answer; every
			// shorter one asks for more.
			for k := 0; k <= len(body); k++ {
				p, s, r, err := BindNames(body[:k])
				if k < rest {
					if !errors.Is(err, ErrIncomplete) {
						t.Fatalf("prefix of %d (names end at %d): %q %q %d %v; want ErrIncomplete", k, rest, p, s, r, err)
					}
					continue
				}
				if err != nil || !bytes.Equal(p, portal) || !bytes.Equal(s, statement) || r != rest {
					t.Fatalf("prefix of %d: %q %q %d %v", k, p, s, r, err)
				}
			}

			// Renamed: a header and the new names from AppendBindPrefix, then
			// the old remainder, make the same Bind with the new names, for
			// names shorter, longer and empty.
			for _, names := range [][2]string{{"", "pgtender_1"}, {"P", "s"}, {"", ""}, {"portal_" + strings.Repeat("p", 60), strings.Repeat("S", 63)}} {
				b := AppendBindPrefix([]byte(prefix), len(body), rest, []byte(names[0]), []byte(names[1]))
				b = appended(t, append(b, body[rest:]...))
				got, ok := receiveFrontend(t, b).(*pgproto3.Bind)
				if !ok {
					t.Fatalf("decoded as %T", got)
				}
				renamed := *want
				renamed.DestinationPortal, renamed.PreparedStatement = names[0], names[1]
				if !reflect.DeepEqual(normalizeBind(got), normalizeBind(&renamed)) {
					t.Fatalf("renamed to %q: pgproto3 decoded %+v, want %+v", names, got, &renamed)
				}
			}

			// Not renamed: the prefix plus the remainder is the message.
			b := append(AppendBindPrefix(nil, len(body), rest, portal, statement), body[rest:]...)
			if !bytes.Equal(b, encode(t, want)) {
				t.Fatalf("re-encoded % x\nwant % x", b, encode(t, want))
			}
		})
	}
}

// normalizeBind makes empty and nil lists compare equal: pgproto3 decodes an
// absent list as nil or empty depending on the list.
func normalizeBind(b *pgproto3.Bind) pgproto3.Bind {
	n := *b
	if len(n.ParameterFormatCodes) == 0 {
		n.ParameterFormatCodes = nil
	}
	if len(n.Parameters) == 0 {
		n.Parameters = nil
	}
	if len(n.ResultFormatCodes) == 0 {
		n.ResultFormatCodes = nil
	}
	return n
}

func TestBindNamesMalformed(t *testing.T) {
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"empty", nil},
		{"portal not terminated", cat("C_1")},
		{"statement missing", cat("\x00")},
		{"statement not terminated", cat("\x00S_1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, s, r, err := BindNames(tc.body)
			if !errors.Is(err, ErrIncomplete) {
				t.Fatalf("BindNames(% x) = %q %q %d %v; want ErrIncomplete", tc.body, p, s, r, err)
			}
		})
	}
}

func TestAppendBindPrefixBadRest(t *testing.T) {
	for _, tc := range []struct{ bodyLen, rest int }{{10, 1}, {10, 11}, {0, 0}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("AppendBindPrefix(bodyLen %d, rest %d) did not panic", tc.bodyLen, tc.rest)
				}
			}()
			AppendBindPrefix(nil, tc.bodyLen, tc.rest, nil, nil)
		}()
	}
}

func TestDecodeTarget(t *testing.T) {
	for _, seed := range targetSeeds() {
		t.Run(seed.name, func(t *testing.T) {
			var wantKind byte
			var wantName string
			var typ byte
			switch m := seed.msg.(type) {
			case *pgproto3.Describe:
				wantKind, wantName, typ = m.ObjectType, m.Name, MsgDescribe
			case *pgproto3.Close:
				wantKind, wantName, typ = m.ObjectType, m.Name, MsgClose
			}
			whole := encode(t, seed.msg)
			kind, name, err := DecodeTarget(whole[HeaderLen:])
			if err != nil || kind != wantKind || string(name) != wantName {
				t.Fatalf("DecodeTarget = %q %q %v, want %q %q", kind, name, err, wantKind, wantName)
			}
			again := AppendDescribe
			if typ == MsgClose {
				again = AppendClose
			}
			if b := again(nil, kind, name); !bytes.Equal(b, whole) {
				t.Fatalf("re-encoded % x\nwant % x", b, whole)
			}
		})
	}
}

func TestAppendDescribeClose(t *testing.T) {
	for _, kind := range []byte{TargetStatement, TargetPortal} {
		for _, name := range []string{"", "pgtender_7", strings.Repeat("n", 200)} {
			b := appended(t, AppendDescribe([]byte(prefix), kind, []byte(name)))
			if d, ok := receiveFrontend(t, b).(*pgproto3.Describe); !ok || d.ObjectType != kind || d.Name != name {
				t.Fatalf("Describe %q %q: pgproto3 decoded %#v", kind, name, d)
			}
			b = appended(t, AppendClose([]byte(prefix), kind, []byte(name)))
			if c, ok := receiveFrontend(t, b).(*pgproto3.Close); !ok || c.ObjectType != kind || c.Name != name {
				t.Fatalf("Close %q %q: pgproto3 decoded %#v", kind, name, c)
			}
		}
	}
	for _, f := range []func([]byte, byte, []byte) []byte{AppendDescribe, AppendClose} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("target kind 'X' did not panic")
				}
			}()
			f(nil, 'X', nil)
		}()
	}
}

func TestDecodeTargetMalformed(t *testing.T) {
	for _, tc := range []struct {
		name string
		body []byte
	}{
		{"empty", nil},
		{"kind only", cat("S")},
		{"name not terminated", cat("SS_1")},
		{"unknown kind", cat("X\x00")},
		{"lowercase kind", cat("s_pg3_0\x00")},
		{"NUL kind", cat("\x00\x00")},
		{"trailing byte", cat("SS_1\x00\x00")},
		{"trailing name", cat("P\x00C_1\x00")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kind, name, err := DecodeTarget(tc.body)
			if !errors.Is(err, ErrMalformedMessage) {
				t.Fatalf("DecodeTarget(% x) = %q %q %v; want ErrMalformedMessage", tc.body, kind, name, err)
			}
		})
	}
}

func TestAppendSyncFlush(t *testing.T) {
	b := appended(t, AppendSync([]byte(prefix)))
	if m, ok := receiveFrontend(t, b).(*pgproto3.Sync); !ok {
		t.Fatalf("decoded as %T", m)
	}
	if want := encode(t, &pgproto3.Sync{}); !bytes.Equal(b, want) {
		t.Fatalf("% x, pgproto3 encodes % x", b, want)
	}
	b = appended(t, AppendFlush([]byte(prefix)))
	if m, ok := receiveFrontend(t, b).(*pgproto3.Flush); !ok {
		t.Fatalf("decoded as %T", m)
	}
	if want := encode(t, &pgproto3.Flush{}); !bytes.Equal(b, want) {
		t.Fatalf("% x, pgproto3 encodes % x", b, want)
	}
}

// TestReprepareSequence writes what the pooler sends a server connection
// that lacks a client's statement (Parse under the pool-wide name, the
// client's Bind renamed, Describe, Execute, Sync) and reads it back.
func TestReprepareSequence(t *testing.T) {
	client := bodyOf(t, &pgproto3.Bind{PreparedStatement: "_pg3_0", Parameters: [][]byte{[]byte("7")}})
	_, _, rest, err := BindNames(client)
	if err != nil {
		t.Fatal(err)
	}
	var b []byte
	b = AppendParse(b, []byte("pgtender_3"), []byte("select $1"), paramTypes(oidInt8))
	b = AppendBindPrefix(b, len(client), rest, nil, []byte("pgtender_3"))
	b = append(b, client[rest:]...)
	b = AppendDescribe(b, TargetPortal, nil)
	b = append(b, encode(t, &pgproto3.Execute{})...)
	b = AppendSync(b)
	want := encode(t,
		&pgproto3.Parse{Name: "pgtender_3", Query: "select $1", ParameterOIDs: []uint32{oidInt8}},
		&pgproto3.Bind{PreparedStatement: "pgtender_3", Parameters: [][]byte{[]byte("7")}},
		&pgproto3.Describe{ObjectType: TargetPortal},
		&pgproto3.Execute{},
		&pgproto3.Sync{},
	)
	if !bytes.Equal(b, want) {
		t.Fatalf("% x\nwant % x", b, want)
	}
}
