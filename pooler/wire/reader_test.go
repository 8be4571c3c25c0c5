package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"testing"
	"testing/iotest"

	"github.com/jackc/pgx/v5/pgproto3"
)

// readerKinds wraps a stream the ways a network connection delivers it.
var readerKinds = []struct {
	name string
	wrap func(io.Reader) io.Reader
}{
	{"normal", func(r io.Reader) io.Reader { return r }},
	{"one byte", iotest.OneByteReader},
	{"half", iotest.HalfReader},
	{"data with EOF", iotest.DataErrReader},
}

// readAll reads every message of stream with a Reader and checks them
// against the framer's view.
func readAll(t *testing.T, stream []byte, r *Reader) {
	t.Helper()
	for i, m := range frame(t, stream) {
		typ, body, err := r.ReadMessage()
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if typ != m.typ || !bytes.Equal(body, stream[m.start+HeaderLen:m.end()]) {
			t.Fatalf("message %d: %q with %d-byte body, want %q with %d", i, typ, len(body), m.typ, m.length)
		}
	}
	if typ, body, err := r.ReadMessage(); err != io.EOF {
		t.Fatalf("after the last message: %q, %d bytes, %v; want io.EOF", typ, len(body), err)
	}
	if len(r.Buffered()) != 0 {
		t.Fatalf("%d bytes still buffered", len(r.Buffered()))
	}
}

func TestReaderReadMessage(t *testing.T) {
	streams := map[string][]byte{
		"backend":        backendStream(t),
		"extended query": extendedQueryStream(t),
		"100 KB DataRow": bigRowStream(t),
	}
	for name, stream := range streams {
		for _, kind := range readerKinds {
			// A zero buffer, one smaller than a header, one that must grow
			// for the big row, and one large enough for everything.
			for _, size := range []int{0, 3, 64, 1 << 17} {
				t.Run(fmt.Sprintf("%s/%s/%d", name, kind.name, size), func(t *testing.T) {
					r := NewReader(kind.wrap(bytes.NewReader(stream)), make([]byte, size), 200<<10)
					readAll(t, stream, r)
				})
			}
		}
	}
}

// TestReaderGrowth reads messages larger than the initial buffer, up to and
// just over maxLen.
func TestReaderGrowth(t *testing.T) {
	const maxLen = 5000
	msg := func(n int) []byte {
		return encode(t, &pgproto3.CopyData{Data: bytes.Repeat([]byte{'x'}, n)})
	}
	for _, kind := range readerKinds {
		t.Run(kind.name, func(t *testing.T) {
			var stream []byte
			sizes := []int{10, 100, 1000, maxLen, 0, maxLen, 7}
			for _, n := range sizes {
				stream = append(stream, msg(n)...)
			}
			buf := make([]byte, 16)
			r := NewReader(kind.wrap(bytes.NewReader(stream)), buf, maxLen)
			for _, n := range sizes {
				typ, body, err := r.ReadMessage()
				if err != nil {
					t.Fatalf("%d-byte body: %v", n, err)
				}
				if typ != MsgCopyData || len(body) != n || bytes.Count(body, []byte{'x'}) != n {
					t.Fatalf("%d-byte body: got %q with %d bytes", n, typ, len(body))
				}
			}
			if _, _, err := r.ReadMessage(); err != io.EOF {
				t.Fatalf("at the end: %v", err)
			}

			// One byte over maxLen is refused before it is read.
			over := append(msg(maxLen+1), msg(1)...)
			r = NewReader(kind.wrap(bytes.NewReader(over)), buf, maxLen)
			if _, _, err := r.ReadMessage(); !errors.Is(err, ErrBadMessageLength) {
				t.Fatalf("body of maxLen+1: %v, want ErrBadMessageLength", err)
			}
		})
	}
}

