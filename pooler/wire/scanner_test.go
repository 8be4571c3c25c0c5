package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// encoder is what every pgproto3 message implements.
type encoder interface {
	Encode(dst []byte) ([]byte, error)
}

// encode concatenates the wire form of msgs.
func encode(t testing.TB, msgs ...encoder) []byte {
	t.Helper()
	var b []byte
	for _, m := range msgs {
		var err error
		if b, err = m.Encode(b); err != nil {
			t.Fatalf("encoding %T: %v", m, err)
		}
	}
	return b
}

// Realistic streams, built with pgproto3.

func simpleQueryStream(t testing.TB) []byte {
	return encode(t, &pgproto3.Query{String: "select 1"}, &pgproto3.Query{String: ""})
}

func extendedQueryStream(t testing.TB) []byte {
	return encode(t,
		&pgproto3.Parse{Name: "s1", Query: "SELECT abalance FROM pgbench_accounts WHERE aid = $1", ParameterOIDs: []uint32{23}},
		&pgproto3.Bind{PreparedStatement: "s1", ParameterFormatCodes: []int16{0}, Parameters: [][]byte{[]byte("42")}, ResultFormatCodes: []int16{1}},
		&pgproto3.Describe{ObjectType: 'P'},
		&pgproto3.Execute{MaxRows: 0},
		&pgproto3.Sync{},
		&pgproto3.Close{ObjectType: 'S', Name: "s1"},
		&pgproto3.Flush{},
		&pgproto3.Sync{},
		&pgproto3.Terminate{},
	)
}

func copyInStream(t testing.TB) []byte {
	return encode(t,
		&pgproto3.Query{String: "COPY t FROM STDIN"},
		&pgproto3.CopyData{Data: []byte("1\tone\n")},
		&pgproto3.CopyData{Data: []byte("2\ttwo\n3\tthree\n")},
		&pgproto3.CopyData{Data: nil},
		&pgproto3.CopyDone{},
		&pgproto3.Query{String: "COPY t FROM STDIN"},
		&pgproto3.CopyData{Data: []byte("4\tfour\n")},
		&pgproto3.CopyFail{Message: "client gave up"},
	)
}

func rowDescription() *pgproto3.RowDescription {
	return &pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{
		{Name: []byte("abalance"), TableOID: 16397, TableAttributeNumber: 3, DataTypeOID: 23, DataTypeSize: 4, TypeModifier: -1, Format: 1},
	}}
}

func backendStream(t testing.TB) []byte {
	return encode(t,
		&pgproto3.AuthenticationOk{},
		&pgproto3.ParameterStatus{Name: "server_version", Value: "17.2"},
		&pgproto3.BackendKeyData{ProcessID: 4242, SecretKey: []byte{1, 2, 3, 4}},
		&pgproto3.ReadyForQuery{TxStatus: TxIdle},
		rowDescription(),
		&pgproto3.DataRow{Values: [][]byte{[]byte("1"), nil, {}}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: TxIdle},
		&pgproto3.CommandComplete{CommandTag: []byte("BEGIN")},
		&pgproto3.ReadyForQuery{TxStatus: TxInBlock},
		&pgproto3.ParseComplete{},
		&pgproto3.BindComplete{},
		&pgproto3.NoData{},
		&pgproto3.EmptyQueryResponse{},
		&pgproto3.NoticeResponse{Severity: "NOTICE", Code: "00000", Message: "hi"},
		&pgproto3.ErrorResponse{Severity: "ERROR", Code: "42P01", Message: `relation "nope" does not exist`},
		&pgproto3.ReadyForQuery{TxStatus: TxFailed},
		&pgproto3.CopyInResponse{OverallFormat: 0, ColumnFormatCodes: []uint16{0, 0}},
		&pgproto3.CopyOutResponse{OverallFormat: 0, ColumnFormatCodes: []uint16{0}},
		&pgproto3.CopyData{Data: []byte("x\n")},
		&pgproto3.CopyDone{},
		&pgproto3.NotificationResponse{PID: 1, Channel: "ch", Payload: "p"},
		&pgproto3.ReadyForQuery{TxStatus: TxIdle},
	)
}

