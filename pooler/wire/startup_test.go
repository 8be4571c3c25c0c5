package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/jackc/pgx/v5/pgproto3"
)

// withLength returns a startup packet: the length word, then body.
func withLength(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(4+len(body))), body...)
}

// startupBody builds a StartupMessage body with the parameters in the order
// given (pgproto3.StartupMessage keeps them in a map, so it cannot).
func startupBody(version uint32, kv ...string) []byte {
	b := binary.BigEndian.AppendUint32(nil, version)
	for _, s := range kv {
		b = append(b, s...)
		b = append(b, 0)
	}
	return append(b, 0)
}

func code(c uint32) []byte { return binary.BigEndian.AppendUint32(nil, c) }

// encodeFrontend encodes a startup-phase message with pgproto3.
func encodeFrontend(t testing.TB, msg interface {
	Encode([]byte) ([]byte, error)
}) []byte {
	t.Helper()
	b, err := msg.Encode(nil)
	if err != nil {
		t.Fatalf("encoding %T: %v", msg, err)
	}
	return b
}

func TestReadStartup(t *testing.T) {
	secret32 := bytes.Repeat([]byte{0xa5, 0x5a}, 16) // a 32-byte secret, as Postgres 18 sends
	maxParams := startupBody(ProtocolVersion30, "user", strings.Repeat("u", MaxStartupPacketLen-4-len("user")-3))

	valid := []struct {
		name   string
		packet []byte
		want   Startup
	}{
		{
			name:   "StartupMessage 3.0 params in order",
			packet: withLength(startupBody(ProtocolVersion30, "user", "alice", "database", "app", "application_name", "", "options", "-c search_path=x")),
			want: Startup{Kind: StartupMessage, ProtocolMajor: 3, ProtocolMinor: 0, Parameters: []Parameter{
				{"user", "alice"}, {"database", "app"}, {"application_name", ""}, {"options", "-c search_path=x"},
			}},
		},
		{
			name:   "StartupMessage 3.0 from pgproto3",
			packet: encodeFrontend(t, &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: map[string]string{"user": "bob"}}),
			want:   Startup{Kind: StartupMessage, ProtocolMajor: 3, Parameters: []Parameter{{"user", "bob"}}},
		},
		{
			name:   "StartupMessage 3.2 from pgproto3",
			packet: encodeFrontend(t, &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion32, Parameters: map[string]string{"user": "carol"}}),
			want:   Startup{Kind: StartupMessage, ProtocolMajor: 3, ProtocolMinor: 2, Parameters: []Parameter{{"user", "carol"}}},
		},
		{
			name:   "StartupMessage 3.2 with protocol options",
			packet: withLength(startupBody(3<<16|2, "user", "dave", "_pq_.something", "on")),
			want:   Startup{Kind: StartupMessage, ProtocolMajor: 3, ProtocolMinor: 2, Parameters: []Parameter{{"user", "dave"}, {"_pq_.something", "on"}}},
		},
		{
			name:   "StartupMessage with no parameters",
			packet: withLength(startupBody(ProtocolVersion30)),
			want:   Startup{Kind: StartupMessage, ProtocolMajor: 3},
		},
		{
			name:   "StartupMessage of an unknown version is parsed, not judged",
			packet: withLength(startupBody(2<<16, "user", "x")),
			want:   Startup{Kind: StartupMessage, ProtocolMajor: 2, Parameters: []Parameter{{"user", "x"}}},
		},
		{
			name:   "StartupMessage of the largest length Postgres accepts",
			packet: withLength(maxParams),
			want:   Startup{Kind: StartupMessage, ProtocolMajor: 3, Parameters: []Parameter{{"user", strings.Repeat("u", MaxStartupPacketLen-4-len("user")-3)}}},
		},
		{
			name:   "SSLRequest",
			packet: encodeFrontend(t, &pgproto3.SSLRequest{}),
			want:   Startup{Kind: SSLRequest},
		},
		{
			name:   "GSSENCRequest",
			packet: encodeFrontend(t, &pgproto3.GSSEncRequest{}),
			want:   Startup{Kind: GSSEncRequest},
		},
		{
			name:   "CancelRequest 3.0 4-byte secret",
			packet: encodeFrontend(t, &pgproto3.CancelRequest{ProcessID: 0xdeadbeef, SecretKey: []byte{1, 2, 3, 4}}),
			want:   Startup{Kind: CancelRequest, CancelProcessID: 0xdeadbeef, CancelSecret: []byte{1, 2, 3, 4}},
		},
		{
			name:   "CancelRequest 3.2 32-byte secret",
			packet: encodeFrontend(t, &pgproto3.CancelRequest{ProcessID: 42, SecretKey: secret32}),
			want:   Startup{Kind: CancelRequest, CancelProcessID: 42, CancelSecret: secret32},
		},
		{
			name:   "CancelRequest 3.2 256-byte secret",
			packet: encodeFrontend(t, &pgproto3.CancelRequest{ProcessID: 7, SecretKey: bytes.Repeat([]byte{9}, 256)}),
			want:   Startup{Kind: CancelRequest, CancelProcessID: 7, CancelSecret: bytes.Repeat([]byte{9}, 256)},
		},
	}
	for _, tc := range valid {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseStartup(tc.packet[4:])
			if err != nil {
				t.Fatalf("ParseStartup: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseStartup = %+v, want %+v", got, tc.want)
			}
			for _, r := range []struct {
				name string
				r    func() io.Reader
			}{
				{"whole", func() io.Reader { return bytes.NewReader(tc.packet) }},
				{"one byte at a time", func() io.Reader { return iotest.OneByteReader(bytes.NewReader(tc.packet)) }},
				{"data with EOF", func() io.Reader { return iotest.DataErrReader(bytes.NewReader(tc.packet)) }},
			} {
				for _, buf := range [][]byte{nil, make([]byte, 0, 16), make([]byte, 0, MaxStartupPacketLen)} {
					got, err := ReadStartup(r.r(), buf)
					if err != nil {
						t.Fatalf("ReadStartup(%s, cap %d): %v", r.name, cap(buf), err)
					}
					if !reflect.DeepEqual(got, tc.want) {
						t.Fatalf("ReadStartup(%s, cap %d) = %+v, want %+v", r.name, cap(buf), got, tc.want)
					}
				}
			}
		})
	}
}

