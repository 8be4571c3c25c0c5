package wire

import (
	"fmt"
	"io"
)

// Reader reads whole messages from a stream into one reused buffer. The
// pooler uses it where it must decode messages (startup and authentication);
// the relay uses Scanner instead and never holds a whole message.
//
// A Reader is not safe for concurrent use. It owns buf for its lifetime.
type Reader struct {
	r          io.Reader
	buf        []byte
	start, end int // buf[start:end] holds bytes read but not yet consumed
	maxLen     int
}

// NewReader returns a Reader over r that reads into buf and refuses
// messages whose body is longer than maxLen bytes.
func NewReader(r io.Reader, buf []byte, maxLen int) *Reader {
	return &Reader{r: r, buf: buf[:cap(buf)], maxLen: maxLen}
}

// ReadMessage returns the next message's type and body. The body is valid
// until the next call on the Reader.
func (r *Reader) ReadMessage() (byte, []byte, error) {
	if err := r.Fill(HeaderLen); err != nil {
		return 0, nil, err
	}
	typ := r.buf[r.start]
	length := int(getUint32(r.buf[r.start+1:]))
	if length < 4 || length-4 > r.maxLen {
		return 0, nil, fmt.Errorf("%w: %d for message type %q (at most %d here)", ErrBadMessageLength, length, typ, r.maxLen+4)
	}
	if err := r.Fill(1 + length); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	body := r.buf[r.start+HeaderLen : r.start+1+length]
	r.start += 1 + length
	return typ, body, nil
}

// Fill makes sure at least n bytes are buffered, growing the buffer when a
// message is larger than it (up to maxLen).
func (r *Reader) Fill(n int) error {
	if r.end-r.start >= n {
		return nil
	}
	if r.start+n > len(r.buf) {
		if n > len(r.buf) {
			grown := make([]byte, n)
			r.end = copy(grown, r.buf[r.start:r.end])
			r.buf = grown
		} else {
			r.end = copy(r.buf, r.buf[r.start:r.end])
		}
		r.start = 0
	}
	for r.end-r.start < n {
		k, err := r.r.Read(r.buf[r.end:])
		r.end += k
		if err != nil {
			if r.end-r.start >= n {
				return nil
			}
			if err == io.EOF && r.end > r.start {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// Read implements io.Reader: buffered bytes first, then the stream.
func (r *Reader) Read(p []byte) (int, error) {
	if r.start < r.end {
		k := copy(p, r.buf[r.start:r.end])
		r.start += k
		return k, nil
	}
	return r.r.Read(p)
}

// Buffered returns the bytes read from the stream but not yet consumed. The
// slice aliases the Reader's buffer.
func (r *Reader) Buffered() []byte { return r.buf[r.start:r.end] }