// bigRowStream has a DataRow of 100 KB between small messages.
func bigRowStream(t testing.TB) []byte {
	big := bytes.Repeat([]byte("0123456789"), 10*1024)
	return encode(t,
		&pgproto3.ReadyForQuery{TxStatus: TxInBlock},
		rowDescription(),
		&pgproto3.DataRow{Values: [][]byte{big}},
		&pgproto3.DataRow{Values: [][]byte{[]byte("small")}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 2")},
		&pgproto3.ReadyForQuery{TxStatus: TxIdle},
	)
}

// pgbenchSelectResponse is what Postgres answers to one pgbench -S
// transaction in extended mode (libpq sends Parse, Bind, Describe portal,
// Execute, Sync, so a RowDescription comes back too).
func pgbenchSelectResponse(t testing.TB) []byte {
	return encode(t,
		&pgproto3.ParseComplete{},
		&pgproto3.BindComplete{},
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{
			{Name: []byte("abalance"), TableOID: 16397, TableAttributeNumber: 3, DataTypeOID: 23, DataTypeSize: 4, TypeModifier: -1},
		}},
		&pgproto3.DataRow{Values: [][]byte{[]byte("-2861")}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: TxIdle},
	)
}

// inspectReadyForQuery is the relay's Inspect: the status byte of 'Z'.
func inspectReadyForQuery(typ byte) int {
	if typ == MsgReadyForQuery {
		return 1
	}
	return 0
}

// refMsg is a message as an independent, whole-stream framer sees it.
type refMsg struct {
	typ    byte
	start  int // absolute offset of the header
	length int // body length
}

func (m refMsg) end() int { return m.start + HeaderLen + m.length }

func frame(t testing.TB, stream []byte) []refMsg {
	t.Helper()
	var msgs []refMsg
	for off := 0; off < len(stream); {
		if len(stream)-off < HeaderLen {
			t.Fatalf("stream ends in a header at %d", off)
		}
		n := int(binary.BigEndian.Uint32(stream[off+1:]))
		m := refMsg{typ: stream[off], start: off, length: n - 4}
		if m.end() > len(stream) {
			t.Fatalf("stream ends in a body at %d", off)
		}
		msgs = append(msgs, m)
		off = m.end()
	}
	return msgs
}

// seen is one message as reported by the Scanner, in absolute offsets.
type seen struct {
	typ      byte
	length   int
	start    int    // chunk base + Message.Start
	reported int    // absolute offset Next returned with the message
	body     string // Message.Body
}

func (s seen) String() string {
	return fmt.Sprintf("%q len %d at %d (reported at %d, body %q)", s.typ, s.length, s.start, s.reported, s.body)
}

// expected is what a Scanner with inspect must report for stream.
func expected(stream []byte, ref []refMsg, inspect func(byte) int) []seen {
	var want []seen
	for _, m := range ref {
		k := 0
		if inspect != nil {
			k = max(0, min(inspect(m.typ), m.length, maxInspectLen))
		}
		body := stream[m.start+HeaderLen : m.start+HeaderLen+k]
		want = append(want, seen{typ: m.typ, length: m.length, start: m.start, reported: m.start + HeaderLen + k, body: string(body)})
	}
	return want
}

// boundaries is the set of absolute offsets between two messages.
func boundaries(ref []refMsg) map[int]bool {
	b := map[int]bool{0: true}
	for _, m := range ref {
		b[m.end()] = true
	}
	return b
}