func TestReaderBadLength(t *testing.T) {
	for _, length := range []uint32{0, 1, 3, 1 << 31, 1<<32 - 1} {
		stream := binary.BigEndian.AppendUint32([]byte{MsgQuery}, length)
		stream = append(stream, make([]byte, 16)...)
		r := NewReader(bytes.NewReader(stream), nil, 1<<20)
		if _, _, err := r.ReadMessage(); !errors.Is(err, ErrBadMessageLength) {
			t.Errorf("length %d: %v, want ErrBadMessageLength", length, err)
		}
	}
}

func TestReaderUnexpectedEOF(t *testing.T) {
	stream := encode(t, &pgproto3.Query{String: "select 1"}, &pgproto3.Sync{})
	first := frame(t, stream)[0]
	for cut := 1; cut < len(stream); cut++ {
		if cut == first.end() {
			continue // a clean end after the first message
		}
		for _, kind := range readerKinds {
			r := NewReader(kind.wrap(bytes.NewReader(stream[:cut])), make([]byte, 8), 1<<20)
			var err error
			if cut > first.end() {
				if _, _, err = r.ReadMessage(); err != nil {
					t.Fatalf("%s, cut at %d: first message: %v", kind.name, cut, err)
				}
			}
			if _, _, err = r.ReadMessage(); err != io.ErrUnexpectedEOF {
				t.Fatalf("%s, cut at %d: %v, want io.ErrUnexpectedEOF", kind.name, cut, err)
			}
		}
	}
	// No bytes at all is a clean end.
	r := NewReader(bytes.NewReader(nil), nil, 10)
	if _, _, err := r.ReadMessage(); err != io.EOF {
		t.Fatalf("empty stream: %v, want io.EOF", err)
	}
}

func TestReaderStreamError(t *testing.T) {
	boom := errors.New("boom")
	stream := encode(t, &pgproto3.Query{String: "select 1"})
	for cut := 0; cut < len(stream); cut++ {
		r := NewReader(io.MultiReader(bytes.NewReader(stream[:cut]), iotest.ErrReader(boom)), nil, 1<<20)
		if _, _, err := r.ReadMessage(); err != boom {
			t.Fatalf("error after %d bytes: %v, want %v", cut, err, boom)
		}
	}
	// A timeout leaves the Reader usable: the bytes read so far stay
	// buffered and the message completes on the next call.
	r := NewReader(&errOnceReader{r: bytes.NewReader(stream), after: 7, err: iotest.ErrTimeout}, nil, 1<<20)
	if _, _, err := r.ReadMessage(); err != iotest.ErrTimeout {
		t.Fatalf("first call: %v, want the timeout", err)
	}
	typ, body, err := r.ReadMessage()
	if err != nil || typ != MsgQuery || string(body) != "select 1\x00" {
		t.Fatalf("after the timeout: %q %q %v", typ, body, err)
	}
}

func TestReaderFillBuffered(t *testing.T) {
	stream := encode(t, &pgproto3.Query{String: "select 1"}, &pgproto3.Terminate{})
	for _, kind := range readerKinds {
		t.Run(kind.name, func(t *testing.T) {
			r := NewReader(kind.wrap(bytes.NewReader(stream)), make([]byte, 4), 64)
			if err := r.Fill(0); err != nil {
				t.Fatalf("Fill(0): %v", err)
			}
			if err := r.Fill(1); err != nil {
				t.Fatalf("Fill(1): %v", err)
			}
			if b := r.Buffered(); len(b) < 1 || b[0] != MsgQuery {
				t.Fatalf("Buffered() after Fill(1) = %q", b)
			}
			// More than the initial buffer.
			if err := r.Fill(12); err != nil {
				t.Fatalf("Fill(12): %v", err)
			}
			if b := r.Buffered(); len(b) < 12 || !bytes.Equal(b, stream[:len(b)]) {
				t.Fatalf("Buffered() after Fill(12) = %q", b)
			}
			typ, _, err := r.ReadMessage()
			if err != nil || typ != MsgQuery {
				t.Fatalf("ReadMessage: %q %v", typ, err)
			}
			// Everything after the Query, buffered or not, is the Terminate.
			if err := r.Fill(5); err != nil {
				t.Fatalf("Fill(5): %v", err)
			}
			if b := r.Buffered(); !bytes.Equal(b, []byte{MsgTerminate, 0, 0, 0, 4}) {
				t.Fatalf("Buffered() = %q", b)
			}
			if err := r.Fill(6); err != io.ErrUnexpectedEOF {
				t.Fatalf("Fill past the end with bytes buffered: %v, want io.ErrUnexpectedEOF", err)
			}
			if _, _, err := r.ReadMessage(); err != nil {
				t.Fatalf("Terminate: %v", err)
			}
			if err := r.Fill(1); err != io.EOF {
				t.Fatalf("Fill at the end: %v, want io.EOF", err)
			}
		})
	}
}