func TestStartupParameter(t *testing.T) {
	s, err := ParseStartup(startupBody(ProtocolVersion30, "user", "alice", "database", "", "user", "second"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want string
		ok         bool
	}{
		{"user", "alice", true}, // the first of a repeated name, as sent
		{"database", "", true},  // present but empty
		{"application_name", "", false},
		{"User", "", false}, // names are case-sensitive
	} {
		got, ok := s.Parameter(tc.name)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Parameter(%q) = %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	var empty Startup
	if v, ok := empty.Parameter("user"); ok || v != "" {
		t.Errorf("zero Startup Parameter = %q, %v", v, ok)
	}
}

func TestReadStartupMalformed(t *testing.T) {
	lengthWord := func(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
	cancel := func(secretLen int) []byte {
		body := append(code(cancelRequestCode), 0, 0, 0, 1)
		return withLength(append(body, make([]byte, secretLen)...))
	}
	cases := []struct {
		name      string
		packet    []byte
		truncated bool // the error also wraps io.ErrUnexpectedEOF
	}{
		{name: "length 0", packet: lengthWord(0)},
		{name: "length 4", packet: append(lengthWord(4), code(ProtocolVersion30)...)},
		{name: "length 7", packet: append(lengthWord(7), 0, 3, 0)},
		{name: "length over the bound", packet: append(lengthWord(MaxStartupPacketLen+5), startupBody(ProtocolVersion30)...)},
		{name: "length 2^31", packet: append(lengthWord(1<<31), code(ProtocolVersion30)...)},
		{name: "length 2^32-1", packet: append(lengthWord(1<<32-1), code(ProtocolVersion30)...)},
		{name: "a TLS ClientHello (direct SSL to a plaintext port)", packet: []byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03}},
		{name: "truncated length word", packet: []byte{0, 0}, truncated: true},
		{name: "truncated before the body", packet: lengthWord(8), truncated: true},
		{name: "truncated body", packet: withLength(startupBody(ProtocolVersion30, "user", "alice"))[:12], truncated: true},
		{name: "truncated one byte short", packet: func() []byte { p := withLength(startupBody(ProtocolVersion30, "user", "a")); return p[:len(p)-1] }(), truncated: true},
		{name: "unterminated parameter list", packet: withLength(append(code(ProtocolVersion30), "user\x00alice\x00"...))},
		{name: "version only, no terminator", packet: withLength(code(ProtocolVersion30))},
		{name: "name without NUL", packet: withLength(append(code(ProtocolVersion30), "user"...))},
		{name: "missing value", packet: withLength(append(code(ProtocolVersion30), "user\x00"...))},
		{name: "value without NUL", packet: withLength(append(code(ProtocolVersion30), "user\x00alice"...))},
		{name: "extra bytes after the list", packet: withLength(append(startupBody(ProtocolVersion30, "user", "alice"), 'x'))},
		{name: "extra NUL after the list", packet: withLength(append(startupBody(ProtocolVersion30, "user", "alice"), 0))},
		{name: "SSLRequest with extra bytes", packet: withLength(append(code(sslRequestCode), 0, 0, 0, 0))},
		{name: "SSLRequest with one extra byte", packet: withLength(append(code(sslRequestCode), 'x'))},
		{name: "GSSENCRequest with extra bytes", packet: withLength(append(code(gssEncRequestCode), 1))},
		{name: "CancelRequest without process ID", packet: withLength(code(cancelRequestCode))},
		{name: "CancelRequest without secret", packet: cancel(0)},
		{name: "CancelRequest 3-byte secret", packet: cancel(3)},
		{name: "CancelRequest 257-byte secret", packet: cancel(257)},
		{name: "CancelRequest 2-byte process ID", packet: withLength(append(code(cancelRequestCode), 0, 1))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range []io.Reader{bytes.NewReader(tc.packet), iotest.OneByteReader(bytes.NewReader(tc.packet))} {
				got, err := ReadStartup(r, nil)
				if !errors.Is(err, ErrMalformedStartup) {
					t.Fatalf("ReadStartup = %+v, %v; want an error wrapping ErrMalformedStartup", got, err)
				}
				if errors.Is(err, io.ErrUnexpectedEOF) != tc.truncated {
					t.Fatalf("ReadStartup error %q: wraps io.ErrUnexpectedEOF = %v, want %v", err, !tc.truncated, tc.truncated)
				}
				if !reflect.DeepEqual(got, Startup{}) {
					t.Fatalf("ReadStartup returned %+v with its error", got)
				}
			}
			// ParseStartup sees the same bodies (the length word is only
			// ReadStartup's business).
			if len(tc.packet) >= 4 && !tc.truncated && int(binary.BigEndian.Uint32(tc.packet)) == len(tc.packet) {
				if _, err := ParseStartup(tc.packet[4:]); !errors.Is(err, ErrMalformedStartup) {
					t.Fatalf("ParseStartup: %v; want an error wrapping ErrMalformedStartup", err)
				}
			}
		})
	}
}

func TestParseStartupShortBody(t *testing.T) {
	for n := range 4 {
		if _, err := ParseStartup(make([]byte, n)); !errors.Is(err, ErrMalformedStartup) {
			t.Errorf("ParseStartup(%d bytes): %v; want ErrMalformedStartup", n, err)
		}
	}
}

func TestReadStartupEOF(t *testing.T) {
	// A connection closed before its first byte (a TCP health check) is
	// not a malformed packet.
	_, err := ReadStartup(bytes.NewReader(nil), nil)
	if err != io.EOF {
		t.Fatalf("ReadStartup(empty) = %v, want io.EOF", err)
	}
	// Errors from the stream itself pass through untouched.
	boom := errors.New("boom")
	_, err = ReadStartup(iotest.ErrReader(boom), nil)
	if err != boom {
		t.Fatalf("ReadStartup(ErrReader) = %v, want %v", err, boom)
	}
	p := withLength(startupBody(ProtocolVersion30, "user", "alice"))
	_, err = ReadStartup(io.MultiReader(bytes.NewReader(p[:10]), iotest.ErrReader(boom)), nil)
	if err != boom || errors.Is(err, ErrMalformedStartup) {
		t.Fatalf("ReadStartup(error mid-body) = %v, want %v", err, boom)
	}
}

// TestReadStartupBufferNotAliased checks that a Startup read into a reused
// buffer does not change when the buffer is reused.
func TestReadStartupBufferNotAliased(t *testing.T) {
	buf := make([]byte, 0, 1024)
	packets := [][]byte{
		withLength(startupBody(ProtocolVersion30, "user", "alice", "database", "app")),
		encodeFrontend(t, &pgproto3.CancelRequest{ProcessID: 5, SecretKey: []byte("0123456789abcdef")}),
	}
	for _, p := range packets {
		got, err := ReadStartup(bytes.NewReader(p), buf)
		if err != nil {
			t.Fatal(err)
		}
		want, err := ParseStartup(append([]byte(nil), p[4:]...))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf[:len(p)-4], p[4:]) {
			t.Fatalf("ReadStartup did not use the buffer it was given (cap %d)", cap(buf))
		}
		full := buf[:cap(buf)]
		for i := range full {
			full[i] = 0xff
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("after the buffer was overwritten: %+v, want %+v", got, want)
		}
		// The same for ParseStartup on its own.
		body := append([]byte(nil), p[4:]...)
		got, err = ParseStartup(body)
		if err != nil {
			t.Fatal(err)
		}
		for i := range body {
			body[i] = 0
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("ParseStartup result changed with its input: %+v, want %+v", got, want)
		}
	}
}

