package wire

import (
	"errors"
	"fmt"
	"io"
	"strings"
)

// MaxStartupPacketLen bounds the body of a startup packet (everything after
// the length word) to 10,000 bytes, as Postgres (MAX_STARTUP_PACKET_LENGTH)
// and pgproto3 do, so pgtender accepts every packet Postgres accepts. A
// client that sends more gets FATAL 08P01 instead of an allocation of its
// choosing.
const MaxStartupPacketLen = 10000

// minStartupPacketLen is the smallest length word: itself plus a protocol
// version or request code.
const minStartupPacketLen = 8

// Request codes carried in place of a protocol version.
const (
	cancelRequestCode = 80877102
	sslRequestCode    = 80877103
	gssEncRequestCode = 80877104
)

// ProtocolVersion30 is protocol 3.0, the version pgtender speaks.
const ProtocolVersion30 = 3 << 16

// StartupKind says which of the four startup packets a client sent.
type StartupKind int

const (
	StartupMessage StartupKind = iota + 1
	SSLRequest
	GSSEncRequest
	CancelRequest
)

func (k StartupKind) String() string {
	switch k {
	case StartupMessage:
		return "StartupMessage"
	case SSLRequest:
		return "SSLRequest"
	case GSSEncRequest:
		return "GSSENCRequest"
	case CancelRequest:
		return "CancelRequest"
	}
	return fmt.Sprintf("StartupKind(%d)", int(k))
}

// ErrMalformedStartup is wrapped by every error about the startup packet's
// shape: the pooler answers it with FATAL 08P01.
var ErrMalformedStartup = errors.New("malformed startup packet")

// Startup is a parsed startup packet.
type Startup struct {
	Kind StartupKind

	// ProtocolMajor and ProtocolMinor are the version the client asked for
	// (StartupMessage only).
	ProtocolMajor, ProtocolMinor uint16
	// Parameters are the StartupMessage's name/value pairs in the order sent.
	Parameters []Parameter

	// CancelProcessID and CancelSecret identify the session to cancel
	// (CancelRequest only). CancelSecret is a copy owned by Startup.
	CancelProcessID uint32
	CancelSecret    []byte
}

// Parameter is one startup parameter.
type Parameter struct{ Name, Value string }

// Parameter returns the value of the startup parameter name and whether the
// client sent it.
func (s *Startup) Parameter(name string) (string, bool) {
	for _, p := range s.Parameters {
		if p.Name == name {
			return p.Value, true
		}
	}
	return "", false
}

// ReadStartup reads one startup packet from r. buf is scratch space the
// packet is read into when it fits (pass a reused buffer to avoid an
// allocation); the returned Startup does not refer to it. Errors wrapping
// ErrMalformedStartup describe a bad packet, including one the stream ends
// in the middle of (those also wrap io.ErrUnexpectedEOF); io.EOF means the
// stream ended before the first byte; any other error is from r.
func ReadStartup(r io.Reader, buf []byte) (Startup, error) {
	// The length word goes into buf too: a local array would escape to the
	// heap through r.
	if cap(buf) < 4 {
		buf = make([]byte, 4, 64)
	}
	lenBytes := buf[:4]
	if _, err := io.ReadFull(r, lenBytes); err != nil {
		if err == io.ErrUnexpectedEOF {
			return Startup{}, fmt.Errorf("%w: truncated in the length word: %w", ErrMalformedStartup, err)
		}
		return Startup{}, err
	}
	length := getUint32(lenBytes)
	if length < minStartupPacketLen || length-4 > MaxStartupPacketLen {
		return Startup{}, fmt.Errorf("%w: length %d outside %d..%d", ErrMalformedStartup, length, minStartupPacketLen, MaxStartupPacketLen+4)
	}
	bodyLen := int(length - 4)
	if cap(buf) >= bodyLen {
		buf = buf[:bodyLen]
	} else {
		buf = make([]byte, bodyLen)
	}
	if n, err := io.ReadFull(r, buf); err != nil {
		// io.ReadFull says io.EOF when not one body byte came: the packet is
		// just as truncated as when some did.
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return Startup{}, fmt.Errorf("%w: truncated after %d of %d body bytes: %w", ErrMalformedStartup, n, bodyLen, io.ErrUnexpectedEOF)
		}
		return Startup{}, err
	}
	return ParseStartup(buf)
}

// ParseStartup parses a startup packet body (everything after the length
// word). The result does not refer to body.
func ParseStartup(body []byte) (Startup, error) {
	if len(body) < 4 {
		return Startup{}, fmt.Errorf("%w: %d bytes", ErrMalformedStartup, len(body))
	}
	code := getUint32(body)
	rest := body[4:]
	switch code {
	case sslRequestCode:
		if len(rest) != 0 {
			return Startup{}, fmt.Errorf("%w: SSLRequest with %d extra bytes", ErrMalformedStartup, len(rest))
		}
		return Startup{Kind: SSLRequest}, nil
	case gssEncRequestCode:
		if len(rest) != 0 {
			return Startup{}, fmt.Errorf("%w: GSSENCRequest with %d extra bytes", ErrMalformedStartup, len(rest))
		}
		return Startup{Kind: GSSEncRequest}, nil
	case cancelRequestCode:
		// Protocol 3.0 has a 4-byte secret; 3.2 allows up to 256 bytes.
		if len(rest) < 8 || len(rest) > 4+256 {
			return Startup{}, fmt.Errorf("%w: CancelRequest of %d bytes", ErrMalformedStartup, len(body))
		}
		return Startup{
			Kind:            CancelRequest,
			CancelProcessID: getUint32(rest),
			CancelSecret:    append([]byte(nil), rest[4:]...),
		}, nil
	}
	s := Startup{Kind: StartupMessage, ProtocolMajor: uint16(code >> 16), ProtocolMinor: uint16(code)}
	// One string holds every name and value, and the slice is sized from
	// the NUL count: two allocations however many parameters a client
	// sends, which matters in a login storm.
	list := string(rest)
	if n := strings.Count(list, "\x00") / 2; n > 0 {
		s.Parameters = make([]Parameter, 0, n)
	}
	for {
		name, tail, ok := strings.Cut(list, "\x00")
		if !ok {
			return Startup{}, fmt.Errorf("%w: parameter list not terminated", ErrMalformedStartup)
		}
		if name == "" {
			if tail != "" {
				return Startup{}, fmt.Errorf("%w: %d bytes after the parameter list", ErrMalformedStartup, len(tail))
			}
			return s, nil
		}
		value, tail, ok := strings.Cut(tail, "\x00")
		if !ok {
			return Startup{}, fmt.Errorf("%w: parameter %q has no value", ErrMalformedStartup, name)
		}
		s.Parameters = append(s.Parameters, Parameter{Name: name, Value: value})
		list = tail
	}
}