// scanChunks feeds stream to a fresh Scanner in chunks ending at the given
// absolute offsets (the last chunk runs to the end), calling Next until it
// says the chunk is consumed, and checks AtBoundary after every call.
func scanChunks(t testing.TB, stream []byte, cuts []int, inspect func(byte) int, bounds map[int]bool) []seen {
	t.Helper()
	s := Scanner{Inspect: inspect}
	var got []seen
	base := 0
	for i := 0; i <= len(cuts); i++ {
		end := len(stream)
		if i < len(cuts) {
			end = cuts[i]
		}
		chunk := stream[base:end]
		off := 0
		for {
			next, msg, ok, err := s.Next(chunk, off)
			if err != nil {
				t.Fatalf("cuts %v: Next(chunk %d..%d, %d): %v", cuts, base, end, off, err)
			}
			if next < off || next > len(chunk) {
				t.Fatalf("cuts %v: Next(chunk %d..%d, %d) went to %d", cuts, base, end, off, next)
			}
			off = next
			if s.AtBoundary() != bounds[base+off] {
				t.Fatalf("cuts %v: AtBoundary() = %v at %d", cuts, s.AtBoundary(), base+off)
			}
			if !ok {
				if off != len(chunk) {
					t.Fatalf("cuts %v: Next returned false at %d of a %d-byte chunk", cuts, off, len(chunk))
				}
				break
			}
			got = append(got, seen{typ: msg.Type, length: msg.Length, start: base + msg.Start, reported: base + off, body: string(msg.Body)})
		}
		base = end
	}
	return got
}

// relayScan simulates the relay's loop: a partial header at the end of a
// chunk is kept and scanned again at the front of the next one, and only
// the bytes before it are forwarded. reads are the sizes of successive
// reads from the stream (cycled).
func relayScan(t testing.TB, stream []byte, reads []int, inspect func(byte) int, ref []refMsg) []seen {
	t.Helper()
	s := Scanner{Inspect: inspect}
	var got []seen
	var forwarded, carried []byte
	pos := 0 // stream bytes read so far
	for i := 0; pos < len(stream); i++ {
		k := min(reads[i%len(reads)], len(stream)-pos)
		chunk := append(carried, stream[pos:pos+k]...)
		base := pos - len(carried)
		pos += k
		for off := 0; off < len(chunk); {
			var msg Message
			var ok bool
			var err error
			off, msg, ok, err = s.Next(chunk, off)
			if err != nil {
				t.Fatalf("reads %v: %v", reads, err)
			}
			if !ok {
				break
			}
			got = append(got, seen{typ: msg.Type, length: msg.Length, start: base + msg.Start, reported: base + off, body: string(msg.Body)})
		}
		partial := s.UnreportedLen()
		if partial < 0 || partial >= HeaderLen+maxInspectLen {
			t.Fatalf("reads %v: UnreportedLen() = %d", reads, partial)
		}
		forward := len(chunk) - partial
		forwarded = append(forwarded, chunk[:forward]...)
		// A forwarded chunk never ends inside a header, nor inside the part
		// of a body that Inspect asked for before the message is reported.
		for _, m := range ref {
			unreported := HeaderLen
			if inspect != nil {
				unreported += max(0, min(inspect(m.typ), m.length, maxInspectLen))
			}
			if e := base + forward; e > m.start && e < m.start+unreported {
				t.Fatalf("reads %v: forwarded up to %d, inside the first %d bytes of %q at %d", reads, e, unreported, m.typ, m.start)
			}
		}
		carried = append([]byte(nil), chunk[forward:]...)
		s.DropUnreported()
		if s.UnreportedLen() != 0 {
			t.Fatalf("UnreportedLen() = %d after DropUnreported", s.UnreportedLen())
		}
	}
	if len(carried) != 0 || !bytes.Equal(forwarded, stream) {
		t.Fatalf("reads %v: forwarded %d bytes with %d carried, want the %d-byte stream", reads, len(forwarded), len(carried), len(stream))
	}
	if !s.AtBoundary() {
		t.Fatalf("reads %v: not at a boundary at the end of the stream", reads)
	}
	return got
}

