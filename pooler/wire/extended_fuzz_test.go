package wire

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Fuzz targets for the extended-protocol decoders. Each is seeded with the
// driver shapes of seeds_test.go (f.Add, and the seed-* files under
// testdata/fuzz/<FuzzName>/ that TestSeedCorpus keeps in step with them),
// checks that decoding never panics, and that whatever decodes re-encodes
// to the same bytes and agrees with pgproto3.

var updateSeeds = flag.Bool("update-seeds", false, "rewrite the seed-* files under testdata/fuzz/ from seeds_test.go")

// truncations are body and some of its prefixes, to seed the malformed side.
func truncations(body []byte) [][]byte {
	out := [][]byte{body}
	for _, k := range []int{len(body) - 1, len(body) / 2, 1} {
		if k > 0 && k < len(body) {
			out = append(out, body[:k])
		}
	}
	return out
}

func FuzzDecodeParse(f *testing.F) {
	for _, seed := range parseSeeds() {
		for _, b := range truncations(bodyOf(f, seed.msg)) {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var ref pgproto3.Parse
		refErr := ref.Decode(data)
		p, err := DecodeParse(data)
		if err != nil {
			if !errors.Is(err, ErrMalformedMessage) {
				t.Fatalf("error does not wrap ErrMalformedMessage: %v", err)
			}
			// pgproto3 ignores trailing bytes; what it accepts and encodes
			// back to data, we accept.
			if refErr == nil && bytes.Equal(encode(t, &ref)[HeaderLen:], data) {
				t.Fatalf("refused % x, which pgproto3 decodes as %+v: %v", data, ref, err)
			}
			return
		}
		again := AppendParse(nil, p.Name, p.Query, p.ParamTypes)
		if !bytes.Equal(again[HeaderLen:], data) || int(getUint32(again[1:])) != len(data)+4 {
			t.Fatalf("%+v re-encodes as % x, decoded from % x", p, again, data)
		}
		if refErr != nil {
			t.Fatalf("accepted % x, which pgproto3 refuses: %v", data, refErr)
		}
		if string(p.Name) != ref.Name || string(p.Query) != ref.Query || p.ParamCount() != len(ref.ParameterOIDs) {
			t.Fatalf("decoded %q %q %d types; pgproto3 %+v", p.Name, p.Query, p.ParamCount(), ref)
		}
		for i, oid := range ref.ParameterOIDs {
			if p.ParamOID(i) != oid {
				t.Fatalf("ParamOID(%d) = %d, pgproto3 %d", i, p.ParamOID(i), oid)
			}
		}
	})
}

