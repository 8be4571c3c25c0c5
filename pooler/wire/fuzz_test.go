package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"testing"
	"testing/iotest"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Seeds are real messages built with pgproto3; testdata/fuzz/<FuzzName>/
// holds inputs the fuzzer found interesting on top of these.

func startupSeeds(t testing.TB) [][]byte {
	return [][]byte{
		encodeFrontend(t, &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: map[string]string{"user": "alice"}}),
		encodeFrontend(t, &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion32, Parameters: map[string]string{"user": "bob", "database": "app"}}),
		withLength(startupBody(ProtocolVersion30, "user", "u", "database", "d", "application_name", "psql", "client_encoding", "UTF8", "_pq_.x", "1")),
		encodeFrontend(t, &pgproto3.SSLRequest{}),
		encodeFrontend(t, &pgproto3.GSSEncRequest{}),
		encodeFrontend(t, &pgproto3.CancelRequest{ProcessID: 1234, SecretKey: []byte{1, 2, 3, 4}}),
		encodeFrontend(t, &pgproto3.CancelRequest{ProcessID: 1234, SecretKey: bytes.Repeat([]byte{0x55}, 32)}),
		withLength(append(code(ProtocolVersion30), "user\x00"...)),
		{0, 0, 0, 8},
	}
}

// encodeStartupBody is the inverse of ParseStartup.
func encodeStartupBody(s Startup) []byte {
	switch s.Kind {
	case SSLRequest:
		return code(sslRequestCode)
	case GSSEncRequest:
		return code(gssEncRequestCode)
	case CancelRequest:
		b := binary.BigEndian.AppendUint32(code(cancelRequestCode), s.CancelProcessID)
		return append(b, s.CancelSecret...)
	}
	b := code(uint32(s.ProtocolMajor)<<16 | uint32(s.ProtocolMinor))
	for _, p := range s.Parameters {
		b = append(b, p.Name...)
		b = append(b, 0)
		b = append(b, p.Value...)
		b = append(b, 0)
	}
	return append(b, 0)
}

func FuzzStartupPacket(f *testing.F) {
	for _, seed := range startupSeeds(f) {
		f.Add(seed)
		f.Add(seed[4:])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// data as a body.
		s, err := ParseStartup(data)
		if err != nil {
			if !errors.Is(err, ErrMalformedStartup) {
				t.Fatalf("ParseStartup error does not wrap ErrMalformedStartup: %v", err)
			}
		} else {
			// Every startup packet has one encoding: re-encoding the parse
			// gives the input back.
			if again := encodeStartupBody(s); !bytes.Equal(again, data) {
				t.Fatalf("%+v re-encodes as % x, parsed from % x", s, again, data)
			}
			if s.Kind == StartupMessage {
				for _, p := range s.Parameters {
					if p.Name == "" {
						t.Fatalf("empty parameter name in %+v", s)
					}
					// Parameter answers with the first of a repeated name.
					want := s.Parameters[firstIndex(s, p.Name)].Value
					if v, ok := s.Parameter(p.Name); !ok || v != want {
						t.Fatalf("Parameter(%q) = %q, %v; want %q", p.Name, v, ok, want)
					}
				}
			}
		}

		// data as a stream.
		for _, r := range []io.Reader{bytes.NewReader(data), iotest.OneByteReader(bytes.NewReader(data))} {
			buf := make([]byte, 0, 32)
			got, err := ReadStartup(r, buf)
			if len(data) < 4 || getUint32(data) < 8 || getUint32(data)-4 > MaxStartupPacketLen || int(getUint32(data)) > len(data) {
				if err == nil {
					t.Fatalf("ReadStartup accepted % x", data)
				}
			}
			if err != nil {
				if !errors.Is(err, ErrMalformedStartup) && !(len(data) == 0 && err == io.EOF) {
					t.Fatalf("ReadStartup error %v", err)
				}
				continue
			}
			n := int(getUint32(data))
			want, err := ParseStartup(data[4:n])
			if err != nil {
				t.Fatalf("ReadStartup accepted what ParseStartup refuses: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("ReadStartup = %+v, ParseStartup = %+v", got, want)
			}
			// The result does not share memory with the buffer.
			for i := range buf[:cap(buf)] {
				buf[:cap(buf)][i] = 0xff
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("result changed with the buffer: %+v, want %+v", got, want)
			}
		}
	})
}

func firstIndex(s Startup, name string) int {
	for i, p := range s.Parameters {
		if p.Name == name {
			return i
		}
	}
	return -1
}

// fuzzInspect asks for a few body bytes of several types, one of them more
// than the Scanner keeps.
func fuzzInspect(typ byte) int {
	switch typ {
	case MsgReadyForQuery:
		return 1
	case MsgCommandComplete:
		return 3
	case MsgDataRow:
		return maxInspectLen + 10
	}
	return 0
}

// referenceScan is what a Scanner must report for data: every message whose
// header and inspected bytes are in data, up to the first invalid length.
func referenceScan(data []byte, inspect func(byte) int) (msgs []seen, bad bool) {
	for off := 0; off+HeaderLen <= len(data); {
		n := getUint32(data[off+1:])
		if n < 4 || n > MaxMessageLen {
			return msgs, true
		}
		length := int(n) - 4
		k := max(0, min(inspect(data[off]), length, maxInspectLen))
		if off+HeaderLen+k > len(data) {
			break
		}
		msgs = append(msgs, seen{typ: data[off], length: length, start: off, reported: off + HeaderLen + k, body: string(data[off+HeaderLen : off+HeaderLen+k])})
		off += HeaderLen + length
	}
	return msgs, false
}