func equalSeen(t testing.TB, what string, got, want []seen) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d messages, want %d:\ngot  %v\nwant %v", what, len(got), len(want), got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: message %d is %v, want %v", what, i, got[i], want[i])
		}
	}
}

// nearHeader reports whether offset is within a few bytes of a header.
func nearHeader(ref []refMsg, offset int) bool {
	for _, m := range ref {
		if offset >= m.start-8 && offset <= m.start+HeaderLen+maxInspectLen+8 {
			return true
		}
	}
	return false
}

// fixedChunks returns the cuts for chunks of size n.
func fixedChunks(total, n int) []int {
	var cuts []int
	for c := n; c < total; c += n {
		cuts = append(cuts, c)
	}
	return cuts
}

func randomChunks(rng *rand.Rand, total, maxSize int) []int {
	var cuts []int
	for c := 1 + rng.IntN(maxSize); c < total; c += 1 + rng.IntN(maxSize) {
		cuts = append(cuts, c)
	}
	return cuts
}

func TestScannerStreams(t *testing.T) {
	streams := []struct {
		name   string
		stream []byte
		big    bool
	}{
		{"simple query", simpleQueryStream(t), false},
		{"extended query", extendedQueryStream(t), false},
		{"copy in", copyInStream(t), false},
		{"backend", backendStream(t), false},
		{"pgbench -S response", pgbenchSelectResponse(t), false},
		{"100 KB DataRow", bigRowStream(t), true},
	}
	inspects := []struct {
		name    string
		inspect func(byte) int
	}{
		{"Z status", inspectReadyForQuery},
		{"none", nil},
		{"10 bytes of all", func(byte) int { return 10 }},
		{"more than maxInspectLen", func(byte) int { return 1 << 20 }},
		{"negative", func(byte) int { return -1 }},
	}
	for _, st := range streams {
		ref := frame(t, st.stream)
		bounds := boundaries(ref)
		for _, in := range inspects {
			t.Run(st.name+"/"+in.name, func(t *testing.T) {
				want := expected(st.stream, ref, in.inspect)
				n := len(st.stream)
				equalSeen(t, "one chunk", scanChunks(t, st.stream, nil, in.inspect, bounds), want)
				// Every split into two chunks, and for the small streams
				// with the relay's Inspect every split into three.
				threeWay := !st.big && in.name == "Z status"
				for i := 0; i <= n; i++ {
					if st.big && !nearHeader(ref, i) && i%101 != 0 {
						continue // the middle of the big body: a sample is enough
					}
					equalSeen(t, fmt.Sprintf("cut at %d", i), scanChunks(t, st.stream, []int{i}, in.inspect, bounds), want)
					if !threeWay {
						continue
					}
					for j := i; j <= n; j++ {
						equalSeen(t, fmt.Sprintf("cuts at %d, %d", i, j), scanChunks(t, st.stream, []int{i, j}, in.inspect, bounds), want)
					}
				}
				for _, size := range []int{1, 2, 3, 4, 5, 6, 7, 8, 13, 4096} {
					equalSeen(t, fmt.Sprintf("%d-byte chunks", size), scanChunks(t, st.stream, fixedChunks(n, size), in.inspect, bounds), want)
				}
				rng := rand.New(rand.NewPCG(uint64(n), 1))
				for range 20 {
					cuts := randomChunks(rng, n, 1+rng.IntN(n/4+1))
					equalSeen(t, fmt.Sprintf("cuts %v", cuts), scanChunks(t, st.stream, cuts, in.inspect, bounds), want)
				}
				// Empty chunks change nothing.
				equalSeen(t, "with empty chunks", scanChunks(t, st.stream, []int{0, 0, n / 2, n / 2, n}, in.inspect, bounds), want)

				// The relay's loop: every read size up to 9, then 1-byte
				// and random reads.
				for size := 1; size <= 9; size++ {
					equalSeen(t, fmt.Sprintf("relay with %d-byte reads", size), relayScan(t, st.stream, []int{size}, in.inspect, ref), want)
				}
				if !st.big {
					for i := 1; i <= n; i++ {
						equalSeen(t, fmt.Sprintf("relay with reads %d, rest", i), relayScan(t, st.stream, []int{i, n}, in.inspect, ref), want)
					}
				}
				for range 20 {
					reads := make([]int, 1+rng.IntN(8))
					for i := range reads {
						reads[i] = 1 + rng.IntN(max(1, n/8))
					}
					equalSeen(t, fmt.Sprintf("relay with reads %v", reads), relayScan(t, st.stream, reads, in.inspect, ref), want)
				}
			})
		}
	}
}

