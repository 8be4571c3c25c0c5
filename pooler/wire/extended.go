package wire

import (
	"bytes"
	"errors"
	"fmt"
)

// The extended query protocol messages the pooler inspects or rewrites to
// rename clients' prepared statements to pool-wide names. Layouts are those
// of the PostgreSQL documentation, "Frontend/Backend Protocol", "Message
// Formats". Decoders take a message body (the bytes after the 5-byte
// header), check it as strictly as Postgres does, and return slices that
// alias the body: they are valid only as long as the body is, and a caller
// that keeps one past that copies it.

// ErrMalformedMessage is wrapped by every error about the shape of a
// message body: a count or length the body does not hold, a missing NUL,
// bytes left after the last field, an unknown target kind. Postgres answers
// such a message from a client with ERROR 08P01 (protocol_violation:
// "invalid string in message", "invalid message format") and, in the
// extended protocol, discards messages up to the next Sync; the message's
// length word is intact, so the pooler can answer the same way.
var ErrMalformedMessage = errors.New("malformed message")

// ErrIncomplete is wrapped when a decoder that accepts the first bytes of a
// body (BindNames) was given too few of them to answer. It is not an error
// about the message: the caller reads more of the body and asks again, or,
// if it already passed the whole body, treats the message as malformed.
var ErrIncomplete = errors.New("message prefix too short")

// Describe and Close say what they target with one byte.
const (
	TargetStatement byte = 'S' // a prepared statement
	TargetPortal    byte = 'P' // a portal
)

// Parse is a decoded Parse message. Its slices alias the body it was
// decoded from.
type Parse struct {
	// Name is the prepared statement's name without its NUL; empty for the
	// unnamed statement.
	Name []byte
	// Query is the query string without its NUL.
	Query []byte
	// ParamTypes is the parameter type section exactly as sent: an int16
	// count, then that many 4-byte type OIDs (0 for "unspecified"). It is
	// kept raw so that (Query, ParamTypes) can key a statement cache byte
	// for byte: two Parses with the same query but different types prepare
	// different statements.
	ParamTypes []byte
}

// ParamCount returns the number of parameter types the Parse specifies.
func (p Parse) ParamCount() int { return int(getUint16(p.ParamTypes)) }

// ParamOID returns the i-th parameter type OID, for 0 <= i < ParamCount().
func (p Parse) ParamOID(i int) uint32 { return getUint32(p.ParamTypes[2+4*i:]) }

// DecodeParse decodes a Parse body: statement name, query string, then the
// int16 count of parameter types and the OIDs. Like Postgres, whose
// postgres.c reads the count with pq_getmsgint (which returns it
// unsigned), it reads the count as 0..65535, so a "negative" count is one
// too large for the body; and like Postgres (pq_getmsgend) it refuses bytes
// after the last OID. The result aliases body.
func DecodeParse(body []byte) (Parse, error) {
	name, off, ok := cstring(body, 0)
	if !ok {
		return Parse{}, malformed("Parse", "statement name not terminated")
	}
	query, off, ok := cstring(body, off)
	if !ok {
		return Parse{}, malformed("Parse", "query string not terminated")
	}
	types := body[off:len(body):len(body)]
	if len(types) < 2 {
		return Parse{}, malformed("Parse", "no parameter type count")
	}
	if n := int(getUint16(types)); len(types) != 2+4*n {
		return Parse{}, malformed("Parse", fmt.Sprintf("%d parameter types in %d bytes", n, len(types)-2))
	}
	return Parse{Name: name, Query: query, ParamTypes: types}, nil
}