// TestReaderRead checks that Read hands out buffered bytes before reading
// the stream, as ReadStartup over the session's Reader needs.
func TestReaderRead(t *testing.T) {
	startup := withLength(startupBody(ProtocolVersion30, "user", "alice", "database", "app"))
	password := encode(t, &pgproto3.PasswordMessage{Password: "secret"})
	stream := append(append([]byte(nil), startup...), password...)
	for _, kind := range readerKinds {
		t.Run(kind.name, func(t *testing.T) {
			r := NewReader(kind.wrap(bytes.NewReader(stream)), make([]byte, 8192), 1024)
			if err := r.Fill(1); err != nil {
				t.Fatal(err)
			}
			s, err := ReadStartup(r, nil)
			if err != nil {
				t.Fatalf("ReadStartup over a Reader: %v", err)
			}
			if u, _ := s.Parameter("user"); u != "alice" {
				t.Fatalf("user = %q", u)
			}
			typ, body, err := r.ReadMessage()
			if err != nil || typ != MsgPassword || string(body) != "secret\x00" {
				t.Fatalf("ReadMessage after ReadStartup: %q %q %v", typ, body, err)
			}
		})
	}

	// Read returns buffered bytes first, at most len(p) of them.
	r := NewReader(bytes.NewReader([]byte("abcdefgh")), make([]byte, 8), 8)
	if err := r.Fill(3); err != nil {
		t.Fatal(err)
	}
	buffered := len(r.Buffered())
	p := make([]byte, 2)
	if n, err := r.Read(p); n != 2 || err != nil || string(p) != "ab" {
		t.Fatalf("Read = %d %v %q", n, err, p[:n])
	}
	if len(r.Buffered()) != buffered-2 {
		t.Fatalf("Buffered() has %d bytes after reading 2 of %d", len(r.Buffered()), buffered)
	}
	rest, err := io.ReadAll(r)
	if err != nil || string(rest) != "cdefgh" {
		t.Fatalf("ReadAll = %q %v", rest, err)
	}
}

func TestReaderAllocs(t *testing.T) {
	stream := backendStream(t)
	br := bytes.NewReader(stream)
	r := NewReader(br, make([]byte, 4096), 1<<20)
	n := len(frame(t, stream))
	allocs := testing.AllocsPerRun(100, func() {
		br.Reset(stream)
		for range n {
			if _, _, err := r.ReadMessage(); err != nil {
				t.Fatal(err)
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("ReadMessage with a large enough buffer: %.1f allocs per stream", allocs)
	}
}

// errOnceReader returns err once, after the first after bytes of r.
type errOnceReader struct {
	r     io.Reader
	after int
	err   error
}

func (e *errOnceReader) Read(p []byte) (int, error) {
	if e.after == 0 && e.err != nil {
		err := e.err
		e.err = nil
		return 0, err
	}
	if e.err != nil && len(p) > e.after {
		p = p[:e.after]
	}
	n, err := e.r.Read(p)
	if e.err != nil {
		e.after -= n
	}
	return n, err
}