// TestScannerStartOffsets spells out Start for a header split over three
// chunks, as a worked example of the contract.
func TestScannerStartOffsets(t *testing.T) {
	stream := encode(t, &pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")}, &pgproto3.ReadyForQuery{TxStatus: TxInBlock})
	// CommandComplete: 0..14; ReadyForQuery header at 14..19, status at 19.
	s := Scanner{Inspect: inspectReadyForQuery}
	chunk1, chunk2, chunk3, chunk4 := stream[:16], stream[16:18], stream[18:19], stream[19:]

	off, msg, ok, err := s.Next(chunk1, 0)
	if err != nil || !ok || msg.Type != MsgCommandComplete || msg.Start != 0 || msg.Length != 9 || off != 5 {
		t.Fatalf("first Next = %d, %+v, %v, %v", off, msg, ok, err)
	}
	if off, _, ok, err = s.Next(chunk1, off); ok || err != nil || off != len(chunk1) {
		t.Fatalf("rest of chunk 1: %d, %v, %v", off, ok, err)
	}
	if s.UnreportedLen() != 2 || s.AtBoundary() {
		t.Fatalf("after chunk 1: UnreportedLen %d, AtBoundary %v", s.UnreportedLen(), s.AtBoundary())
	}
	if off, _, ok, err = s.Next(chunk2, 0); ok || err != nil || off != 2 || s.UnreportedLen() != 4 {
		t.Fatalf("chunk 2: %d, %v, %v, partial %d", off, ok, err, s.UnreportedLen())
	}
	// The header completes in chunk 3 but the status byte is in chunk 4:
	// the whole header is still unreported.
	if off, _, ok, err = s.Next(chunk3, 0); ok || err != nil || off != 1 || s.UnreportedLen() != HeaderLen || s.AtBoundary() {
		t.Fatalf("chunk 3: %d, %v, %v, partial %d", off, ok, err, s.UnreportedLen())
	}
	off, msg, ok, err = s.Next(chunk4, 0)
	if err != nil || !ok || off != 1 || msg.Type != MsgReadyForQuery || msg.Length != 1 || string(msg.Body) != "T" {
		t.Fatalf("chunk 4: %d, %+v, %v, %v", off, msg, ok, err)
	}
	// The header began 14 bytes into the stream; chunk 4 begins at 19.
	if msg.Start != 14-19 {
		t.Fatalf("Start = %d, want %d", msg.Start, 14-19)
	}
	if !s.AtBoundary() {
		t.Fatal("not at a boundary after the last byte")
	}
}

func TestScannerBadLength(t *testing.T) {
	good := encode(t, &pgproto3.Query{String: "select 1"})
	for _, length := range []uint32{0, 1, 3, MaxMessageLen + 5, 1<<31 + 4, 1<<32 - 1} {
		bad := append(append([]byte(nil), good...), MsgQuery)
		bad = binary.BigEndian.AppendUint32(bad, length)
		bad = append(bad, "trailing"...)
		for cut := 0; cut <= len(bad); cut++ {
			s := Scanner{Inspect: inspectReadyForQuery}
			var err error
			var msgs int
			for _, chunk := range [][]byte{bad[:cut], bad[cut:]} {
				for off := 0; off < len(chunk) && err == nil; {
					var ok bool
					off, _, ok, err = s.Next(chunk, off)
					if ok {
						msgs++
					}
					if !ok {
						break
					}
				}
				if err != nil {
					break
				}
			}
			if !errors.Is(err, ErrBadMessageLength) {
				t.Fatalf("length %d cut at %d: err = %v, want ErrBadMessageLength", length, cut, err)
			}
			if msgs != 1 {
				t.Fatalf("length %d cut at %d: %d messages before the error, want 1", length, cut, msgs)
			}
		}
	}
	// The largest allowed length is fine.
	hdr := binary.BigEndian.AppendUint32([]byte{MsgCopyData}, MaxMessageLen)
	var s Scanner
	if _, msg, ok, err := s.Next(hdr, 0); err != nil || !ok || msg.Length != MaxMessageLen-4 {
		t.Fatalf("length MaxMessageLen: %+v, %v, %v", msg, ok, err)
	}
}

// TestScannerMaxLen: a message whose length word is over MaxLen is an
// error wrapping ErrMessageTooLarge, whichever chunk its header ends in;
// one at MaxLen passes, and the messages before it are reported.
func TestScannerMaxLen(t *testing.T) {
	const maxLen = 1024
	good := encode(t, &pgproto3.Query{String: "select 1"})
	for _, length := range []uint32{maxLen + 1, maxLen + 5, MaxMessageLen} {
		stream := binary.BigEndian.AppendUint32(append(append([]byte(nil), good...), MsgQuery), length)
		for cut := 0; cut <= len(stream); cut++ {
			s := Scanner{MaxLen: maxLen}
			var err error
			var msgs int
			for _, chunk := range [][]byte{stream[:cut], stream[cut:]} {
				for off := 0; off < len(chunk) && err == nil; {
					var ok bool
					if off, _, ok, err = s.Next(chunk, off); !ok {
						break
					}
					msgs++
				}
			}
			if !errors.Is(err, ErrMessageTooLarge) || msgs != 1 {
				t.Fatalf("length %d cut at %d: %d messages, err %v; want 1 message, then ErrMessageTooLarge", length, cut, msgs, err)
			}
		}
	}
	s := Scanner{MaxLen: maxLen}
	hdr := binary.BigEndian.AppendUint32([]byte{MsgCopyData}, maxLen)
	if _, msg, ok, err := s.Next(hdr, 0); err != nil || !ok || msg.Length != maxLen-4 {
		t.Fatalf("length MaxLen: %+v, %v, %v", msg, ok, err)
	}
}

func TestScannerReset(t *testing.T) {
	stream := backendStream(t)
	s := Scanner{Inspect: inspectReadyForQuery}
	if _, _, _, err := s.Next(stream[:7], 0); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.Next(stream[7:10], 0); err != nil {
		t.Fatal(err)
	}
	if s.AtBoundary() {
		t.Fatal("at a boundary in the middle of a message")
	}
	s.Reset()
	if !s.AtBoundary() || s.UnreportedLen() != 0 || s.Inspect == nil {
		t.Fatalf("after Reset: AtBoundary %v, UnreportedLen %d, Inspect kept %v", s.AtBoundary(), s.UnreportedLen(), s.Inspect != nil)
	}
	ref := frame(t, stream)
	equalSeen(t, "after Reset", scanChunks2(t, &s, stream), expected(stream, ref, inspectReadyForQuery))
}

// scanChunks2 scans stream as one chunk with an existing Scanner.
func scanChunks2(t testing.TB, s *Scanner, stream []byte) []seen {
	t.Helper()
	var got []seen
	for off := 0; ; {
		var msg Message
		var ok bool
		var err error
		off, msg, ok, err = s.Next(stream, off)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return got
		}
		got = append(got, seen{typ: msg.Type, length: msg.Length, start: msg.Start, reported: off, body: string(msg.Body)})
	}
}