// scanPieces scans the chunks in order and returns what was reported, in
// absolute offsets, and whether the Scanner gave up on a bad length.
func scanPieces(t *testing.T, inspect func(byte) int, chunks ...[]byte) (msgs []seen, bad bool) {
	s := Scanner{Inspect: inspect}
	base := 0
	for _, chunk := range chunks {
		for off := 0; ; {
			var msg Message
			var ok bool
			var err error
			off, msg, ok, err = s.Next(chunk, off)
			if err != nil {
				if !errors.Is(err, ErrBadMessageLength) {
					t.Fatalf("error %v does not wrap ErrBadMessageLength", err)
				}
				return msgs, true
			}
			if !ok {
				break
			}
			msgs = append(msgs, seen{typ: msg.Type, length: msg.Length, start: base + msg.Start, reported: base + off, body: string(msg.Body)})
		}
		base += len(chunk)
	}
	return msgs, false
}

func FuzzScanner(f *testing.F) {
	for _, seed := range [][]byte{
		simpleQueryStream(f), extendedQueryStream(f), copyInStream(f), backendStream(f), pgbenchSelectResponse(f),
		{MsgQuery, 0, 0, 0, 3},
		{MsgReadyForQuery, 0, 0, 0, 5},
	} {
		f.Add(seed, uint16(len(seed)/2))
		f.Add(seed, uint16(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		cut := int(split) % (len(data) + 1)
		want, wantBad := referenceScan(data, fuzzInspect)

		one, oneBad := scanPieces(t, fuzzInspect, data)
		two, twoBad := scanPieces(t, fuzzInspect, data[:cut], data[cut:])
		for _, r := range []struct {
			name string
			msgs []seen
			bad  bool
		}{{"one chunk", one, oneBad}, {"two chunks", two, twoBad}} {
			if r.bad != wantBad || !reflect.DeepEqual(r.msgs, want) {
				t.Fatalf("%s (cut at %d): %v (bad length %v), want %v (%v)", r.name, cut, r.msgs, r.bad, want, wantBad)
			}
		}

		// The relay's way: a partial header at the end of the first chunk
		// is scanned again at the front of the second.
		s := Scanner{Inspect: fuzzInspect}
		var relayed []seen
		first := data[:cut]
		off := 0
		var err error
		for off < len(first) {
			var msg Message
			var ok bool
			off, msg, ok, err = s.Next(first, off)
			if err != nil || !ok {
				break
			}
			relayed = append(relayed, seen{typ: msg.Type, length: msg.Length, start: msg.Start, reported: off, body: string(msg.Body)})
		}
		if err != nil {
			return
		}
		carried := s.UnreportedLen()
		s.DropUnreported()
		second := data[cut-carried:]
		base := cut - carried
		for off := 0; off < len(second); {
			var msg Message
			var ok bool
			off, msg, ok, err = s.Next(second, off)
			if err != nil || !ok {
				break
			}
			relayed = append(relayed, seen{typ: msg.Type, length: msg.Length, start: base + msg.Start, reported: base + off, body: string(msg.Body)})
		}
		if err == nil && !reflect.DeepEqual(relayed, want) {
			t.Fatalf("relay-style (cut at %d, %d carried): %v, want %v", cut, carried, relayed, want)
		}
	})
}

func FuzzReader(f *testing.F) {
	for _, seed := range [][]byte{
		backendStream(f), extendedQueryStream(f), copyInStream(f),
		encode(f, &pgproto3.PasswordMessage{Password: "secret"}),
		encode(f, &pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: []byte("n,,n=,r=abc")}),
		{MsgQuery, 0, 0, 0, 2},
		{MsgQuery, 0, 0, 0, 9, 'x'},
	} {
		f.Add(seed, uint16(0), uint16(1024))
		f.Add(seed, uint16(7), uint16(16))
	}
	f.Fuzz(func(t *testing.T, data []byte, bufSize, maxLen uint16) {
		type result struct {
			msgs []string // type byte + body
			err  error
		}
		read := func(r io.Reader) result {
			rd := NewReader(r, make([]byte, int(bufSize)%2048), int(maxLen))
			var res result
			for {
				typ, body, err := rd.ReadMessage()
				if err != nil {
					res.err = err
					return res
				}
				if len(body) > int(maxLen) {
					t.Fatalf("%d-byte body over maxLen %d", len(body), maxLen)
				}
				res.msgs = append(res.msgs, string(typ)+string(body))
			}
		}

		// The reference: frame data by hand.
		var want result
		for off := 0; ; {
			if off == len(data) {
				want.err = io.EOF
				break
			}
			if off+HeaderLen > len(data) {
				want.err = io.ErrUnexpectedEOF
				break
			}
			n := getUint32(data[off+1:])
			if n < 4 || int(n)-4 > int(maxLen) {
				want.err = ErrBadMessageLength
				break
			}
			end := off + 1 + int(n)
			if end > len(data) {
				want.err = io.ErrUnexpectedEOF
				break
			}
			want.msgs = append(want.msgs, string(data[off])+string(data[off+HeaderLen:end]))
			off = end
		}

		for _, r := range []io.Reader{bytes.NewReader(data), iotest.OneByteReader(bytes.NewReader(data))} {
			got := read(r)
			if !errors.Is(got.err, want.err) || !reflect.DeepEqual(got.msgs, want.msgs) {
				t.Fatalf("got %q, %v; want %q, %v", got.msgs, got.err, want.msgs, want.err)
			}
		}
	})
}