func TestStartupKindString(t *testing.T) {
	for k, want := range map[StartupKind]string{
		StartupMessage: "StartupMessage",
		SSLRequest:     "SSLRequest",
		GSSEncRequest:  "GSSENCRequest",
		CancelRequest:  "CancelRequest",
		0:              "StartupKind(0)",
		99:             "StartupKind(99)",
	} {
		if got := k.String(); got != want {
			t.Errorf("StartupKind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
}

func TestReadStartupAllocs(t *testing.T) {
	p := withLength(startupBody(ProtocolVersion30, "user", "alice"))
	buf := make([]byte, 0, 256)
	r := bytes.NewReader(p)
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(p)
		if _, err := ReadStartup(r, buf); err != nil {
			t.Fatal(err)
		}
	})
	// The parameter slice and the one string behind every name and value;
	// nothing for the packet itself when the buffer fits.
	if allocs > 2 {
		t.Fatalf("ReadStartup with a reused buffer: %.0f allocs, want at most 2", allocs)
	}
}

// psycopg2Startup is the StartupMessage a Django client sends.
func psycopg2Startup() []byte {
	return withLength(startupBody(ProtocolVersion30, "user", "app", "database", "app_production", "application_name", "django", "client_encoding", "UTF8", "DateStyle", "ISO"))
}

func BenchmarkParseStartup(b *testing.B) {
	body := psycopg2Startup()[4:]
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseStartup(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadStartup reads the same packet from a stream into a reused
// buffer, as a session with a pooled buffer would.
func BenchmarkReadStartup(b *testing.B) {
	p := psycopg2Startup()
	r := bytes.NewReader(p)
	buf := make([]byte, 0, 1024)
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(p)
		if _, err := ReadStartup(r, buf); err != nil {
			b.Fatal(err)
		}
	}
}