func TestScannerBodyValidUntilNext(t *testing.T) {
	stream := encode(t, &pgproto3.ReadyForQuery{TxStatus: TxInBlock}, &pgproto3.ReadyForQuery{TxStatus: TxFailed})
	s := Scanner{Inspect: inspectReadyForQuery}
	_, msg, ok, err := s.Next(stream, 0)
	if err != nil || !ok || string(msg.Body) != "T" {
		t.Fatalf("%+v %v %v", msg, ok, err)
	}
	// The body is a copy: the chunk may be reused at once.
	saved := stream[5]
	stream[5] = 'X'
	if string(msg.Body) != "T" {
		t.Fatalf("Body aliases the chunk: %q", msg.Body)
	}
	stream[5] = saved
}

func TestScannerAllocs(t *testing.T) {
	stream := backendStream(t)
	s := Scanner{Inspect: inspectReadyForQuery}
	allocs := testing.AllocsPerRun(100, func() {
		for off := 0; ; {
			var ok bool
			var err error
			off, _, ok, err = s.Next(stream, off)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("scanning allocates: %.1f allocs per stream", allocs)
	}
}

// BenchmarkScannerServerStream scans Postgres's answer to one pgbench -S
// transaction in extended mode, as the relay does for every server read.
// It must not allocate.
func BenchmarkScannerServerStream(b *testing.B) {
	stream := pgbenchSelectResponse(b)
	s := Scanner{Inspect: inspectReadyForQuery}
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		for off := 0; off < len(stream); {
			var msg Message
			var ok bool
			var err error
			off, msg, ok, err = s.Next(stream, off)
			if err != nil {
				b.Fatal(err)
			}
			if !ok {
				break
			}
			if msg.Type == MsgReadyForQuery && msg.Body[0] != TxIdle {
				b.Fatalf("status %q", msg.Body[0])
			}
		}
		if !s.AtBoundary() {
			b.Fatal("not at a boundary")
		}
	}
}

// TestScannerWhole: a message wanted whole is reported only from a chunk
// that holds all of it, with the whole body; split across reads, the
// relay's hold-back (UnreportedLen, PendingLen, DropUnreported) brings it
// together, whatever the split.
func TestScannerWhole(t *testing.T) {
	parse := AppendParse(nil, []byte("s1"), []byte("SELECT $1::int"), nil)
	stream := append(AppendSync(nil), parse...)
	stream = AppendSync(stream)
	for split := 1; split < len(stream); split++ {
		s := Scanner{Whole: func(typ byte, length int) bool { return typ == MsgParse }}
		var got []string
		buf := make([]byte, 0, len(stream))
		input := [][]byte{stream[:split], stream[split:]}
		for _, part := range input {
			buf = append(buf, part...)
			for off := 0; off < len(buf); {
				var msg Message
				var ok bool
				var err error
				off, msg, ok, err = s.Next(buf, off)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				got = append(got, fmt.Sprintf("%c:%d", msg.Type, len(msg.Body)))
				if msg.Type == MsgParse && !bytes.Equal(msg.Body, parse[HeaderLen:]) {
					t.Fatalf("split %d: body %q", split, msg.Body)
				}
			}
			held := s.UnreportedLen()
			if need := s.PendingLen(); need != 0 && need != len(parse) {
				t.Fatalf("split %d: PendingLen %d, want %d", split, need, len(parse))
			}
			s.DropUnreported()
			buf = append(buf[:0], buf[len(buf)-held:]...)
		}
		if want := fmt.Sprintf("[S:0 P:%d S:0]", len(parse)-HeaderLen); fmt.Sprint(got) != want {
			t.Fatalf("split %d: got %v, want %s", split, got, want)
		}
		if !s.AtBoundary() {
			t.Fatalf("split %d: not at a boundary at the end", split)
		}
	}
}