// AppendParse appends a Parse message (header included) to dst. paramTypes
// is the raw section Parse.ParamTypes holds; an empty one is written as a
// zero count, so a caller with no types to give can pass nil. It is copied
// as given: the caller is trusted to pass a section DecodeParse accepted.
func AppendParse(dst []byte, name, query, paramTypes []byte) []byte {
	start := len(dst)
	dst = append(dst, MsgParse, 0, 0, 0, 0)
	dst = append(dst, name...)
	dst = append(dst, 0)
	dst = append(dst, query...)
	dst = append(dst, 0)
	if len(paramTypes) == 0 {
		dst = append(dst, 0, 0)
	} else {
		dst = append(dst, paramTypes...)
	}
	putUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// BindNames returns the destination portal and source statement names
// that open a Bind body, without their NULs, and the offset in body where
// the rest (parameter format codes, parameters, result format codes)
// begins. body may be only the first bytes of the body: the pooler looks at
// a bounded prefix of a Bind, which can carry up to a gigabyte of
// parameters, and streams the remainder unchanged. When body ends before
// the second name's NUL, the error wraps ErrIncomplete; if body was the
// whole body, that means the Bind is malformed (Postgres: "invalid string
// in message"). Nothing after the names is checked: that is Postgres's job
// when the message reaches it. The names alias body.
func BindNames(body []byte) (portal, statement []byte, rest int, err error) {
	portal, off, ok := cstring(body, 0)
	if !ok {
		return nil, nil, 0, fmt.Errorf("%w: Bind: portal name not terminated in %d bytes", ErrIncomplete, len(body))
	}
	statement, off, ok = cstring(body, off)
	if !ok {
		return nil, nil, 0, fmt.Errorf("%w: Bind: statement name not terminated in %d bytes", ErrIncomplete, len(body))
	}
	return portal, statement, off, nil
}

// AppendBindPrefix appends to dst the start of a Bind message that is an
// existing Bind with its names replaced: the header, with the length
// recomputed, then portal and statement, each with its NUL. The caller then
// writes the old body from offset rest on, unchanged, and the result is a
// whole Bind. bodyLen is the old body's length (Message.Length, the length
// word minus four) and rest the offset BindNames returned for it, so that
// the new body is bodyLen - rest + len(portal) + len(statement) + 2 bytes.
// It panics if rest is not within 2..bodyLen (a caller bug: BindNames
// never returns such an offset), and it does not check that the longer
// names keep the message under MaxMessageLen.
func AppendBindPrefix(dst []byte, bodyLen, rest int, portal, statement []byte) []byte {
	if rest < 2 || rest > bodyLen {
		panic(fmt.Sprintf("BUG: AppendBindPrefix: rest %d outside 2..%d", rest, bodyLen))
	}
	newLen := 4 + len(portal) + 1 + len(statement) + 1 + bodyLen - rest
	dst = append(dst, MsgBind, 0, 0, 0, 0)
	putUint32(dst[len(dst)-4:], uint32(newLen))
	dst = append(dst, portal...)
	dst = append(dst, 0)
	dst = append(dst, statement...)
	return append(dst, 0)
}

// DecodeTarget decodes a Describe or Close body: the target kind
// (TargetStatement or TargetPortal) and its name without the NUL, aliasing
// body. Postgres refuses any other kind ("invalid DESCRIBE message
// subtype", "invalid CLOSE message subtype") and bytes after the NUL, and
// so does DecodeTarget.
func DecodeTarget(body []byte) (kind byte, name []byte, err error) {
	if len(body) == 0 {
		return 0, nil, malformed("Describe/Close", "empty body")
	}
	kind = body[0]
	if kind != TargetStatement && kind != TargetPortal {
		return 0, nil, malformed("Describe/Close", fmt.Sprintf("target kind %q", kind))
	}
	name, off, ok := cstring(body, 1)
	if !ok {
		return 0, nil, malformed("Describe/Close", "name not terminated")
	}
	if off != len(body) {
		return 0, nil, malformed("Describe/Close", fmt.Sprintf("%d bytes after the name", len(body)-off))
	}
	return kind, name, nil
}

// AppendDescribe appends a Describe of the statement or portal name
// (kind TargetStatement or TargetPortal) to dst. It panics on another kind,
// which Postgres would refuse.
func AppendDescribe(dst []byte, kind byte, name []byte) []byte {
	return appendTarget(dst, MsgDescribe, kind, name)
}

// AppendClose appends a Close of the statement or portal name (kind
// TargetStatement or TargetPortal) to dst. It panics on another kind.
func AppendClose(dst []byte, kind byte, name []byte) []byte {
	return appendTarget(dst, MsgClose, kind, name)
}

func appendTarget(dst []byte, typ, kind byte, name []byte) []byte {
	if kind != TargetStatement && kind != TargetPortal {
		panic(fmt.Sprintf("BUG: target kind %q for message %q", kind, typ))
	}
	start := len(dst)
	dst = append(dst, typ, 0, 0, 0, 0, kind)
	dst = append(dst, name...)
	dst = append(dst, 0)
	putUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// AppendSync appends Sync to dst.
func AppendSync(dst []byte) []byte {
	return append(dst, MsgSync, 0, 0, 0, 4)
}

// AppendFlush appends Flush to dst.
func AppendFlush(dst []byte) []byte {
	return append(dst, MsgFlush, 0, 0, 0, 4)
}

// cstring returns the NUL-terminated string at b[off:] without its NUL and
// the offset after the NUL, or false if b has no NUL from off on. The
// string's capacity ends at its end, so a caller appending to it cannot
// overwrite the rest of b.
func cstring(b []byte, off int) ([]byte, int, bool) {
	i := bytes.IndexByte(b[off:], 0)
	if i < 0 {
		return nil, 0, false
	}
	return b[off : off+i : off+i], off + i + 1, true
}

func malformed(what, why string) error {
	return fmt.Errorf("%w: %s: %s", ErrMalformedMessage, what, why)
}

func getUint16(b []byte) uint16 {
	return uint16(b[0])<<8 | uint16(b[1])
}