func FuzzBindNames(f *testing.F) {
	for _, seed := range bindSeeds() {
		for _, b := range truncations(bodyOf(f, seed.msg)) {
			f.Add(b, uint16(len(b)))
			f.Add(b, uint16(3))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		portal, statement, rest, err := BindNames(data)
		if err != nil {
			if !errors.Is(err, ErrIncomplete) {
				t.Fatalf("error does not wrap ErrIncomplete: %v", err)
			}
			if bytes.Count(data, []byte{0}) >= 2 {
				t.Fatalf("ErrIncomplete with two NULs in % x", data)
			}
			return
		}
		if rest != len(portal)+len(statement)+2 || bytes.IndexByte(portal, 0) >= 0 || bytes.IndexByte(statement, 0) >= 0 {
			t.Fatalf("names %q %q, rest %d in % x", portal, statement, rest, data)
		}

		// A prefix answers the same once it holds the names.
		k := int(cut) % (len(data) + 1)
		p2, s2, r2, err := BindNames(data[:k])
		if k < rest {
			if !errors.Is(err, ErrIncomplete) {
				t.Fatalf("prefix of %d, names end at %d: %q %q %d %v", k, rest, p2, s2, r2, err)
			}
		} else if err != nil || !bytes.Equal(p2, portal) || !bytes.Equal(s2, statement) || r2 != rest {
			t.Fatalf("prefix of %d: %q %q %d %v", k, p2, s2, r2, err)
		}

		// Unchanged names give the message back; new ones a message of the
		// right length with the same remainder.
		whole := append([]byte{MsgBind, 0, 0, 0, 0}, data...)
		putUint32(whole[1:], uint32(len(data)+4))
		if again := append(AppendBindPrefix(nil, len(data), rest, portal, statement), data[rest:]...); !bytes.Equal(again, whole) {
			t.Fatalf("re-encoded % x, want % x", again, whole)
		}
		renamed := append(AppendBindPrefix(nil, len(data), rest, []byte("p"), []byte("pgtender_12")), data[rest:]...)
		if int(getUint32(renamed[1:])) != len(renamed)-1 || !bytes.HasSuffix(renamed, data[rest:]) {
			t.Fatalf("renamed % x from % x", renamed, data)
		}

		// Where pgproto3 can decode the whole Bind, it agrees on the names
		// and on everything after them once renamed.
		var ref pgproto3.Bind
		if ref.Decode(data) == nil {
			if ref.DestinationPortal != string(portal) || ref.PreparedStatement != string(statement) {
				t.Fatalf("names %q %q, pgproto3 %q %q", portal, statement, ref.DestinationPortal, ref.PreparedStatement)
			}
			var got pgproto3.Bind
			if err := got.Decode(renamed[HeaderLen:]); err != nil {
				t.Fatalf("pgproto3 refuses the renamed Bind: %v", err)
			}
			ref.DestinationPortal, ref.PreparedStatement = "p", "pgtender_12"
			if !reflect.DeepEqual(normalizeBind(&got), normalizeBind(&ref)) {
				t.Fatalf("renamed decodes as %+v, want %+v", got, ref)
			}
		}
	})
}

func FuzzDecodeTarget(f *testing.F) {
	for _, seed := range targetSeeds() {
		for _, b := range truncations(bodyOf(f, seed.msg)) {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var ref pgproto3.Describe
		refErr := ref.Decode(data)
		kind, name, err := DecodeTarget(data)
		if err != nil {
			if !errors.Is(err, ErrMalformedMessage) {
				t.Fatalf("error does not wrap ErrMalformedMessage: %v", err)
			}
			// pgproto3 does not check the kind; with a valid one, what it
			// accepts we accept.
			if refErr == nil && (ref.ObjectType == TargetStatement || ref.ObjectType == TargetPortal) {
				t.Fatalf("refused % x, which pgproto3 decodes as %+v: %v", data, ref, err)
			}
			return
		}
		if refErr != nil || ref.ObjectType != kind || ref.Name != string(name) {
			t.Fatalf("decoded %q %q; pgproto3 %+v, %v", kind, name, ref, refErr)
		}
		for _, again := range [][]byte{AppendDescribe(nil, kind, name), AppendClose(nil, kind, name)} {
			if !bytes.Equal(again[HeaderLen:], data) || int(getUint32(again[1:])) != len(data)+4 {
				t.Fatalf("%q %q re-encodes as % x, decoded from % x", kind, name, again, data)
			}
		}
	})
}

func FuzzDecodeDataRow(f *testing.F) {
	for _, seed := range dataRowSeeds() {
		for _, b := range truncations(bodyOf(f, seed.msg)) {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var ref pgproto3.DataRow
		refErr := ref.Decode(data)
		values, err := DecodeDataRow(data, nil)
		if err != nil {
			if !errors.Is(err, ErrMalformedMessage) {
				t.Fatalf("error does not wrap ErrMalformedMessage: %v", err)
			}
			if values != nil {
				t.Fatalf("error with values %q", values)
			}
			if refErr == nil && bytes.Equal(appendDataRowBody(nil, ref.Values), data) {
				t.Fatalf("refused % x, which pgproto3 decodes as %q: %v", data, ref.Values, err)
			}
			return
		}
		if again := appendDataRowBody(nil, values); !bytes.Equal(again, data) {
			t.Fatalf("%q re-encodes as % x, decoded from % x", values, again, data)
		}
		if refErr != nil || !sameValues(values, ref.Values) {
			t.Fatalf("decoded %q; pgproto3 %q, %v", values, ref.Values, refErr)
		}
	})
}

