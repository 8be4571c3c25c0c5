// Package wire holds the Postgres frontend/backend protocol pieces the
// pooler needs on its hot path: message type names, startup packet parsing
// (the options parameter's switches included), a streaming message scanner
// that frames without decoding, encoders for the messages pgtender writes
// itself, and decoders for the few it must inspect (the extended query
// protocol messages that name prepared statements, the rows of its own
// queries, error fields).
//
// Everything here works on byte slices owned by the caller; nothing keeps a
// reference to a slice after returning unless its doc comment says so.
// Decoders return slices that alias their input, so they allocate nothing;
// their doc comments say so.
package wire

// Frontend (client to server) message types.
const (
	MsgBind         byte = 'B'
	MsgClose        byte = 'C'
	MsgCopyData     byte = 'd'
	MsgCopyDone     byte = 'c'
	MsgCopyFail     byte = 'f'
	MsgDescribe     byte = 'D'
	MsgExecute      byte = 'E'
	MsgFlush        byte = 'H'
	MsgFunctionCall byte = 'F'
	MsgParse        byte = 'P'
	MsgPassword     byte = 'p' // PasswordMessage, SASLInitialResponse, SASLResponse
	MsgQuery        byte = 'Q'
	MsgSync         byte = 'S'
	MsgTerminate    byte = 'X'
)

// Backend (server to client) message types.
const (
	MsgAuthentication       byte = 'R'
	MsgBackendKeyData       byte = 'K'
	MsgBindComplete         byte = '2'
	MsgCloseComplete        byte = '3'
	MsgCommandComplete      byte = 'C'
	MsgCopyInResponse       byte = 'G'
	MsgCopyOutResponse      byte = 'H'
	MsgCopyBothResponse     byte = 'W'
	MsgDataRow              byte = 'D'
	MsgEmptyQueryResponse   byte = 'I'
	MsgErrorResponse        byte = 'E'
	MsgFunctionCallResponse byte = 'V'
	MsgNegotiateProtocol    byte = 'v'
	MsgNoData               byte = 'n'
	MsgNoticeResponse       byte = 'N'
	MsgNotification         byte = 'A'
	MsgParameterDescription byte = 't'
	MsgParameterStatus      byte = 'S'
	MsgParseComplete        byte = '1'
	MsgPortalSuspended      byte = 's'
	MsgReadyForQuery        byte = 'Z'
	MsgRowDescription       byte = 'T'
)

// CopyData ('d') and CopyDone ('c') are the same in both directions
// (MsgCopyData, MsgCopyDone above).

// Transaction status of a ReadyForQuery message.
const (
	TxIdle    byte = 'I' // not in a transaction block
	TxInBlock byte = 'T' // in a transaction block
	TxFailed  byte = 'E' // in a failed transaction block
)

// HeaderLen is the length of a regular message header: one type byte and a
// four-byte big-endian length that counts itself but not the type byte.
const HeaderLen = 5

// MaxMessageLen bounds the length field pgtender accepts on any message,
// the same 1 GiB bound Postgres puts on a message; larger ones are a
// protocol violation. Bodies are streamed, so this is not an allocation.
const MaxMessageLen = 1 << 30

func putUint32(b []byte, v uint32) {
	b[0] = byte(v >> 24)
	b[1] = byte(v >> 16)
	b[2] = byte(v >> 8)
	b[3] = byte(v)
}

func getUint32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}
