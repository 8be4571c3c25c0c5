package wire

import (
	"errors"
	"fmt"
)

// maxInspectLen bounds how much of a message body the Scanner copies out for
// inspection. The pooler inspects only small messages (ReadyForQuery's
// status byte today).
const maxInspectLen = 256

// ErrBadMessageLength is wrapped when a message header carries a length the
// protocol does not allow.
var ErrBadMessageLength = errors.New("invalid message length")

// ErrMessageTooLarge is wrapped when a message is longer than the Scanner's
// MaxLen.
var ErrMessageTooLarge = errors.New("message too large")

// Scanner follows the message boundaries of one direction of a Postgres
// stream as it passes through in chunks of any size, without copying or
// decoding the messages. It reports each message once its header (and, for
// types Inspect asks about, the first bytes of its body) have been seen.
//
// A Scanner is not safe for concurrent use; it belongs to whoever reads the
// stream it follows.
type Scanner struct {
	// Inspect says how many leading body bytes of a message of type typ the
	// caller wants to see in Message.Body (0 = none). Set it once.
	Inspect func(typ byte) int
	// Whole says whether a message of type typ and body length length must
	// be reported whole: only once the chunk holds all of it, with Body the
	// whole body, aliasing the chunk. Until then it is unreported, and a
	// caller that holds back UnreportedLen bytes must make room for
	// PendingLen of them. It takes precedence over Inspect. Change it only
	// between messages (AtBoundary): it is asked at each header.
	Whole func(typ byte, length int) bool
	// MaxLen bounds a message's length as its header counts it (the body
	// and the four bytes of the length word); a longer one is an error
	// wrapping ErrMessageTooLarge. 0: MaxMessageLen, an error wrapping
	// ErrBadMessageLength above it.
	MaxLen int

	hdr         [HeaderLen]byte
	hdrLen      int // header bytes seen of the current message
	typ         byte
	remaining   int // body bytes of the current message not yet seen
	inspectLeft int // body bytes still to copy into body before reporting
	body        [maxInspectLen]byte
	bodyLen     int
	length      int
	whole       bool // the current message is wanted whole and not all seen
	start       int  // offset of the current header in the chunk being scanned (may be negative)
}

// Message describes a message the Scanner reached.
type Message struct {
	Type byte
	// Length is the body length (the length word minus four).
	Length int
	// Start is the offset in the current chunk where the message's header
	// began; it is negative when the header began in an earlier chunk.
	Start int
	// Body holds the first bytes of the body that Inspect asked for. It is
	// valid until the next call to Next.
	Body []byte
}

// Next scans chunk from off and stops after the next message it can report,
// returning the offset to continue from, the message and true; or it
// consumes the rest of chunk and returns len(chunk), false. An error means
// the stream is not a valid message stream and cannot be followed further.
// After it has returned false, the next call must pass the next chunk: that
// is when Start is rebased for a message still in progress.
func (s *Scanner) Next(chunk []byte, off int) (int, Message, bool, error) {
	for off < len(chunk) {
		if s.inspectLeft > 0 {
			k := min(s.inspectLeft, len(chunk)-off)
			copy(s.body[s.bodyLen:], chunk[off:off+k])
			s.bodyLen += k
			s.inspectLeft -= k
			s.remaining -= k
			off += k
			if s.inspectLeft == 0 {
				return off, s.message(), true, nil
			}
			continue
		}
		if s.remaining > 0 {
			k := min(s.remaining, len(chunk)-off)
			s.remaining -= k
			off += k
			continue
		}
		if s.hdrLen == 0 {
			s.start = off
		}
		k := min(HeaderLen-s.hdrLen, len(chunk)-off)
		copy(s.hdr[s.hdrLen:], chunk[off:off+k])
		s.hdrLen += k
		off += k
		if s.hdrLen < HeaderLen {
			continue
		}
		s.hdrLen = 0
		s.typ = s.hdr[0]
		length := int(getUint32(s.hdr[1:]))
		if length < 4 || length > MaxMessageLen {
			return off, Message{}, false, fmt.Errorf("%w: %d for message type %q", ErrBadMessageLength, length, s.typ)
		}
		if s.MaxLen > 0 && length > s.MaxLen {
			return off, Message{}, false, fmt.Errorf("%w: %d bytes for message type %q, at most %d", ErrMessageTooLarge, length, s.typ, s.MaxLen)
		}
		s.length = length - 4
		s.remaining = s.length
		s.bodyLen = 0
		s.inspectLeft = 0
		if s.Whole != nil && s.length > 0 && s.Whole(s.typ, s.length) {
			if s.length <= len(chunk)-off {
				body := chunk[off : off+s.length : off+s.length]
				off += s.length
				s.remaining = 0
				return off, Message{Type: s.typ, Length: s.length, Start: s.start, Body: body}, true, nil
			}
			// Consumed to the end of the chunk, never reported: the caller
			// holds it back and scans it again once it has all of it.
			s.whole = true
			s.remaining -= len(chunk) - off
			off = len(chunk)
			break
		}
		if s.Inspect != nil {
			// Clamped at 0 too: a negative answer must not leave the
			// message unreported and the scanner never at a boundary.
			s.inspectLeft = max(0, min(s.Inspect(s.typ), s.remaining, maxInspectLen))
		}
		if s.inspectLeft == 0 {
			return off, s.message(), true, nil
		}
	}
	// The next chunk starts at offset 0; keep Start meaningful for a message
	// still in progress.
	s.start -= len(chunk)
	return off, Message{}, false, nil
}

func (s *Scanner) message() Message {
	return Message{Type: s.typ, Length: s.length, Start: s.start, Body: s.body[:s.bodyLen]}
}

// AtBoundary reports whether the stream is between two messages.
func (s *Scanner) AtBoundary() bool {
	return s.hdrLen == 0 && s.remaining == 0 && s.inspectLeft == 0 && !s.whole
}

// UnreportedLen is the number of bytes at the end of the last chunk that
// belong to a message the Scanner has seen begin but not reported yet: a
// partial header, or a whole header and the part of the body Inspect asked
// for. A relay that holds them back until the next chunk never forwards
// part of a message before it has decided what to do with the message.
func (s *Scanner) UnreportedLen() int {
	if s.whole {
		return HeaderLen + s.length - s.remaining
	}
	if s.inspectLeft > 0 {
		return HeaderLen + s.bodyLen
	}
	return s.hdrLen
}

// DropUnreported forgets the unreported message, for a caller that keeps
// those bytes and scans them again at the front of its next chunk.
func (s *Scanner) DropUnreported() {
	if s.whole {
		s.whole, s.remaining = false, 0
	}
	if s.inspectLeft > 0 {
		s.remaining, s.inspectLeft, s.bodyLen = 0, 0, 0
	}
	s.hdrLen = 0
}

// PendingLen is the length, header included, of a message wanted whole
// (Whole) that the last chunk held only part of; 0 when there is none.
func (s *Scanner) PendingLen() int {
	if s.whole {
		return HeaderLen + s.length
	}
	return 0
}

// Reset puts the scanner back at a message boundary.
func (s *Scanner) Reset() {
	*s = Scanner{Inspect: s.Inspect, Whole: s.Whole}
}