func FuzzErrorFields(f *testing.F) {
	for _, msg := range []encoder{
		&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "57014", Message: "COPY from stdin failed: gone", Routine: "DoCopy"},
		&pgproto3.ErrorResponse{Severity: "FATAL", Code: "28P01", Message: "password authentication failed", Line: 12},
		&pgproto3.NoticeResponse{Severity: "WARNING", Code: "01000", Message: "there is no transaction in progress"},
	} {
		for _, b := range truncations(encode(f, msg)[HeaderLen:]) {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		code, message := ErrorFields(data)
		for _, v := range [][]byte{code, message} {
			if bytes.IndexByte(v, 0) >= 0 {
				t.Fatalf("value %q holds a NUL", v)
			}
		}
		var ref pgproto3.ErrorResponse
		if ref.Decode(data) == nil && (ref.Code != string(code) || ref.Message != string(message)) {
			t.Fatalf("code %q message %q; pgproto3 %q %q", code, message, ref.Code, ref.Message)
		}
	})
}

// seedCorpus is what the seed-* files under testdata/fuzz/ hold: one file
// per driver shape and fuzz target, in the go test fuzz v1 format.
func seedCorpus(t testing.TB) map[string]string {
	files := map[string]string{}
	add := func(target, name string, args ...any) {
		var b strings.Builder
		b.WriteString("go test fuzz v1\n")
		for _, arg := range args {
			switch a := arg.(type) {
			case []byte:
				fmt.Fprintf(&b, "[]byte(%q)\n", a)
			case uint16:
				fmt.Fprintf(&b, "uint16(%d)\n", a)
			}
		}
		files[filepath.Join(target, "seed-"+name)] = b.String()
	}
	for _, s := range parseSeeds() {
		add("FuzzDecodeParse", s.name, bodyOf(t, s.msg))
	}
	for _, s := range bindSeeds() {
		body := bodyOf(t, s.msg)
		// The cut lands inside the statement name: the pooler's view of a
		// Bind whose names straddle two reads.
		_, _, rest, err := BindNames(body)
		if err != nil {
			t.Fatal(err)
		}
		add("FuzzBindNames", s.name, body, uint16(rest-1))
	}
	for _, s := range targetSeeds() {
		add("FuzzDecodeTarget", s.name, bodyOf(t, s.msg))
	}
	for _, s := range dataRowSeeds() {
		add("FuzzDecodeDataRow", s.name, bodyOf(t, s.msg))
	}
	return files
}

// TestSeedCorpus checks that the seed-* corpus files are what seeds_test.go
// builds; go test -run TestSeedCorpus -update-seeds rewrites them.
func TestSeedCorpus(t *testing.T) {
	want := seedCorpus(t)
	dir := filepath.Join("testdata", "fuzz")
	have, err := filepath.Glob(filepath.Join(dir, "Fuzz*", "seed-*"))
	if err != nil {
		t.Fatal(err)
	}
	if *updateSeeds {
		for _, path := range have {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}
		for name, content := range want {
			path := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	var got []string
	for _, path := range have {
		name, _ := filepath.Rel(dir, path)
		got = append(got, name)
		content, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if w, ok := want[name]; !ok {
			t.Errorf("%s is not built by seeds_test.go (run with -update-seeds)", path)
		} else if string(content) != w {
			t.Errorf("%s differs from what seeds_test.go builds (run with -update-seeds)", path)
		}
	}
	for name := range want {
		if !slices.Contains(got, name) {
			t.Errorf("%s missing (run with -update-seeds)", filepath.Join(dir, name))
		}
	}
}
